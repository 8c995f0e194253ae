// Learning-rate schedule: linear warmup, then cosine / linear decay to lr·min_lr_ratio, or flat.
#pragma once

#include <cstdint>

#include "trainer/config/config.h"

namespace meshwork::train {

// Learning rate for 0-based `step` of `s.steps`.
double LearningRate(const config::ScheduleConfig& s, double base_lr, int64_t step);

}  // namespace meshwork::train
