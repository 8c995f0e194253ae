// The fast model of a plan's step and memory that the plan search ranks every plan by
// (plan_search.h, step 2), and the small pieces the search and its scoring share. Internal to
// the compiler: plan_search.cpp and plan_estimate.cpp.
#pragma once

#include <cstdint>
#include <string>

#include "trainer/compiler/frontend.h"
#include "trainer/compiler/plan_search.h"

namespace meshwork::compiler::plan {

double GiB(int64_t bytes);
std::string Fixed(double v, int digits);

// Mixed precision as the trainer runs it on GPUs: bf16 parameters and activations, gradients
// reduced in fp32, fp32 master shards and AdamW state (meshwork-simulate's ShapeOf).
LlamaShape BaseShape(const SearchSpec& spec, const HardwareProfile& profile);
// A single-program plan's shape: a data parallel rank's batch at its mesh.
LlamaShape SingleProgramShape(const SearchSpec& spec, const HardwareProfile& profile, const ParallelPlan& p);

// A step of `step` seconds in which each GPU's share of the global batch is `tokens_per_gpu_step`
// tokens, holding `peak` bytes: tokens/s per GPU and MFU.
PlanScore Scored(double step, double tokens_per_gpu_step, int64_t peak, const SearchSpec& spec,
                 const HardwareProfile& profile);
bool Faster(const PlanScore& a, const PlanScore& b);
// The tokens one GPU's share of a step is: the global batch over every GPU.
double TokensPerGpu(const SearchSpec& spec);

// The estimate of `c.plan` into c.estimate (its checkpointing into the plan for pipelines), or
// why it is out into c.rejected ("mesh: ...", "out of memory: ...").
void Estimate2d(const HardwareProfile& profile, const SearchSpec& spec, PlanCandidate& c);
void EstimatePipeline(const HardwareProfile& profile, const SearchSpec& spec, PlanCandidate& c);

}  // namespace meshwork::compiler::plan
