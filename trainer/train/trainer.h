// The single-process training loop and evaluation: what `meshwork-train train` and
// `meshwork-train eval` run. Errors come back as Status; libtorch exceptions stop here.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "common/status.h"
#include "trainer/config/config.h"
#include "trainer/dist/communicator.h"

namespace meshwork::train {

struct TrainSummary {
  int64_t resumed_from = 0;         // the checkpoint's step this run continued from (0: none)
  // checkpoint.save_on_terminate: the step whose checkpoint a SIGTERM made this run save before
  // it stopped there (0: it ran to its end).
  int64_t stopped_at = 0;
  int64_t steps = 0;                // steps this run trained (after resumed_from)
  int64_t tokens = 0;
  std::vector<double> losses;       // training loss of every step this run trained
  double initial_eval_loss = -1;    // before the first step; -1 when no eval data or resumed
  double final_eval_loss = -1;      // after the last step
  double seconds = 0;               // wall time of the training loop
  double tokens_per_second = 0;     // tokens / seconds, excluding the first (warm-up) step
  double mean_mfu = 0;
  int64_t peak_memory_bytes = 0;
  // The most bytes tensors held within one step, over the steps from steady_from_step (0-based:
  // the engine's SteadyFromStep()) on; 0 when the run ended before it, or on the CPU untracked.
  int64_t steady_peak_tensor_bytes = 0;
  int64_t steady_from_step = 0;
  std::string memory_device;        // "cpu" (RSS) or "cuda" (caching allocator)
  int64_t cuda_reserved_peak_bytes = 0;  // CUDA: the caching allocator's peak reserved bytes
  int64_t cuda_alloc_retries = 0;        // CUDA: allocations that succeeded only after a cache flush
  int64_t param_bytes = 0;          // this rank's parameters (FSDP: its shards)
  double exposed_comm_seconds = 0;  // blocked on collectives, whole run
  dist::CommStats comm;             // this rank's collectives, whole run
  // Pipelines: per pipeline rank, busy and program seconds summed over the steady steps (from
  // steady_from_step); empty without a pipeline.
  std::vector<double> pipeline_busy_seconds;
  std::vector<double> pipeline_seconds;
};

// Trains as `cfg` says, printing progress to `log`.
Result<TrainSummary> Train(const config::TrainConfig& cfg, std::ostream& log);

struct EvalResult {
  double loss = 0;       // mean token cross-entropy
  int64_t windows = 0;
  int64_t tokens = 0;    // predicted tokens (windows · seq_len)
};

// Mean cross-entropy of the model in cfg.model.init_from over the first eval.windows windows
// of eval.data (or data.val).
Result<EvalResult> Evaluate(const config::TrainConfig& cfg, std::ostream& log);

// Six significant digits, trailing zeros kept ("%#.6g"), as eval results are printed.
std::string SixDigits(double v);

}  // namespace meshwork::train
