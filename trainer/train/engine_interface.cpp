#include "trainer/train/engine_interface.h"

#include "trainer/tp/tensor_parallel.h"

namespace meshwork::train {

void AddGroupStats(const std::vector<dist::Communicator*>& groups, EngineStats* s) {
  for (dist::Communicator* group : groups) {
    if (group == nullptr) continue;
    s->exposed_comm_seconds += group->TakeDeviceStallSeconds();
    const dist::CommStats c = group->stats();
    for (int i = 0; i < dist::kNumCollectives; ++i) {
      s->comm.calls[i] += c.calls[i];
      s->comm.bytes_sent[i] += c.bytes_sent[i];
    }
  }
}

int64_t CheckpointEvery(const config::TrainConfig& cfg) {
  if (cfg.training.activation_checkpointing == config::ActivationCheckpointing::kAll) return 1;
  if (cfg.training.activation_checkpointing == config::ActivationCheckpointing::kSelective) {
    return cfg.training.checkpoint_every;
  }
  return 0;
}

ShardPiece TensorParallelPiece(const tp::LocalParam& p, int tp, int64_t local_begin, const torch::Tensor& value) {
  ShardPiece piece{p.name, p.full_shape, local_begin, value};
  const int64_t width = p.full_shape.size() >= 2 ? p.full_shape.back() : 1;
  if (p.split == tp::Split::kRows) piece.begin = p.begin * width + local_begin;
  if (p.split == tp::Split::kColumns) {
    piece.col_begin = p.begin;
    piece.cols = width / tp;
  }
  return piece;
}

}  // namespace meshwork::train
