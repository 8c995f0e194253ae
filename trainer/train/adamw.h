// AdamW (decoupled weight decay, Loshchilov & Hutter), updating all of a group's parameters
// without libtorch's one-parameter-at-a-time torch::optim::AdamW. Three kernels:
// - meshwork: Meshwork's own (model::FusedAdamWUpdate, fused_adamw.h), one pass per parameter
//   that reads the gradient and writes the parameter and its two moments (28 bytes an element);
//   the CUDA default where this build has the kernels; on the CPU a host loop (for tests);
// - fused: libtorch's fused kernel (at::_fused_adamw_, libtorch 2.x on CUDA), one launch per
//   group with the gradient scale folded in, which also writes every gradient back (32 bytes);
// - foreach: libtorch's multi-tensor (_foreach) ops; the CPU default, bit-for-bit
//   torch::optim::AdamW's (the same operations in the same order).
// The kernels agree to fp32 rounding.
//
// The state is per parameter (step count, first and second moment), as torch::optim::AdamW
// keeps it, so a training checkpoint saves and restores it parameter by parameter, whichever
// kernel wrote it.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/enum_names.h"

namespace meshwork::model {
class WeightCopies;
}

namespace meshwork::train {

enum class AdamWKernel { kForeach, kFused, kMeshwork };
inline constexpr EnumName<AdamWKernel> kAdamWKernelNames[] = {
    {AdamWKernel::kForeach, "foreach"}, {AdamWKernel::kFused, "fused"}, {AdamWKernel::kMeshwork, "meshwork"}};
inline const char* AdamWKernelName(AdamWKernel kernel) { return NameOf(kAdamWKernelNames, kernel); }

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  // The kernel to run; nullopt: DefaultKernel for each parameter's device. A parameter the
  // chosen kernel cannot take (fused: not CUDA or libtorch 1.x; meshwork: not fp32 and
  // contiguous with its gradient, or CUDA without this build's kernels) takes the best one that
  // can: fused on CUDA with libtorch 2.x, else foreach.
  std::optional<AdamWKernel> kernel;
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
  // The default kernel for parameters on `device`: meshwork on CUDA where this build has the
  // kernels, else fused on CUDA with libtorch 2.x, else foreach.
  static AdamWKernel DefaultKernel(const torch::Device& device);
  // What Step runs for fp32 contiguous parameters on `device` under these options, and its name.
  AdamWKernel KernelOn(const torch::Device& device) const;
  std::string KernelFor(const torch::Device& device) const { return AdamWKernelName(KernelOn(device)); }

  // Updates every parameter that has a gradient. `grad_scale` (a one-element tensor on the
  // parameters' device, or undefined for 1) multiplies the gradients first: gradient clipping's
  // factor, applied by the kernel itself rather than in a pass of its own. foreach and fused
  // leave the gradients scaled (in place), meshwork leaves them as they were.
  void Step(const torch::Tensor& grad_scale = {});

  // The state of `param` (one of the optimizer's tensors): null before its first update.
  const AdamWParamState* State(const torch::Tensor& param) const;
  // Replaces the state of `param` (nullopt: none, as before its first update). The moments are
  // copied into tensors made here, on the parameter's device.
  void SetState(const torch::Tensor& param, const std::optional<AdamWParamState>& state);
  bool HasState() const;
  // The model's persistent weight copies (weight_copies.h), or null: the meshwork kernel writes a
  // parameter's copy in its update, so that forward need not cast the weight again. The other
  // kernels leave the copies stale (forward rewrites them).
  void SetWeightCopies(std::shared_ptr<model::WeightCopies> copies) { weight_copies_ = std::move(copies); }
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
  // The kernel that runs for a parameter on `device`: the chosen one, else (not runnable there;
  // for meshwork: unless meshwork_takes_it) fused on CUDA with libtorch 2.x, else foreach.
  AdamWKernel Runnable(const torch::Device& device, bool meshwork_takes_it) const;
  AdamWKernel KernelOf(const Slot& slot) const;
  void StepForeach(const std::vector<Slot*>& slots, double weight_decay, const torch::Tensor& grad_scale);
  void StepFused(const std::vector<Slot*>& slots, double weight_decay, const torch::Tensor& grad_scale);
  void StepMeshwork(const std::vector<Slot*>& slots, double weight_decay, const torch::Tensor& grad_scale);

  std::vector<AdamWGroup> groups_;
  AdamWOptions options_;
  std::vector<Slot> slots_;
  std::unordered_map<const void*, size_t> index_;  // TensorImpl -> slot
  std::shared_ptr<model::WeightCopies> weight_copies_;
};

}  // namespace meshwork::train
