// A tied output head split by vocabulary (internal to trainer/fsdp): compiler::SplitByVocabulary.
// With the embedding read by rows (embedding_rows.h), this is what keeps the table from ever
// being all-gathered or reduce-scattered whole: each rank computes the logits of the table rows
// its own shard holds, for every rank's tokens.
//
// Rank r owns the rows whose first element lies in its flat shard, [lo_r, hi_r): its shard holds
// all of them but the tail of the last one, which the following shards begin with. Inside the
// head's compute, on the reduce-scatter communicator (idle while the head runs: the first
// reduce-scatter follows the head's backward), blocking:
//   forward  - every rank's first `width` elements are all-gathered (the tails come from them);
//            - every rank's hidden states and targets are all-gathered;
//            - per token, chunk by chunk, the log-sum-exp of the logits of its rows and the target's
//              logit where it owns the target are all-gathered ([2, tokens] a rank) and combined
//              into the log-sum-exp over the whole vocabulary;
//            - the loss is this rank's tokens' mean, what LinearCrossEntropy gives on the whole table.
//   backward - every rank's loss scale (the gradient of its loss) is all-gathered;
//            - the softmax's gradient over its rows gives the hidden states' gradient for every
//              rank's tokens, a partial sum reduce-scattered (sum) to their ranks, and its rows'
//              gradient, added into its shard's gradient over dp_shard (as reduce-scatters
//              average); the last row's tail is all-gathered and added by the ranks holding it.
// Communication per step: the hidden states both ways (dp_shard x tokens x hidden) and a few
// small collectives, against the table both ways (vocab x hidden) when it is gathered whole.
#pragma once

#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "trainer/fsdp/unit.h"

namespace meshwork::fsdp {

class VocabParallelHead {
 public:
  // `table`: the tied [vocab, width] table, sharded in `group` (its flat layout).
  VocabParallelHead(ShardedParam* table, const FlatGroup& group, const UnitContext& context);

  // The mean cross-entropy of this rank's `hidden` [..., width] against `targets` (its leading
  // shape), differentiable in hidden; the table's gradient goes into its shard's .grad.
  torch::Tensor Loss(const torch::Tensor& hidden, const torch::Tensor& targets);

  // [lo, hi): the rows this rank owns (for tests and the plan summary).
  int64_t first_row() const { return range_[rank_].lo; }
  int64_t end_row() const { return range_[rank_].hi; }

  // Called by the autograd function (vocab_head.cpp).
  struct Saved;
  torch::Tensor Forward(const torch::Tensor& hidden, const torch::Tensor& targets, Saved* saved);
  torch::Tensor Backward(const torch::Tensor& grad_loss, Saved& saved);

 private:
  // A blocking collective on the reduce-scatter communicator: issued, waited for and counted as
  // exposed communication (and traced) as "<what> <table>".
  void Exchange(Result<std::unique_ptr<dist::Work>> work, const std::string& what, int64_t bytes);
  // This rank's rows [hi - lo, width] in fp32: its shard's part and the last row's tail.
  torch::Tensor OwnedRows();

  ShardedParam* table_;
  UnitContext context_;
  dist::Communicator* comm_;
  int rank_ = 0, world_ = 1;
  int64_t width_ = 0, rows_ = 0;
  // Per rank: its elements of the flattened table [begin, end) and the rows it owns [lo, hi).
  struct Range {
    int64_t begin, end, lo, hi;
  };
  std::vector<Range> range_;
};

}  // namespace meshwork::fsdp
