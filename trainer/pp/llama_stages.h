// The Llama model cut into pipeline stages for the executor (executor.h): stage s runs decoder
// layers [first_layer[s], first_layer[s + 1]), the first stage also the embedding, the last also
// the final norm, the head and the loss (LlamaForCausalLMImpl::ForwardStage). A rank holds the
// stages the program places on it (s % pp == rank); the parameters of the others are released.
//
// Tied embeddings (the head reads the embedding table): the first and the last stage both hold
// the table, usually on two ranks; after a step's backward each adds the other's gradient of it
// (SyncTiedGradients), so the two copies take the same update and stay equal, as Megatron-LM does.
#pragma once

#include <torch/types.h>

#include <functional>
#include <utility>
#include <vector>

#include "common/status.h"
#include "trainer/compiler/pipeline/program.h"
#include "trainer/dist/communicator.h"
#include "trainer/model/llama.h"
#include "trainer/pp/executor.h"

namespace meshwork::pp {

class LlamaStages final : public StageRunner {
 public:
  // InvalidConfig where first_layer does not cut the model's layers into shape.stages() non-empty
  // runs (naming the cut), or `rank` is not a pipeline rank of the shape.
  static Result<LlamaStages> Create(model::LlamaForCausalLM model, const compiler::pipeline::Shape& shape,
                                    std::vector<int> first_layer, int rank);

  torch::Tensor Forward(int stage, const MicroBatch& mb, const torch::Tensor& input) override;
  torch::Tensor FirstStageInput(const MicroBatch& mb) override;

  // What other plans applied to the model run around a stage's forward: `before_stage` with the
  // stage first (FSDP waits there for what the stage needs gathered), `begin_forward` with the
  // micro-batch's tokens, then `embed` and `loss` in place of the model's embedding and head +
  // loss (tensor parallelism's), `layer` running each decoder layer (activation checkpointing)
  // (ForwardStage). Unset: the model's own.
  struct Runners {
    std::function<void(int stage)> before_stage;
    std::function<void(const torch::Tensor& tokens)> begin_forward;
    model::EmbedRunner embed;
    model::LossRunner loss;
    model::LayerRunner layer;
  };
  void set_runners(Runners runners) { runners_ = std::move(runners); }
  const Runners& runners() const { return runners_; }
  std::vector<torch::Tensor> Parameters(int stage) override;

  // Every parameter of this rank's stages, once each (the optimizer's).
  std::vector<torch::Tensor> HeldParameters();
  // Frees the storage of every parameter this rank's stages do not use (an empty tensor each).
  void ReleaseUnheld();
  // With tied embeddings on two ranks (first and last stage): each adds the other's gradient of
  // the table, over the pipeline group `comm`. Nothing to do otherwise.
  Status SyncTiedGradients(dist::Communicator& comm);

  const std::vector<int>& first_layer() const { return first_layer_; }

 private:
  LlamaStages(model::LlamaForCausalLM model, compiler::pipeline::Shape shape, std::vector<int> first_layer, int rank);
  bool Holds(int stage) const { return shape_.RankOf(stage) == rank_; }

  model::LlamaForCausalLM model_;
  compiler::pipeline::Shape shape_;
  std::vector<int> first_layer_;
  int rank_;
  Runners runners_;
};

// first_layer for `layers` decoder layers in `stages` runs as equal as counts allow (the earlier
// stages one longer where they do not divide); InvalidConfig when layers < stages.
Result<std::vector<int>> EvenCut(int layers, int stages);

// first_layer balanced by training FLOPs per token (compiler::pipeline::PartitionLayers: the
// slowest stage as fast as it can be): a decoder layer costs 6 x its weights plus attention's
// scores and values at `seq_len` (12 x hidden x seq_len, PaLM's count); the output head (6 x
// hidden x vocab, 8 x with `head_recomputes`: the logits computed again in backward) is charged
// to the last layer and the embedding's lookup to nothing. The head of a large vocabulary weighs
// several layers, so the last stage gets fewer. InvalidConfig when layers < stages.
Result<std::vector<int>> FlopBalancedCut(const model::LlamaConfig& config, int64_t seq_len, int stages,
                                         bool head_recomputes);

}  // namespace meshwork::pp
