// The trainer's typed configuration: one YAML file plus `--set key=value` overrides, validated
// when it is built. Every key is listed in docs/config.md; unknown keys, wrong types and
// out-of-range values are rejected before any work, naming the key and the value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/enum_names.h"
#include "common/status.h"
#include "trainer/compiler/bucketing.h"
#include "trainer/data/token_format.h"
#include "trainer/model/llama_config.h"

namespace meshwork::config {

// The keys that take one of a few words hold enums; each table below is the only spelling of
// its words (parsing, printing, the "must be one of" message and docs/config.md's tests).
enum class LrDecay { kCosine, kLinear, kConstant };
inline constexpr EnumName<LrDecay> kLrDecayNames[] = {
    {LrDecay::kCosine, "cosine"}, {LrDecay::kLinear, "linear"}, {LrDecay::kConstant, "constant"}};

enum class Dtype { kAuto, kFp32, kBf16 };
inline constexpr EnumName<Dtype> kDtypeNames[] = {{Dtype::kAuto, "auto"}, {Dtype::kFp32, "fp32"}, {Dtype::kBf16, "bf16"}};

enum class FsdpMode { kEager, kCompiled };
inline constexpr EnumName<FsdpMode> kFsdpModeNames[] = {{FsdpMode::kEager, "eager"}, {FsdpMode::kCompiled, "compiled"}};

enum class DeviceProfileName { kAuto, kCpu, kH100Sxm, kH200, kA100, kL4 };
inline constexpr EnumName<DeviceProfileName> kDeviceProfileNames[] = {
    {DeviceProfileName::kAuto, "auto"}, {DeviceProfileName::kCpu, "cpu"},     {DeviceProfileName::kH100Sxm, "h100-sxm"},
    {DeviceProfileName::kH200, "h200"}, {DeviceProfileName::kA100, "a100"}, {DeviceProfileName::kL4, "l4"}};

enum class MeshPolicy { kExplicit, kAuto };
inline constexpr EnumName<MeshPolicy> kMeshPolicyNames[] = {{MeshPolicy::kExplicit, "explicit"},
                                                            {MeshPolicy::kAuto, "auto"}};

// Pipeline schedules (trainer/compiler/pipeline/generators.h names them the same).
enum class PipelineSchedule { kGPipe, k1F1B, kInterleaved1F1B, kZeroBubbleH1, kPipeMare };
inline constexpr EnumName<PipelineSchedule> kPipelineScheduleNames[] = {
    {PipelineSchedule::kGPipe, "gpipe"},
    {PipelineSchedule::k1F1B, "1f1b"},
    {PipelineSchedule::kInterleaved1F1B, "interleaved-1f1b"},
    {PipelineSchedule::kZeroBubbleH1, "zb-h1"},
    {PipelineSchedule::kPipeMare, "pipemare"}};

enum class ActivationCheckpointing { kAuto, kNone, kAll, kSelective };
inline constexpr EnumName<ActivationCheckpointing> kActivationCheckpointingNames[] = {
    {ActivationCheckpointing::kAuto, "auto"},
    {ActivationCheckpointing::kNone, "none"},
    {ActivationCheckpointing::kAll, "all"},
    {ActivationCheckpointing::kSelective, "selective"}};

// How the fused output head + loss gets the logits' gradient (model/linear_cross_entropy.h):
// auto = stored on CUDA, recomputed on the CPU.
enum class FusedKernels { kAuto, kOn, kOff };
inline constexpr EnumName<FusedKernels> kFusedKernelsNames[] = {
    {FusedKernels::kAuto, "auto"}, {FusedKernels::kOn, "on"}, {FusedKernels::kOff, "off"}};

// Persistent bf16 copies of the fp32 weights for the matmuls (model/weight_copies.h).
enum class WeightCopies { kAuto, kOff };
inline constexpr EnumName<WeightCopies> kWeightCopiesNames[] = {{WeightCopies::kAuto, "auto"},
                                                                {WeightCopies::kOff, "off"}};

enum class ResidualDtype { kAuto, kFp32, kBf16 };
inline constexpr EnumName<ResidualDtype> kResidualDtypeNames[] = {
    {ResidualDtype::kAuto, "auto"}, {ResidualDtype::kFp32, "fp32"}, {ResidualDtype::kBf16, "bf16"}};

// Which kernel runs attention (model/compat.h): auto = libtorch's SDPA picks; the others
// restrict it to that one.
enum class AttentionBackend { kAuto, kFlash, kCudnn, kEfficient, kMath };
inline constexpr EnumName<AttentionBackend> kAttentionBackendNames[] = {{AttentionBackend::kAuto, "auto"},
                                                                       {AttentionBackend::kFlash, "flash"},
                                                                       {AttentionBackend::kCudnn, "cudnn"},
                                                                       {AttentionBackend::kEfficient, "efficient"},
                                                                       {AttentionBackend::kMath, "math"}};

enum class LossGradient { kAuto, kStored, kRecompute };
inline constexpr EnumName<LossGradient> kLossGradientNames[] = {
    {LossGradient::kAuto, "auto"}, {LossGradient::kStored, "stored"}, {LossGradient::kRecompute, "recompute"}};

enum class ExportDtype { kFp32, kBf16 };
inline constexpr EnumName<ExportDtype> kExportDtypeNames[] = {{ExportDtype::kFp32, "fp32"}, {ExportDtype::kBf16, "bf16"}};

enum class Resume { kAuto, kNever };
inline constexpr EnumName<Resume> kResumeNames[] = {{Resume::kAuto, "auto"}, {Resume::kNever, "never"}};

struct ModelConfig {
  std::string preset = "tiny";
  model::LlamaConfig dims;       // resolved from the preset and explicit dims
  bool dims_explicit = false;    // the user named a preset or a dim (checked against init_from)
  std::string init_from;         // Hugging Face model directory to import weights from
  double init_std = 0.02;
};

struct DataConfig {
  std::string train = "synthetic";  // token file, or "synthetic"
  std::string val;                  // token file for evaluation (optional)
  data::TokenFormat token_format = data::TokenFormat::kAuto;
  data::SampleOrder order = data::SampleOrder::kRandom;  // how training rows are drawn
  int64_t seq_len = 128;
  int64_t batch_size = 16;  // sequences per micro-batch
  // Packed documents attend only within themselves (model::DocumentMask), at the cost of a mask
  // in attention (docs/data.md "Document masking").
  // The tokenizer the token files were made with (a tokenizer.json, a SentencePiece .model, or a
  // directory holding one); "": model.init_from's, where it carries one. Checked against the model
  // and the files, and copied beside checkpoint.export_hf.
  std::string tokenizer;
  bool document_masking = false;
  int64_t document_separator = -1;  // the id that ends a document; -1: what the token file records
};

// Which kernel runs AdamW's update (train/adamw.h): auto = Meshwork's own on CUDA where the
// build has the kernels, else libtorch's fused one on CUDA, foreach on the CPU.
enum class OptimizerImplementation { kAuto, kForeach, kFused, kMeshwork };
inline constexpr EnumName<OptimizerImplementation> kOptimizerImplementationNames[] = {
    {OptimizerImplementation::kAuto, "auto"},
    {OptimizerImplementation::kForeach, "foreach"},
    {OptimizerImplementation::kFused, "fused"},
    {OptimizerImplementation::kMeshwork, "meshwork"}};

struct OptimizerConfig {
  double lr = 3e-3;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // 0 disables clipping (the norm is still reported)
  OptimizerImplementation implementation = OptimizerImplementation::kAuto;
};

struct ScheduleConfig {
  int64_t steps = 200;
  int64_t warmup_steps = 20;
  LrDecay decay = LrDecay::kCosine;
  double min_lr_ratio = 0.1;     // final lr = lr * min_lr_ratio
};

struct TrainingConfig {
  std::string device = "auto";  // auto | cpu | cuda | cuda:N
  Dtype dtype = Dtype::kAuto;   // bf16 = autocast on CUDA
  int64_t grad_accum = 1;
  // Rows of one optimizer step over every data parallel rank, kept at any world size (an
  // elastic job's resize): 0 = data.batch_size x data parallel ranks x grad_accum.
  int64_t global_batch_size = 0;
  int64_t seed = 1234;
  int64_t threads = 0;  // CPU intra-op threads; 0 = libtorch's default
  // Recompute decoder layers in backward: auto = the layers compiled FSDP's plan picks under its
  // memory budget (otherwise none); none; all.
  ActivationCheckpointing activation_checkpointing = ActivationCheckpointing::kAuto;
  // selective: layers 0, N, 2N, ... are checkpointed (one process and FSDP alike).
  int64_t checkpoint_every = 2;
  // MiB of fp32 logits per chunk of the fused output head + loss (model/linear_cross_entropy.h).
  int64_t loss_chunk_mib = 256;
  LossGradient loss_gradient = LossGradient::kAuto;
  // q/k/v and gate/up each from one GEMM over their concatenated weights (model/llama.h).
  bool merge_projections = true;
  // SwiGLU and rotary embedding as one fused op each (model/fused_ops.h): auto = on CUDA where
  // the build has the kernels; on = everywhere (the host loop on the CPU); off = the composition.
  FusedKernels fused_kernels = FusedKernels::kAuto;
  // The residual stream's dtype (the embedding's output and every decoder layer's) under bf16
  // autocast: auto = bf16; fp32; bf16 (refused where nothing runs under autocast). Without
  // autocast it is the weights' dtype.
  ResidualDtype residual_dtype = ResidualDtype::kAuto;
  // Persistent bf16 copies of the weights, written by Meshwork's AdamW kernel and read by the
  // fused projections and the output head instead of casting every weight each forward: auto =
  // where they apply (one process, bf16 autocast, fused kernels, AdamW meshwork); off = never.
  WeightCopies weight_copies = WeightCopies::kAuto;
  // The attention kernel: auto = SDPA's own choice for the model's shapes and dtype; flash,
  // cudnn, efficient (CUDA) or math = that one only (exit 2 at start-up if it cannot run them).
  AttentionBackend attention_backend = AttentionBackend::kAuto;
  // The most tensor memory this process may hold, in MiB; 0 = what the device has. On the CPU
  // the counting allocator refuses more (as a smaller device would run out); on CUDA the
  // caching allocator's memory fraction. The compiled plan's default budget follows it.
  int64_t memory_limit_mib = 0;
  // Kineto profile of profile_steps steady steps (libtorch 2.x): Chrome trace written here by
  // rank 0, and a summary of where the time went in the log (train/profile.h). Empty: off.
  std::string profile_out;
  int64_t profile_steps = 2;
};

struct EvalConfig {
  std::string data;       // token file; empty = data.val
  int64_t windows = 16;   // contiguous windows of seq_len+1 tokens
  int64_t every = 0;      // evaluate every N steps during training; 0 = only at start and end
};

struct LoggingConfig {
  int64_t every = 10;  // a progress line every N steps (and the last)
  std::string jsonl;   // rank 0 appends one JSON object per step here ("" = off)
};

struct MeshConfig {
  int64_t dp_replicate = 1;  // HSDP replicas; 0 = whatever the world size leaves
  int64_t dp_shard = 0;      // ranks a parameter is sharded over; 0 = world / dp_replicate
  int64_t tp = 1;            // tensor parallel ranks (trainer/tp/tensor_parallel.h)
  bool sequence_parallel = true;  // with tp > 1: norms and the residual stream split by tokens
  // With sequence parallelism: each region's exchange and matmul in this many chunks that overlap
  // (async TP); 1: not overlapped.
  int64_t async_tp_chunks = 1;
  // Pipeline stages (trainer/pp): the model's layers cut over this many ranks; > 1 needs the
  // other dims at 1 (not composed yet). training.grad_accum is the micro-batches of a step.
  int64_t pp = 1;
};

struct PipelineConfig {
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  int64_t virtual_stages = 1;  // stages per rank (interleaved-1f1b: > 1)
  // pipemare: steps over which each stage's learning rate rises from base / delay^1 to base
  // (PipeMare's rescheduling); -1: schedule.warmup_steps, 0: off.
  int64_t lr_reschedule_steps = -1;
  bool discrepancy_correction = true;  // pipemare: backward weights extrapolated back by the delay
  double correction_decay = 0.5;       // pipemare: D, the velocity's decay D^(1/delay) per update
};

struct FsdpConfig {
  bool reshard_after_forward = true;  // free each layer's gathered weights after its forward
  bool prefetch = true;               // issue the next layer's all-gather before computing
  FsdpMode mode = FsdpMode::kEager;   // compiled: the schedule compiler plans after step 2
  compiler::Bucketing bucketing = compiler::Bucketing::kAuto;  // compiled
  bool reorder = true;                // compiled: run the reorder pass
  bool embedding_rows = true;         // compiled: read the embedding by rows (compiler::ReadByRows)
  bool vocab_parallel_head = true;    // compiled: a tied head split by vocabulary (compiler::SplitByVocabulary)
  bool replan = true;                 // compiled: refit compute from two compiled steps, plan once more
  // compiled: MiB of gathered weights + activations + grads; 0 = the device's memory less the
  // static state; -1 = the eager plan's peak
  int64_t memory_budget = 0;
  bool dump_plan = false;             // compiled: print the IR before/after each pass (rank 0)
  std::string trace_out;              // Chrome trace of step 3 (every rank's lanes) written here by rank 0
  std::string calibration_out;        // compiled: rank 0 writes the plan's calibration here (compiler::Calibration)
  bool single_process = false;        // one process too runs FSDP, over a mesh of one rank
};

struct DistConfig {
  int64_t timeout_seconds = 300;  // rendezvous and every collective
  std::string gloo_hostname;      // address Gloo binds to; "" = 127.0.0.1 for a local launch, else the host's
  MeshPolicy mesh = MeshPolicy::kExplicit;  // auto: rank 0 picks dp_replicate x dp_shard (mesh.* unset)
  std::string hardware_profile;   // dist.mesh: auto plans with this profile; "" = the built-in for the device
  // After this many steps of a run, the running plan judged against the whole plan search on a
  // compute rate refitted to the measured steps (train/plan_advice.h); 0: never.
  int64_t advise_after_steps = 10;
};

struct MetricsConfig {
  int64_t port = 9400;  // -1 disables /metrics, 0 picks a free port
  std::string host = "0.0.0.0";
  std::string job = "local";           // `job` label on every series
  DeviceProfileName device_profile = DeviceProfileName::kAuto;
  double peak_tflops = 0.0;            // overrides the profile's peak when > 0
};

struct CheckpointConfig {
  std::string export_hf;               // write a Hugging Face model directory here at the end
  ExportDtype export_dtype = ExportDtype::kFp32;
  std::string dir;                     // training checkpoints (every rank's shards) here; "" = none
  int64_t every = 0;                   // save every N steps; 0 = only after the last step
  int64_t keep = 2;                    // complete checkpoints kept; older ones are deleted
  Resume resume = Resume::kAuto;       // auto: resume from dir/latest when it exists
  bool async = false;                  // write in a background thread; the step stalls only to copy
  bool save_on_terminate = true;       // SIGTERM: finish the step, save it, stop (train/terminate.h)
};

struct TrainConfig {
  ModelConfig model;
  DataConfig data;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  TrainingConfig training;
  EvalConfig eval;
  LoggingConfig logging;
  MeshConfig mesh;
  PipelineConfig pipeline;
  FsdpConfig fsdp;
  DistConfig dist;
  MetricsConfig metrics;
  CheckpointConfig checkpoint;
};

// Builds a config from an optional YAML file (empty path = defaults only) and `key=value`
// overrides applied on top, in order. Validates everything before returning.
Result<TrainConfig> LoadConfig(const std::string& yaml_path, const std::vector<std::string>& overrides);
Result<TrainConfig> LoadConfigFromString(const std::string& yaml_text,
                                         const std::vector<std::string>& overrides);
// The YAML text comes from environment variable `var` (`train --config-env VAR`: a Kubernetes
// ConfigMap passed through the pod's environment). Unset or empty is InvalidConfig naming it.
Result<TrainConfig> LoadConfigFromEnv(const std::string& var, const std::vector<std::string>& overrides);

// training.global_batch_size at `world_size` ranks: with it set, picks the fewest micro-batches
// (training.grad_accum, at least as configured) whose rows fit data.batch_size (the largest
// micro-batch a rank runs) so that data parallel ranks x micro-batches x rows is the global
// batch, and sets both keys. The data parallel ranks are world / (mesh.tp x mesh.pp). Returns the
// line the trainer logs ("" when the key is unset); InvalidConfig naming the key and the numbers
// when the global batch does not split so, or the split breaks another key's rule.
Result<std::string> ResolveGlobalBatch(TrainConfig& c, int64_t world_size);

// `overlay` on top of `base`, both YAML config texts: mappings merge key by key, recursively, and
// anything else in `overlay` (a scalar, a list) replaces `base`'s value. A TrainingRuntime's
// default config under a job's own. Text that is not YAML, or not a mapping at the top, is
// InvalidConfig naming `base_name` or `overlay_name`. An empty text counts as an empty mapping.
Result<std::string> MergeYaml(const std::string& base, const std::string& overlay, const std::string& base_name,
                              const std::string& overlay_name);

// The resolved config as YAML (every key, defaults included).
std::string ToYaml(const TrainConfig& c);

// Every key the config accepts, dotted ("optimizer.lr"), for docs and tests.
std::vector<std::string> KnownKeys();

}  // namespace meshwork::config
