#include "trainer/pp/llama_stages.h"

#include <torch/torch.h>

#include <set>
#include <string>
#include <utility>

#include "trainer/compiler/pipeline/partition.h"

namespace meshwork::pp {
namespace {

std::string CutText(const std::vector<int>& first_layer) {
  std::string text;
  for (int f : first_layer) text += (text.empty() ? "" : ",") + std::to_string(f);
  return "[" + text + "]";
}

void AddModule(const torch::nn::Module& module, std::vector<torch::Tensor>& out, std::set<const void*>& seen) {
  for (const auto& p : module.parameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  }
}

}  // namespace

Result<std::vector<int>> EvenCut(int layers, int stages) {
  if (stages < 1 || layers < stages) {
    return InvalidConfig("pipeline: " + std::to_string(layers) + " decoder layers cannot make " + std::to_string(stages) +
                         " stages of at least one layer each");
  }
  std::vector<int> first{0};
  for (int s = 0; s < stages; ++s) first.push_back(first.back() + layers / stages + (s < layers % stages ? 1 : 0));
  return first;
}

Result<std::vector<int>> FlopBalancedCut(const model::LlamaConfig& c, int64_t seq_len, int stages,
                                         bool head_recomputes) {
  const int layers = static_cast<int>(c.num_hidden_layers);
  if (stages < 1 || layers < stages) return EvenCut(layers, stages);
  const double h = static_cast<double>(c.hidden_size);
  const double kv = static_cast<double>(c.num_key_value_heads * c.head_dim());
  const double weights = 2 * h * h + 2 * h * kv + 3 * h * static_cast<double>(c.intermediate_size);
  std::vector<compiler::pipeline::LayerCost> costs(static_cast<size_t>(layers));
  for (auto& cost : costs) cost.seconds = 6 * weights + 12 * h * static_cast<double>(seq_len);
  costs.back().seconds += (head_recomputes ? 8 : 6) * h * static_cast<double>(c.vocab_size);
  MW_ASSIGN_OR_RETURN(compiler::pipeline::StagePartition cut, compiler::pipeline::PartitionLayers(costs, stages));
  return cut.first_layer;
}

Result<LlamaStages> LlamaStages::Create(model::LlamaForCausalLM model, const compiler::pipeline::Shape& shape,
                                        std::vector<int> first_layer, int rank) {
  const int layers = static_cast<int>(model->model->layers->size());
  bool ok = static_cast<int>(first_layer.size()) == shape.stages() + 1 && first_layer.front() == 0 &&
            first_layer.back() == layers;
  for (size_t s = 0; ok && s + 1 < first_layer.size(); ++s) ok = first_layer[s] < first_layer[s + 1];
  if (!ok) {
    return InvalidConfig("pipeline: the stage cut " + CutText(first_layer) + " does not split " + std::to_string(layers) +
                         " decoder layers into " + std::to_string(shape.stages()) + " non-empty runs");
  }
  if (rank < 0 || rank >= shape.pp) {
    return InvalidConfig("pipeline: rank " + std::to_string(rank) + " is not one of pp=" + std::to_string(shape.pp));
  }
  return LlamaStages(std::move(model), shape, std::move(first_layer), rank);
}

LlamaStages::LlamaStages(model::LlamaForCausalLM model, compiler::pipeline::Shape shape, std::vector<int> first_layer,
                         int rank)
    : model_(std::move(model)), shape_(shape), first_layer_(std::move(first_layer)), rank_(rank) {}

torch::Tensor LlamaStages::Forward(int stage, const MicroBatch& mb, const torch::Tensor& input) {
  const bool last = stage == shape_.stages() - 1;
  if (runners_.before_stage) runners_.before_stage(stage);
  if (runners_.begin_forward) runners_.begin_forward(mb.tokens);
  return model_->ForwardStage(mb.tokens, input, first_layer_[static_cast<size_t>(stage)],
                              first_layer_[static_cast<size_t>(stage) + 1], last ? mb.targets : torch::Tensor(),
                              runners_.embed, runners_.loss, runners_.layer);
}

torch::Tensor LlamaStages::FirstStageInput(const MicroBatch& mb) {
  if (runners_.before_stage) runners_.before_stage(0);
  if (runners_.begin_forward) runners_.begin_forward(mb.tokens);
  return model_->EmbedForStage(mb.tokens, runners_.embed);
}

std::vector<torch::Tensor> LlamaStages::Parameters(int stage) {
  std::vector<torch::Tensor> out;
  std::set<const void*> seen;
  if (stage == 0) AddModule(*model_->model->embed_tokens, out, seen);
  for (int i = first_layer_[static_cast<size_t>(stage)]; i < first_layer_[static_cast<size_t>(stage) + 1]; ++i) {
    AddModule(*model_->model->layers[static_cast<size_t>(i)], out, seen);
  }
  if (stage == shape_.stages() - 1) {
    AddModule(*model_->model->norm, out, seen);
    if (model_->lm_head) {
      AddModule(*model_->lm_head, out, seen);
    } else {
      AddModule(*model_->model->embed_tokens, out, seen);  // the tied head
    }
  }
  return out;
}

std::vector<torch::Tensor> LlamaStages::HeldParameters() {
  std::vector<torch::Tensor> out;
  std::set<const void*> seen;
  for (int s = 0; s < shape_.stages(); ++s) {
    if (!Holds(s)) continue;
    for (auto& p : Parameters(s)) {
      if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
    }
  }
  return out;
}

void LlamaStages::ReleaseUnheld() {
  std::set<const void*> held;
  for (const auto& p : HeldParameters()) held.insert(p.unsafeGetTensorImpl());
  torch::NoGradGuard no_grad;
  for (auto& p : model_->parameters()) {
    if (!held.count(p.unsafeGetTensorImpl())) p.set_data(torch::empty({0}, p.options()));
  }
}

Status LlamaStages::SyncTiedGradients(dist::Communicator& comm) {
  const int first = shape_.RankOf(0), last = shape_.RankOf(shape_.stages() - 1);
  if (model_->lm_head || first == last || (rank_ != first && rank_ != last)) return Status::Ok();
  torch::Tensor& table = model_->model->embed_tokens->weight;
  if (!table.grad().defined()) table.mutable_grad() = torch::zeros_like(table);
  torch::Tensor mine = table.grad().contiguous().clone();
  torch::Tensor theirs = torch::empty_like(mine);
  const int peer = rank_ == first ? last : first;
  // Both post their send (which does not wait for the receive) before waiting on anything.
  MW_ASSIGN_OR_RETURN(auto send, comm.Send(mine, peer));
  MW_ASSIGN_OR_RETURN(auto recv, comm.Recv(theirs, peer));
  MW_RETURN_IF_ERROR(recv->Wait());
  MW_RETURN_IF_ERROR(send->Wait());
  // a + b is b + a in floating point: both ranks get the same bits.
  table.mutable_grad().add_(theirs);
  return Status::Ok();
}

}  // namespace meshwork::pp
