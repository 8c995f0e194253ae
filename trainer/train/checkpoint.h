// Training checkpoints: every rank's parameters (FSDP: its shards) and AdamW state, saved every
// checkpoint.every steps and loaded at start, so a restarted job continues where it stopped, at
// the same mesh or any other (world size, dp_replicate x dp_shard x tp, pipeline stages, one
// process).
//
//   DIR/step-00000100/rank-00000.safetensors   one per rank: its pieces of the parameters and
//                                     their AdamW moments, each piece named "<param>@<begin>"
//                                     and described in the header's metadata (the whole shape,
//                                     the first element held, the AdamW step, a checksum)
//   DIR/step-00000100/rank-00000.safetensors.sum   its size and checksum
//   DIR/step-00000100/meta.json       rank 0: step, world size, mesh, model dims, fsdp mode, data
//   DIR/latest                        "step-00000100": the newest complete checkpoint
//
// Resuming, each rank reads every file's header, then only the pieces that overlap its own
// (ShardPiece: elements [begin, begin + n) of a flattened parameter, or of a column block of it:
// a tensor parallel rank's slice of o_proj or down_proj), checking each piece's checksum:
// PyTorch DCP's idea on flat offsets. So a checkpoint moves between any meshes, tp included. Checkpoints of format 2 (rank-NNNNN.pt, libtorch
// archives) still load at the mesh that wrote them.
//
// Every file is written under a temporary name, fsynced and renamed. `latest` moves only after
// every rank reported its files written, so a crash in the middle of a save leaves it naming the
// previous complete checkpoint; older ones beyond checkpoint.keep are deleted after that.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
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
struct AdamWParamState;
struct ShardPiece;

// What a checkpoint records about the run that wrote it. World size, mesh and model dims must
// match to resume (they fix every rank's shard layout); the rest is reported when it differs.
struct CheckpointMeta {
  // 3: resharding rank files (rank-NNNNN.safetensors); 2: rank-NNNNN.pt, loaded at its own mesh only.
  int64_t format_version = 3;
  std::vector<std::string> files;  // every rank's file, in rank order (meta.json's "files")
  int64_t step = 0;         // optimizer steps completed
  int64_t total_steps = 0;  // schedule.steps of the run that saved it
  int world_size = 1;
  int dp_replicate = 1;
  int dp_shard = 1;
  int tp = 1;  // tensor parallel ranks (meta.json's mesh.tp; 1 when absent)
  int pp = 1;  // pipeline stages' ranks (meta.json's mesh.pp; 1 when absent)
  // "none" (one process, or pipeline stages alone), "eager" or "compiled"
  std::string fsdp_mode = "none";
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
  // The global sample the step after this checkpoint begins at (TokenSource::SamplesBefore);
  // -1 where unknown (checkpoints before it was recorded): the resume then assumes this run's
  // rows a step throughout.
  int64_t samples = -1;
  // Rows every step took when it was written: batch_size x grad_accum x data-parallel ranks.
  int64_t RowsPerStep() const { return batch_size * grad_accum * dp_replicate * dp_shard; }
};

// This run's meta (step 0) from its config and engine.
CheckpointMeta RunMeta(const config::TrainConfig& cfg, const model::LlamaConfig& dims, const Engine& engine);

std::string StepDirName(int64_t step);  // "step-00000100"
std::string RankFileName(int rank);     // "rank-00000.pt": format 2
std::string ShardFileName(int rank);    // "rank-00000.safetensors": format 3

std::string MetaToJson(const CheckpointMeta& meta);
// InvalidInput naming the file when it is not a checkpoint's meta.json.
Result<CheckpointMeta> ReadMeta(const std::string& step_dir);
// InvalidInput listing every difference that stops a resume, naming `step_dir`: the model's dims
// always; for a format 2 checkpoint also the world size and mesh, which fixed its shard layout.
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

// Format 3: this rank's pieces (parameters and AdamW moments as fp32 CPU copies, flattened) in
// one safetensors file, its .sum beside it (written last: its presence marks the file complete).
Status SaveShardFile(const std::string& path, int64_t step, const std::vector<ShardPiece>& pieces,
                     const AdamW& optimizer);
