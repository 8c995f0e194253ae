#include "trainer/config/hardware.h"

#include <algorithm>
#include <string>

#include "common/enum_names.h"
#include "trainer/compiler/pipeline/generators.h"
#include "trainer/compiler/pipeline/steps.h"

namespace meshwork::config {

Result<compiler::HardwareProfile> MeshProfile(const TrainConfig& cfg, bool cuda, int ranks_per_node) {
  std::string name = cfg.dist.hardware_profile;
  if (name.empty()) {
    const DeviceProfileName device = cfg.metrics.device_profile;
    if (!cuda) {
      name = "cpu-gloo-local";
    } else if (device == DeviceProfileName::kAuto || device == DeviceProfileName::kH100Sxm) {
      name = "h100-ib-400g";
    } else {
      return InvalidConfig("key 'dist.hardware_profile': dist.mesh: auto has no built-in hardware profile for "
                           "metrics.device_profile '" + std::string(NameOf(kDeviceProfileNames, device)) +
                           "'; set dist.hardware_profile to a profile file (bench/profiles/*.yaml shows the keys)");
    }
  }
  Result<compiler::HardwareProfile> profile = compiler::FindHardwareProfile(name);
  if (!profile.ok()) {
    return Status(profile.status().code(), "key 'dist.hardware_profile': " + profile.status().message());
  }
  profile->gpus_per_node = std::max(1, ranks_per_node);
  return profile;
}

compiler::PlanOptions PlanOptionsOf(const FsdpConfig& fsdp, bool tensor_parallel) {
  using Rows = compiler::PlanOptions::Rows;
  compiler::PlanOptions options;
  options.bucketing = fsdp.bucketing;
  options.reorder = fsdp.reorder;
  options.read_by_rows = fsdp.embedding_rows && !tensor_parallel ? Rows::kWhenFaster : Rows::kNever;
  options.split_by_vocabulary = fsdp.vocab_parallel_head && !tensor_parallel ? Rows::kWhenFaster : Rows::kNever;
  options.reshard_after_forward = fsdp.reshard_after_forward;
  return options;
}

compiler::LlamaShape TrainingShape(const TrainConfig& cfg, bool cuda) {
  compiler::LlamaShape shape;
  shape.config = cfg.model.dims;
  shape.batch = cfg.data.batch_size;
  shape.seq_len = cfg.data.seq_len;
  const bool bf16 = cuda && cfg.training.dtype != Dtype::kFp32;
  shape.param_bytes = bf16 ? 2 : 4;
  shape.activation_bytes = bf16 ? 2 : 4;
  // As the CUDA flavor runs it: built with the fused kernels.
  const Result<bool> fused = UsesFusedKernels(cfg, cuda, /*kernels_built=*/true);
  const Result<bool> bf16_residual = UsesBf16Residual(cfg, bf16, fused.ok() && *fused);
  shape.residual_bytes = bf16_residual.ok() && *bf16_residual ? 2 : 4;
  shape.reduce_bytes = 4;
  shape.head_stores_logit_grad = StoresLossGradient(cfg, cuda);
  return shape;
}

bool StoresLossGradient(const TrainConfig& cfg, bool cuda) {
  switch (cfg.training.loss_gradient) {
    case LossGradient::kStored: return true;
    case LossGradient::kRecompute: return false;
    case LossGradient::kAuto: break;
  }
  // Zero-bubble's split backward runs the head's backward twice, once for the hidden states'
  // gradient and once for the weight's (trainer/pp/split_backward.h): recomputed logits would be
  // computed in each.
  return cuda || (cfg.mesh.pp > 1 && cfg.pipeline.schedule == PipelineSchedule::kZeroBubbleH1);
}

Result<bool> UsesFusedKernels(const TrainConfig& cfg, bool cuda, bool kernels_built) {
  switch (cfg.training.fused_kernels) {
    case FusedKernels::kOff: return false;
    case FusedKernels::kAuto: return cuda && kernels_built;
    case FusedKernels::kOn: break;
  }
  if (cuda && !kernels_built) {
    return InvalidConfig(
        "key 'training.fused_kernels': on, but this build has no CUDA kernels (nvcc was not found when it "
        "was built: docs/gpu.md); use auto or off");
  }
  return true;
}

Result<bool> UsesBf16Residual(const TrainConfig& cfg, bool autocast, bool fused) {
  switch (cfg.training.residual_dtype) {
    case ResidualDtype::kFp32: return false;
    case ResidualDtype::kAuto: return autocast && fused;
    case ResidualDtype::kBf16: break;
  }
  if (!autocast) {
    return InvalidConfig("key 'training.residual_dtype': bf16 needs bf16 autocast, but this run computes in fp32 "
                         "(training.dtype '" + std::string(NameOf(kDtypeNames, cfg.training.dtype)) +
                         "', training.device '" + cfg.training.device + "'); use auto or fp32");
  }
  return true;
}

Result<compiler::pipeline::Program> PipelineProgram(const TrainConfig& cfg) {
  namespace pipeline = compiler::pipeline;
  const std::string schedule = NameOf(kPipelineScheduleNames, cfg.pipeline.schedule);
  MW_ASSIGN_OR_RETURN(pipeline::ScheduleKind kind, pipeline::ParseScheduleKind(schedule));
  pipeline::Shape shape{static_cast<int>(cfg.mesh.pp), static_cast<int>(cfg.pipeline.virtual_stages),
                        static_cast<int>(cfg.training.grad_accum)};
  if (kind == pipeline::ScheduleKind::kPipeMare) {
    // A stream of minibatches of training.grad_accum micro-batches each: long enough to pass the
    // pipeline's filling and reach its steady step (the trainer runs it step by step: steps.h).
    shape.per_update = shape.microbatches;
    shape.microbatches *= pipeline::FillingSteps(shape) + 2;
  }
  auto program = pipeline::Generate(kind, shape);
  if (!program.ok()) {
    return InvalidConfig("key 'pipeline.schedule': " + program.status().message() + " (micro-batches: training.grad_accum=" +
                         std::to_string(cfg.training.grad_accum) + "; stages per rank: pipeline.virtual_stages=" +
                         std::to_string(cfg.pipeline.virtual_stages) + ")");
  }
  return program;
}

}  // namespace meshwork::config
