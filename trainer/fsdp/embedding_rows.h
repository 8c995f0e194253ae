// A parameter the compiled plan reads by rows (internal to trainer/fsdp): the token embedding,
// under compiler::ReadByRows. A micro-batch reads one row per token, a few thousand of the
// table's tens of thousands, so instead of all-gathering the table before the first layer and
// reduce-scattering its gradient after the last backward (both on the step's critical path):
//   - row_gather: the micro-batch's token ids are all-gathered; every rank fills in, for every
//     rank's tokens, the elements of those rows its master shard holds (zeros elsewhere); one
//     reduce-scatter (sum) hands each rank its own tokens' rows, exactly (one owner per element).
//     They become a leaf that is the embedding's output, so autograd leaves its gradient there.
//   - row_reduce: every rank's token ids and row gradients are all-gathered (on the all-gather
//     communicator, idle by the end of backward, as the compiler's lanes assume); each rank adds
//     the elements it owns into its shard's gradient, averaged over dp_shard as the
//     reduce-scatters average.
// A tied output head still gathers the table whole, and its reduce-scatter runs right after the
// head's backward; the rows' gradients are added to its result.
#pragma once

#include <torch/types.h>

#include <memory>
#include <vector>

#include "trainer/fsdp/unit.h"

namespace meshwork::fsdp {

class EmbeddingRows {
 public:
  // `param`: a [rows, width] parameter sharded in a flat group (ShardedParam's fields).
  EmbeddingRows(ShardedParam* param, const UnitContext& context);

  // row_gather: all-gathers this micro-batch's token ids (int64 [batch, seq]; async).
  void StartGather(const torch::Tensor& tokens);
  // Its wait: the rows of this rank's tokens, as a leaf [batch, seq, width] in param_dtype that
  // requires grad (rows()).
  void WaitGather();
  const torch::Tensor& rows() const { return rows_; }

  // row_reduce: this micro-batch's row gradients (the leaf's), held back without sync; with
  // sync, every held micro-batch's ids and gradients are all-gathered (async).
  void StartReduce(bool sync);
  // Its wait: every rank's row gradients added into this rank's shard gradient.
  void WaitReduce();

 private:
  // For tokens `ids` [n]: [n, width] fp32 holding the elements of their rows this rank's shard
  // has, zeros elsewhere.
  torch::Tensor OwnedParts(const torch::Tensor& ids) const;
  // Adds rows `grads` [n, width] of tokens `ids` [n], times `scale`, into the elements of
  // `shard_grad` (this rank's flat elements of the parameter) it owns.
  void AddOwnedParts(const torch::Tensor& ids, const torch::Tensor& grads, double scale, torch::Tensor& shard_grad) const;

  ShardedParam* param_;
  UnitContext context_;
  int64_t width_ = 0;
  // What this rank's shard holds: whole rows [whole_lo_, whole_hi_), starting at element
  // whole_at_ of its flat shard, and parts of at most two more rows.
  int64_t whole_lo_ = 0, whole_hi_ = 0, whole_at_ = 0;
  struct Part {
    int64_t row, col, len;  // columns [col, col + len) of this row
    int64_t at;             // where they are in the flat shard
  };
  std::vector<Part> parts_;

  torch::Tensor tokens_;    // this micro-batch's, flat
  torch::Tensor all_ids_;   // every rank's, rank-major
  std::vector<std::unique_ptr<dist::Work>> gather_works_;
  double gather_issued_ = 0;
  torch::Tensor rows_;      // the leaf
  std::vector<int64_t> rows_shape_;

  std::vector<torch::Tensor> held_ids_, held_grads_;  // micro-batches without sync
  torch::Tensor reduce_ids_, reduce_grads_;           // all-gathered: every rank's
  std::vector<std::unique_ptr<dist::Work>> reduce_works_;
  double reduce_issued_ = 0;
};

}  // namespace meshwork::fsdp
