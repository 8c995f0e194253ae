// The shared scratch helpers, under the names the trainer/io tests use.
#pragma once

#include "tests/common/temp_dir.h"

namespace meshwork::io::testing {

using ScopedTempDir = meshwork::testing::TempDir;
using meshwork::testing::ReadBytes;
using meshwork::testing::WriteBytes;

}  // namespace meshwork::io::testing
