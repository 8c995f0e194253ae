// The eager FSDP schedule (FSDP2's defaults): hooks on each layer's input and output tensors decide, as
// autograd reaches them, when a unit is gathered, reduced and freed. It also records the step's
// compute per module (StepTrace), which the compiler plans from.
#pragma once

#include <torch/types.h>

#include "trainer/fsdp/step_schedule.h"

namespace meshwork::fsdp {

class EagerSchedule : public StepSchedule {
 public:
  explicit EagerSchedule(ShardedState& state) : state_(state) {}

  torch::Tensor Forward(const torch::Tensor& tokens, const torch::Tensor& targets) override;
  void FinishBackward() override;

 private:
  // The hooks capture the state, not the schedule: they may outlive it (UsePlan after a forward).
  ShardedState& state_;
};

}  // namespace meshwork::fsdp
