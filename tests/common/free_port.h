// A TCP port on 127.0.0.1 that was free a moment ago, for tests that start servers on a known
// port (common/loopback_port.h: above the ephemeral range; another explicit pick may still take
// it in between, which tests accept).
#pragma once

#include "common/loopback_port.h"

namespace meshwork::testing {

inline int FreePort() { return FreeLoopbackPort(); }

}  // namespace meshwork::testing
