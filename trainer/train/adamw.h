// AdamW (decoupled weight decay, Loshchilov & Hutter), updating all of a group's parameters at
// once instead of one parameter at a time: libtorch's fused kernel (at::_fused_adamw_: one
// launch per group, the gradient scale folded in) for CUDA tensors on libtorch 2.x, else
// libtorch's multi-tensor (_foreach) ops. On the CPU the result is bit-for-bit
// torch::optim::AdamW's (the same operations in the same order); the fused kernel agrees to
// rounding.
//
// The state is per parameter (step count, first and second moment), as torch::optim::AdamW
// keeps it, so a training checkpoint saves and restores it parameter by parameter.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace meshwork::train {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

struct AdamWGroup {
  std::vector<torch::Tensor> params;
  double weight_decay = 0;
};

struct AdamWParamState {
  int64_t step = 0;  // updates applied to this parameter
  torch::Tensor exp_avg, exp_avg_sq;
};

class AdamW {
 public:
  AdamW(std::vector<AdamWGroup> groups, AdamWOptions options);

  void set_lr(double lr) { options_.lr = lr; }
  double lr() const { return options_.lr; }
  // "fused" (one kernel per group) or "foreach" (libtorch's multi-tensor ops): what Step runs
  // for parameters on `device`.
  static std::string KernelFor(const torch::Device& device);

  // Updates every parameter that has a gradient. `grad_scale` (a one-element tensor on the
  // parameters' device, or undefined for 1) multiplies the gradients first, in place: gradient
  // clipping's factor, applied by the fused kernel itself rather than in a pass of its own.
  void Step(const torch::Tensor& grad_scale = {});

  // The state of `param` (one of the optimizer's tensors): null before its first update.
  const AdamWParamState* State(const torch::Tensor& param) const;
  // Replaces the state of `param` (nullopt: none, as before its first update). The moments are
  // copied into tensors made here, on the parameter's device.
  void SetState(const torch::Tensor& param, const std::optional<AdamWParamState>& state);
  bool HasState() const;
  const std::vector<AdamWGroup>& groups() const { return groups_; }
  const AdamWOptions& options() const { return options_; }

 private:
  struct Slot {
    torch::Tensor param;
    double weight_decay = 0;
    std::optional<AdamWParamState> state;
    torch::Tensor device_step;  // the fused kernel's step count: fp32, on the parameter's device
  };
  Slot& SlotOf(const torch::Tensor& param);
  void StepForeach(const std::vector<Slot*>& slots, double weight_decay, const torch::Tensor& grad_scale);
  void StepFused(const std::vector<Slot*>& slots, double weight_decay, const torch::Tensor& grad_scale);

  std::vector<AdamWGroup> groups_;
  AdamWOptions options_;
  std::vector<Slot> slots_;
  std::unordered_map<const void*, size_t> index_;  // TensorImpl -> slot
};

}  // namespace meshwork::train
