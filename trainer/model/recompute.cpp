#include "trainer/model/recompute.h"

#include <torch/torch.h>

#include <utility>

#include "trainer/model/compat.h"

namespace meshwork::model {
namespace {

// What the backward needs besides the saved input: the block, and the autocast it ran under.
struct Replay : torch::CustomClassHolder {
  Replay(Block block, compat::AutocastState autocast) : block(std::move(block)), autocast(autocast) {}
  Block block;
  compat::AutocastState autocast;
};

struct RecomputeFunction : torch::autograd::Function<RecomputeFunction> {
  // Runs under no grad (Function::apply's forward does): nothing of the block is kept.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor input,
                               c10::intrusive_ptr<Replay> replay) {
    ctx->save_for_backward({input});
    torch::Tensor out = replay->block(input);
    ctx->saved_data["replay"] = c10::IValue::make_capsule(std::move(replay));
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto replay = c10::static_intrusive_pointer_cast<Replay>(ctx->saved_data["replay"].toCapsule());
    torch::Tensor input = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    torch::Tensor out;
    {
      torch::AutoGradMode grad(true);
      compat::CudaAutocastGuard amp(replay->autocast.enabled, replay->autocast.dtype);
      out = replay->block(input);
    }
    // The nested backward accumulates the block's parameter gradients, then the input's.
    torch::autograd::backward({out}, {grad_out[0]});
    return {input.grad(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor Recompute(const Block& block, const torch::Tensor& input) {
  if (!torch::GradMode::is_enabled() || !input.requires_grad()) return block(input);
  return RecomputeFunction::apply(input, c10::make_intrusive<Replay>(block, compat::CurrentCudaAutocast()));
}

torch::Tensor CheckpointedLayer(DecoderLayerImpl& layer, const torch::Tensor& h, const RopeTables& rope) {
  return Recompute([&layer, rope](const torch::Tensor& in) { return layer.forward(in, rope); }, h);
}

}  // namespace meshwork::model
