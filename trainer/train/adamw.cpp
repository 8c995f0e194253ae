#include "trainer/train/adamw.h"

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <stdexcept>
#include <utility>

#include "trainer/model/compat.h"
#include "trainer/model/fused_ops.h"
#include "trainer/model/weight_copies.h"

namespace meshwork::train {
namespace {

std::vector<torch::Tensor> Grads(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  out.reserve(params.size());
  for (const auto& p : params) out.push_back(p.grad());
  return out;
}

}  // namespace

AdamW::AdamW(std::vector<AdamWGroup> groups, AdamWOptions options)
    : groups_(std::move(groups)), options_(options) {
  for (const AdamWGroup& g : groups_) {
    for (const torch::Tensor& p : g.params) {
      TORCH_CHECK(index_.count(p.unsafeGetTensorImpl()) == 0, "AdamW: a parameter is in two groups");
      index_[p.unsafeGetTensorImpl()] = slots_.size();
      slots_.push_back(Slot{p, g.weight_decay, std::nullopt, torch::Tensor()});
    }
  }
}

AdamWKernel AdamW::DefaultKernel(const torch::Device& device) {
  if (!device.is_cuda()) return AdamWKernel::kForeach;
  if (model::FusedKernelsBuilt()) return AdamWKernel::kMeshwork;
  return compat::kTorch2 ? AdamWKernel::kFused : AdamWKernel::kForeach;
}

AdamWKernel AdamW::Runnable(const torch::Device& device, bool meshwork_takes_it) const {
  const AdamWKernel want = options_.kernel.value_or(DefaultKernel(device));
  if (want == AdamWKernel::kMeshwork && meshwork_takes_it) return AdamWKernel::kMeshwork;
  if (want != AdamWKernel::kForeach && device.is_cuda() && compat::kTorch2) return AdamWKernel::kFused;
  return AdamWKernel::kForeach;
}

AdamWKernel AdamW::KernelOn(const torch::Device& device) const {
  return Runnable(device, device.is_cpu() || model::FusedKernelsBuilt());
}

AdamWKernel AdamW::KernelOf(const Slot& s) const {
  return Runnable(s.param.device(),
                  model::FusedAdamWSupports(s.param, s.param.grad(), s.state->exp_avg, s.state->exp_avg_sq));
}

AdamW::Slot& AdamW::SlotOf(const torch::Tensor& param) {
  auto it = index_.find(param.unsafeGetTensorImpl());
  TORCH_CHECK(it != index_.end(), "AdamW: not one of the optimizer's parameters");
  return slots_[it->second];
}

const AdamWParamState* AdamW::State(const torch::Tensor& param) const {
  auto it = index_.find(param.unsafeGetTensorImpl());
  if (it == index_.end() || !slots_[it->second].state) return nullptr;
  return &*slots_[it->second].state;
}

void AdamW::SetState(const torch::Tensor& param, const std::optional<AdamWParamState>& state) {
  Slot& slot = SlotOf(param);
  slot.device_step = torch::Tensor();
  if (!state) {
    slot.state.reset();
    return;
  }
  torch::NoGradGuard no_grad;
  AdamWParamState mine;
  mine.step = state->step;
  mine.exp_avg = model::ZerosInLineWith(param).copy_(state->exp_avg);
  mine.exp_avg_sq = model::ZerosInLineWith(param).copy_(state->exp_avg_sq);
  slot.state = std::move(mine);
}

bool AdamW::HasState() const {
  for (const Slot& s : slots_)
    if (s.state) return true;
  return false;
}

void AdamW::Step(const torch::Tensor& grad_scale) {
  torch::NoGradGuard no_grad;
  // Parameters with a gradient, by (weight decay, kernel): one update call each.
  std::map<std::pair<double, AdamWKernel>, std::vector<Slot*>> batches;
  for (Slot& s : slots_) {
    if (!s.param.grad().defined()) continue;
    if (!s.state) {
      // At the parameter's offset within a 16-byte line: Meshwork's kernel takes 16-byte packs of
      // an FSDP shard (a view at any element of its flat group) and its moments together.
      s.state = AdamWParamState{0, model::ZerosInLineWith(s.param), model::ZerosInLineWith(s.param)};
    }
    batches[{s.weight_decay, KernelOf(s)}].push_back(&s);
  }
  for (auto& [key, slots] : batches) {
    switch (key.second) {
      case AdamWKernel::kMeshwork: StepMeshwork(slots, key.first, grad_scale); break;
      case AdamWKernel::kFused: StepFused(slots, key.first, grad_scale); break;
      case AdamWKernel::kForeach: StepForeach(slots, key.first, grad_scale); break;
    }
  }
}

void AdamW::StepForeach(const std::vector<Slot*>& all, double weight_decay, const torch::Tensor& grad_scale) {
  const double scale = grad_scale.defined() ? grad_scale.item<double>() : 1.0;
  // Bias corrections depend on the step count: parameters that missed updates (no gradient in
  // some step) form their own batch.
  std::map<int64_t, std::vector<Slot*>> by_step;
  for (Slot* s : all) by_step[s->state->step + 1].push_back(s);
  const double b1 = options_.beta1, b2 = options_.beta2, lr = options_.lr;
  for (auto& [step, slots] : by_step) {
    std::vector<torch::Tensor> params, exp_avgs, exp_avg_sqs;
    for (Slot* s : slots) {
      s->state->step = step;
      params.push_back(s->param);
      exp_avgs.push_back(s->state->exp_avg);
      exp_avg_sqs.push_back(s->state->exp_avg_sq);
    }
    const std::vector<torch::Tensor> grads = Grads(params);
    // Multiplying by exactly 1 changes nothing, so an unclipped step skips the pass.
    if (scale != 1.0) at::_foreach_mul_(grads, scale);
    const double bias_correction1 = 1 - std::pow(b1, static_cast<double>(step));
    const double bias_correction2 = 1 - std::pow(b2, static_cast<double>(step));
    // torch::optim::AdamW's operations, in its order, over the whole batch.
    if (weight_decay != 0) at::_foreach_mul_(params, 1 - lr * weight_decay);
    at::_foreach_mul_(exp_avgs, b1);
    at::_foreach_add_(exp_avgs, grads, 1 - b1);
    at::_foreach_mul_(exp_avg_sqs, b2);
    at::_foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - b2);
    std::vector<torch::Tensor> denom = at::_foreach_sqrt(exp_avg_sqs);
    at::_foreach_div_(denom, std::sqrt(bias_correction2));
    at::_foreach_add_(denom, options_.eps);
    at::_foreach_addcdiv_(params, exp_avgs, denom, -lr / bias_correction1);
  }
}