// The same from pieces and states already copied (states[i]: pieces[i]'s, or none).
Status WriteShardFile(const std::string& path, int64_t step, const std::vector<ShardPiece>& pieces,
                      const std::vector<std::optional<AdamWParamState>>& states);
// What LoadShards read, for the resume's log line.
struct ShardLoadReport {
  int64_t bytes_read = 0;      // piece bytes read from the files
  int64_t bytes_in_files = 0;  // piece bytes the checkpoint holds in all
  int files_read = 0;          // files a piece was read from
};
// Fills `pieces` (this rank's, at this run's mesh) from the format 3 checkpoint in `step_dir`,
// written at any mesh: every file's header, then the pieces that overlap this rank's, each
// checked against its checksum. Everything is read and checked before a tensor is changed.
// InvalidInput naming the tensor: a parameter the checkpoint lacks, another whole shape, elements
// no file holds, pieces with different AdamW steps; naming the file: a size other than its .sum
// says, a header that is not a shard file's, a piece whose checksum differs. NotFound: a file.
Result<ShardLoadReport> LoadShards(const std::string& step_dir, const CheckpointMeta& saved,
                                   const std::vector<ShardPiece>& pieces, AdamW& optimizer);

// Records `path`'s size and checksum in its .sum file, as SaveRankFile does for what it writes
// (for a rank file written or repaired by other means).
Status WriteChecksumFile(const std::string& path);

// Whether Checkpointer::Resume will load a checkpoint: checkpoint.dir set, checkpoint.resume
// auto, and DIR/latest there, on every rank (one all-reduce: collective). A run that resumes takes
// every weight from the checkpoint, so model.init_from's import is skipped then.
Result<bool> WillResume(const config::CheckpointConfig& cfg, Engine& engine);

struct ResumePoint {
  int64_t step = 0;  // 0: nothing to resume, training starts from scratch
  std::string step_dir;
  CheckpointMeta saved;  // the checkpoint's meta.json (when step > 0)
  std::vector<std::string> notes;  // soft differences (DescribeSoftDifferences)
};

// Saves and resumes one run's checkpoints. Save and Resume are collective: every rank calls
// them at the same step, and all ranks fail together when one does.
class Checkpointer {
 public:
  Checkpointer(config::CheckpointConfig cfg, Engine& engine, AdamW& optimizer, CheckpointMeta run);
  // Stops a save in flight without committing it (a failing run must not wait on other ranks).
  ~Checkpointer();

  bool enabled() const { return !cfg_.dir.empty(); }
  // The data position the next Save records (CheckpointMeta::samples).
  void SetSamplesConsumed(int64_t samples) { run_.samples = samples; }
  // Whether to save after completing step `step` (1-based) of `total_steps`.
  bool Due(int64_t step, int64_t total_steps) const;

  // Uncommit, WriteFiles, wait until every rank wrote its files, then rank 0 Commits. With
  // checkpoint.async: waits for the previous save (Finish), Uncommits, removes this rank's files
  // of an earlier attempt at the step, agrees (a barrier), copies this rank's pieces and AdamW
  // state to host memory and returns; a thread writes them, and on rank 0 also meta.json, then
  // waits until every rank's .sum is on the shared storage and Commits. A crash at any point
  // leaves `latest` on the previous complete checkpoint.
  Status Save(int64_t step);
  // Waits for the save in flight, if any; its outcome agreed across ranks (collective: every rank
  // calls it at the same point: before the next save, and when training ends).
  Status Finish();
  // Seconds the last Save held the step (async: the wait for the previous save and the copy;
  // sync: the whole save).
  double last_stall_seconds() const { return last_stall_seconds_; }
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
  Status SaveAsync(int64_t step);

  config::CheckpointConfig cfg_;
  Engine& engine_;
  AdamW& optimizer_;
  CheckpointMeta run_;
  struct InFlight;  // the background save (checkpoint.cpp)
  std::unique_ptr<InFlight> in_flight_;
  double last_stall_seconds_ = 0;
};

}  // namespace meshwork::train
