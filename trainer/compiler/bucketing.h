// The compiler's one user-facing choice, in a header of its own so that the config (which must
// build without the compiler) can hold it as a type.
#pragma once

#include "common/enum_names.h"

namespace meshwork::compiler {

// fsdp.bucketing: which collectives the plan merges (docs/config.md).
enum class Bucketing { kNone, kBlock, kAuto };
inline constexpr EnumName<Bucketing> kBucketingNames[] = {
    {Bucketing::kNone, "none"}, {Bucketing::kBlock, "block"}, {Bucketing::kAuto, "auto"}};
inline const char* BucketingName(Bucketing b) { return NameOf(kBucketingNames, b); }

}  // namespace meshwork::compiler
