#include "trainer/train/schedule.h"

#include <algorithm>
#include <cmath>

namespace meshwork::train {

double LearningRate(const config::ScheduleConfig& s, double base_lr, int64_t step) {
  if (step < s.warmup_steps) {
    // (step + 1) so the first step already moves the weights.
    return base_lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  }
  const double min_lr = base_lr * s.min_lr_ratio;
  const int64_t decay_steps = s.steps - s.warmup_steps;
  if (s.decay == config::LrDecay::kConstant || decay_steps <= 1) return base_lr;
  const double progress = std::clamp(
      static_cast<double>(step - s.warmup_steps) / static_cast<double>(decay_steps - 1), 0.0, 1.0);
  if (s.decay == config::LrDecay::kLinear) return base_lr + (min_lr - base_lr) * progress;
  return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace meshwork::train