void AdamW::StepMeshwork(const std::vector<Slot*>& slots, double weight_decay, const torch::Tensor& grad_scale) {
  // The clip factor as the kernel reads it, converted once (a no-op for the trainer's double).
  const torch::Tensor scale = grad_scale.defined() ? grad_scale.to(torch::kDouble).reshape({}) : torch::Tensor();
  for (Slot* s : slots) {
    // The count advances only once the update is queued: a refused update (FusedAdamWUpdate's
    // checks) leaves the state as it was.
    const int64_t step = s->state->step + 1;
    const torch::Tensor copy = weight_copies_ ? weight_copies_->CopyOf(s->param) : torch::Tensor();
    const bool wrote_copy = model::FusedAdamWUpdate(
        s->param, s->param.grad(), s->state->exp_avg, s->state->exp_avg_sq,
        model::fused::MakeAdamWStep(options_.lr, options_.beta1, options_.beta2, options_.eps, weight_decay, step),
        scale, copy);
    s->state->step = step;
    s->device_step = torch::Tensor();  // the fused kernel's copy of the count is stale now
    // The kernel writes through the data pointers: the version counters advance as libtorch's
    // in-place ops would have advanced them.
    for (const torch::Tensor* t : {&s->param, &s->state->exp_avg, &s->state->exp_avg_sq}) {
      t->unsafeGetTensorImpl()->bump_version();
    }
    // After the parameter's bump: the copy is current with the version the parameter has now.
    // A copy not written goes stale with that bump, and forward writes it again.
    if (wrote_copy) weight_copies_->MarkWritten(s->param);
  }
}

void AdamW::StepFused(const std::vector<Slot*>& slots, double weight_decay, const torch::Tensor& grad_scale) {
#if TORCH_VERSION_MAJOR >= 2
  std::vector<torch::Tensor> params, exp_avgs, exp_avg_sqs, steps;
  for (Slot* s : slots) {
    if (!s->device_step.defined()) {
      s->device_step = torch::full({}, static_cast<double>(s->state->step),
                                   torch::TensorOptions().dtype(torch::kFloat).device(s->param.device()));
    }
    ++s->state->step;
    params.push_back(s->param);
    exp_avgs.push_back(s->state->exp_avg);
    exp_avg_sqs.push_back(s->state->exp_avg_sq);
    steps.push_back(s->device_step);
  }
  // The kernel reads the step count, it does not advance it (PyTorch's fused AdamW adds one first):
  // a count left at 0 makes the bias correction 1 - beta1^0 = 0 and the first update NaN.
  at::_foreach_add_(steps, 1);
  // The kernel divides the gradients by grad_scale (it is AMP's unscale): pass the reciprocal.
  std::optional<at::Tensor> inverse_scale;
  if (grad_scale.defined()) inverse_scale = grad_scale.reciprocal().to(torch::kFloat).reshape({});
  at::_fused_adamw_(params, Grads(params), exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, options_.lr,
                    options_.beta1, options_.beta2, weight_decay, options_.eps, /*amsgrad=*/false,
                    /*maximize=*/false, inverse_scale, /*found_inf=*/std::nullopt);
#else
  (void)slots;
  (void)weight_decay;
  (void)grad_scale;
  TORCH_CHECK(false, "AdamW: the fused kernel needs libtorch 2.x");
#endif
}

}  // namespace meshwork::train
