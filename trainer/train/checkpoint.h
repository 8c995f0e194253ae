// Training checkpoints: every rank's parameters (FSDP: its shards) and AdamW state, saved every
// checkpoint.every steps and loaded at start, so a restarted job continues where it stopped.
//
//   DIR/step-00000100/rank-00000.pt   one per rank: its parameters and AdamW state (CPU tensors)
//   DIR/step-00000100/rank-00000.pt.sum   its size and checksum (checked before loading)
//   DIR/step-00000100/meta.json       rank 0: step, world size, mesh, model dims, fsdp mode, data
//   DIR/latest                        "step-00000100": the newest complete checkpoint
//
// Every file is written under a temporary name, fsynced and renamed. `latest` moves only after
// every rank reported its files written, so a crash in the middle of a save leaves it naming the
// previous complete checkpoint; older ones beyond checkpoint.keep are deleted after that.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "common/status.h"
#include "trainer/config/config.h"
#include "trainer/model/llama_config.h"

namespace meshwork::train {

class AdamW;
class Engine;

// What a checkpoint records about the run that wrote it. World size, mesh and model dims must
// match to resume (they fix every rank's shard layout); the rest is reported when it differs.
struct CheckpointMeta {
  int64_t step = 0;         // optimizer steps completed
  int64_t total_steps = 0;  // schedule.steps of the run that saved it
  int world_size = 1;
  int dp_replicate = 1;
  int dp_shard = 1;
  std::string fsdp_mode = "none";  // "none" (one process), "eager" or "compiled"
  // How FSDP shards: "flat" (each module's parameters as one flat vector: fsdp/unit.h), or
  // "rows" (each parameter's dim 0: checkpoints written before the flat layout, which have no
  // shard_layout key). With dp_shard 1 both are whole parameters.
  std::string shard_layout = "flat";
  model::LlamaConfig dims;
  // Whether meta.json recorded dims.rope_theta and dims.rms_norm_eps (checkpoints before
  // 2026-11-28 did not; theirs are then not compared on resume).
  bool numerics_recorded = true;
  std::string data_train;
  int64_t seed = 0;
  int64_t seq_len = 0;
  int64_t batch_size = 0;
  int64_t grad_accum = 0;
};

// This run's meta (step 0) from its config and engine.
CheckpointMeta RunMeta(const config::TrainConfig& cfg, const model::LlamaConfig& dims, const Engine& engine);

std::string StepDirName(int64_t step);  // "step-00000100"
std::string RankFileName(int rank);     // "rank-00000.pt"

std::string MetaToJson(const CheckpointMeta& meta);
// InvalidInput naming the file when it is not a checkpoint's meta.json.
Result<CheckpointMeta> ReadMeta(const std::string& step_dir);
// InvalidInput listing every difference that changes the shard layout (world size, mesh, model
// dims), naming `step_dir`.
Status CheckCompatible(const CheckpointMeta& saved, const CheckpointMeta& now, const std::string& step_dir);
// Differences that do not stop a resume but make it differ from an uninterrupted run.
std::vector<std::string> DescribeSoftDifferences(const CheckpointMeta& saved, const CheckpointMeta& now);

// The step directory DIR/latest names, or nullopt when DIR/latest does not exist.
Result<std::optional<std::string>> FindLatest(const std::string& dir);

// One rank's file (and its .sum): parameters by name and, per parameter, its AdamW state (step,
// moments), all written as CPU tensors whatever device they live on. Load reads the file onto
// the CPU, then copies into `params` in place (the optimizer keeps its tensors) and into AdamW
// state it makes on each parameter's own device; a missing, truncated or corrupt file, or one
// whose parameters differ in name or shape, is an error naming the file. Files of format 1
// (libtorch's optimizer archive) are still read.
Status SaveRankFile(const std::string& path, int64_t step,
                    const std::vector<std::pair<std::string, torch::Tensor>>& params,
                    const AdamW& optimizer);
Status LoadRankFile(const std::string& path, int64_t step,
                    const std::vector<std::pair<std::string, torch::Tensor>>& params,
                    AdamW& optimizer);

// Records `path`'s size and checksum in its .sum file, as SaveRankFile does for what it writes
// (for a rank file written or repaired by other means).
Status WriteChecksumFile(const std::string& path);

struct ResumePoint {
  int64_t step = 0;  // 0: nothing to resume, training starts from scratch
  std::string step_dir;
  std::vector<std::string> notes;  // soft differences (DescribeSoftDifferences)
};

// Saves and resumes one run's checkpoints. Save and Resume are collective: every rank calls
// them at the same step, and all ranks fail together when one does.
class Checkpointer {
 public:
  Checkpointer(config::CheckpointConfig cfg, Engine& engine, AdamW& optimizer, CheckpointMeta run);

  bool enabled() const { return !cfg_.dir.empty(); }
  // Whether to save after completing step `step` (1-based) of `total_steps`.
  bool Due(int64_t step, int64_t total_steps) const;

  // Uncommit, WriteFiles, wait until every rank wrote its files, then rank 0 Commits.
  Status Save(int64_t step);
  // Rank 0: when DIR/latest names step-N itself (a run that started afresh, checkpoint.resume:
  // never, reaching a step an earlier run saved), removes `latest` before step-N is rewritten in
  // place, so that a save cut short never leaves `latest` naming files that fail their checksums.
  Status Uncommit(int64_t step);
  // This rank's file (and rank 0's meta.json) under DIR/step-N; `latest` is not touched.
  Status WriteFiles(int64_t step);
  // Rank 0: point DIR/latest at step-N, then delete complete checkpoints beyond `keep` and
  // any incomplete one older than step N.
  Status Commit(int64_t step);

  // Creates DIR and checks every rank can write in it (IOError naming checkpoint.dir, agreed
  // across ranks), then loads DIR/latest when it exists and checkpoint.resume is auto.
  Result<ResumePoint> Resume();

 private:
  config::CheckpointConfig cfg_;
  Engine& engine_;
  AdamW& optimizer_;
  CheckpointMeta run_;
};

}  // namespace meshwork::train
