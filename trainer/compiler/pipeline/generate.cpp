#include <string>

#include "trainer/compiler/pipeline/generators.h"

namespace meshwork::compiler::pipeline {

const char* ScheduleName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe: return "gpipe";
    case ScheduleKind::k1F1B: return "1f1b";
    case ScheduleKind::kInterleaved1F1B: return "interleaved-1f1b";
    case ScheduleKind::kZeroBubbleH1: return "zb-h1";
    case ScheduleKind::kPipeMare: return "pipemare";
  }
  return "?";
}

std::vector<ScheduleKind> AllSchedules() {
  return {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved1F1B, ScheduleKind::kZeroBubbleH1,
          ScheduleKind::kPipeMare};
}

Result<ScheduleKind> ParseScheduleKind(const std::string& name) {
  std::string known;
  for (ScheduleKind k : AllSchedules()) {
    if (name == ScheduleName(k)) return k;
    known += (known.empty() ? "" : ", ") + std::string(ScheduleName(k));
  }
  return InvalidConfig("pipeline schedule '" + name + "' is not one of " + known);
}

Result<Program> Generate(ScheduleKind kind, const Shape& shape) {
  const std::string what = std::string("pipeline schedule ") + ScheduleName(kind) + " with pp " + std::to_string(shape.pp) +
                           ", " + std::to_string(shape.virtual_stages) + " virtual stages and " +
                           std::to_string(shape.microbatches) + " micro-batches: ";
  if (shape.pp < 1 || shape.virtual_stages < 1 || shape.microbatches < 1)
    return InvalidConfig(what + "each must be >= 1");
  const bool interleaved = kind == ScheduleKind::kInterleaved1F1B;
  const bool async = kind == ScheduleKind::kPipeMare;
  if (async && (shape.per_update < 1 || shape.microbatches % shape.per_update != 0))
    return InvalidConfig(what + "needs micro-batches per update (per_update " + std::to_string(shape.per_update) +
                         ") >= 1 and dividing the stream's micro-batches");
  if (!async && shape.per_update != 0)
    return InvalidConfig(what + "is synchronous: one update after the program, no per_update");
  if (!interleaved && shape.virtual_stages != 1)
    return InvalidConfig(what + "only interleaved-1f1b runs more than one stage a rank");
  // Megatron's interleaved order with one stage a rank runs twice 1F1B's forwards ahead for the
  // same step: 1F1B is that schedule.
  if (interleaved && shape.virtual_stages == 1)
    return InvalidConfig(what + "needs more than one virtual stage (with one, use 1f1b)");
  if ((kind == ScheduleKind::k1F1B || kind == ScheduleKind::kZeroBubbleH1) && shape.microbatches < shape.pp)
    return InvalidConfig(what + "needs at least as many micro-batches as pp (fewer: every rank waits, use gpipe)");
  if (interleaved && shape.microbatches % shape.pp != 0)
    return InvalidConfig(what + "needs the micro-batches to be a multiple of pp (they run in groups of pp)");
  switch (kind) {
    case ScheduleKind::kGPipe: return GPipe(shape);
    case ScheduleKind::k1F1B: return OneFOneB(shape);
    case ScheduleKind::kInterleaved1F1B: return Interleaved1F1B(shape);
    case ScheduleKind::kZeroBubbleH1: return ZeroBubbleH1(shape);  // Internal if its scheduler stalls
    case ScheduleKind::kPipeMare: return PipeMare(shape);
  }
  return Internal("unknown pipeline schedule");
}

}  // namespace meshwork::compiler::pipeline
