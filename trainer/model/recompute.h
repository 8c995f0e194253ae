// Activation checkpointing for one block: the forward runs without keeping its intermediate
// activations (only the block's input is saved), and the backward runs the block's forward again,
// with gradients, before going back through it. Memory per block drops from its activations to
// its input, for one more forward in backward.
//
// This is the reentrant form (PyTorch's torch.utils.checkpoint with use_reentrant=True): the
// backward of the recomputed block runs as a nested backward inside the outer one, so the
// block's parameters have their gradients accumulated (into .grad, as autograd's AccumulateGrad
// does) before the gradient of its input flows on. FSDP relies on that order: a layer's
// gradients are complete when backward reaches its input. The block must be deterministic
// (Llama has no dropout), and it sees CUDA autocast as it was at the forward.
#pragma once

#include <torch/types.h>

#include <functional>

#include "trainer/model/llama.h"

namespace meshwork::model {

using Block = std::function<torch::Tensor(const torch::Tensor&)>;

// `block(input)`, checkpointed. Without gradients (no grad mode, or an input that does not
// require grad: the parameters' gradients would then have no way back in) it simply runs
// `block(input)`. `block` must stay callable until the backward has run.
torch::Tensor Recompute(const Block& block, const torch::Tensor& input);

// One decoder layer, checkpointed: Recompute over `layer.forward(h, rope)` (the layer must outlive
// the backward; the rope tables are kept with it).
torch::Tensor CheckpointedLayer(DecoderLayerImpl& layer, const torch::Tensor& h, const RopeTables& rope);

}  // namespace meshwork::model
