// The hardware and the training shape a trainer config describes, as the compiler's cost model
// needs them (dist.mesh: auto, and the operator's check of a TrainingJob with mesh: auto). No
// libtorch: the operator links it.
#pragma once

#include "common/status.h"
#include "trainer/compiler/frontend.h"
#include "trainer/compiler/hardware_profile.h"
#include "trainer/compiler/pipeline/program.h"
#include "trainer/compiler/plan_options.h"
#include "trainer/config/config.h"

namespace meshwork::config {

// The profile dist.mesh: auto plans with: dist.hardware_profile (a file or a built-in name),
// else the built-in one for the device (h100-ib-400g on CUDA with metrics.device_profile auto
// or h100-sxm, cpu-gloo-local on the CPU). Its gpus_per_node becomes `ranks_per_node` (the
// ranks of one Pod share a node's link). Errors name dist.hardware_profile.
Result<compiler::HardwareProfile> MeshProfile(const TrainConfig& cfg, bool cuda, int ranks_per_node);

// The compiled plan's options the fsdp.* keys ask for (bucketing, reorder, the by-rows embedding,
// the vocabulary-split head, reshard after forward; the memory budget is the caller's: it needs
// the device). The one mapping from config to planner: the trainer's plan (fsdp/compile.cpp),
// dist.mesh: auto and meshwork-simulate's --calibration use it. A model split by tensor
// parallelism embeds and computes its loss over its own vocabulary slice: its plan reads no rows
// and splits no head (`tensor_parallel`).
compiler::PlanOptions PlanOptionsOf(const FsdpConfig& fsdp, bool tensor_parallel = false);

// What one rank trains, as the compiler's Llama model sees it (batch per rank, dtypes).
compiler::LlamaShape TrainingShape(const TrainConfig& cfg, bool cuda);

// Whether the fused head + loss keeps the logits' gradient from forward (training.loss_gradient:
// auto = on CUDA, and under a zero-bubble pipeline) rather than recomputing the logits in backward.
bool StoresLossGradient(const TrainConfig& cfg, bool cuda);

// Whether the model runs SwiGLU and rotary embedding fused (training.fused_kernels: auto = on
// CUDA when `kernels_built`, the build's CUDA kernels). An error naming the key for `on` on CUDA
// in a build without them.
Result<bool> UsesFusedKernels(const TrainConfig& cfg, bool cuda, bool kernels_built);

// Whether the residual stream runs in bf16 (training.residual_dtype: auto = wherever the run is
// under bf16 `autocast` with the `fused` norms, which read and keep a bf16 stream as it is;
// the composition would keep an fp32 copy of it besides). An error naming the key for bf16
// without autocast (a device that resolved to the CPU; Validate refuses the cases it can see).
Result<bool> UsesBf16Residual(const TrainConfig& cfg, bool autocast, bool fused);

// The pipeline schedule a config with mesh.pp > 1 runs: pipeline.schedule generated for mesh.pp
// ranks, pipeline.virtual_stages and training.grad_accum micro-batches. InvalidConfig naming
// pipeline.schedule and those keys where the schedule cannot run that shape (1F1B with fewer
// micro-batches than stages, interleaving with a count that is not a multiple of mesh.pp). The
// trainer's pipeline engine runs it; the operator checks a TrainingJob with it at admission.
Result<compiler::pipeline::Program> PipelineProgram(const TrainConfig& cfg);

}  // namespace meshwork::config
