// Pipeline schedule generators, one file each: each writes the compute order of every rank for a
// shape (program.h); Lower adds the transfers. All are checked by Validate in the tests for a range
// of shapes, and priced by SimulatePipeline.
//
//   gpipe              GPipe: every micro-batch's forward, then every backward. Holds all
//                      micro-batches' activations on every rank.
//   1f1b               1F1B (PipeDream-Flush, Megatron): rank r runs pp - 1 - r forwards ahead,
//                      then one forward and one backward in turn, then the remaining backwards.
//                      Rank r holds at most pp - r micro-batches' activations. Needs
//                      micro-batches >= pp.
//   interleaved-1f1b   Megatron's interleaved 1F1B over virtual stages (rank r holds stages r,
//                      r + pp, ...): micro-batches in groups of pp, each group through one stage
//                      of the rank before the next; the bubble shrinks by the virtual stages.
//                      Needs virtual stages > 1 and micro-batches a multiple of pp.
//   zb-h1              Zero-bubble H1 (Qi et al., 2023): the backward split into I (the input's
//                      gradient, which the previous stage waits for) and W (the weights', which
//                      nothing waits for); at most pp - r micro-batches forwarded and not yet
//                      through W on rank r (1F1B's peak), and each W run when the rank would otherwise
//                      wait, so the W's fill the bubbles 1F1B leaves. Written by a list scheduler
//                      on equal F, I and W times (the paper's handcrafted schedule assumes them
//                      equal). Needs micro-batches >= pp.
//   pipemare           PipeMare (Yang et al., 2021): asynchronous, no flush. The micro-batches are
//                      one stream in 1F1B's order (the warm-up once, at the start), and each stage
//                      updates its own parameters as soon as it has run the backwards of a
//                      minibatch's per_update micro-batches (U), while the next minibatch's are in
//                      flight: a micro-batch's forward on stage s can run up to ceil((pp - 1 - s) /
//                      per_update) updates before its backward. The shape's per_update is the
//                      micro-batches of one minibatch (training.grad_accum); any count runs, one
//                      included. The trainer runs it one minibatch a step (steps.h).
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "trainer/compiler/pipeline/program.h"

namespace meshwork::compiler::pipeline {

enum class ScheduleKind { kGPipe, k1F1B, kInterleaved1F1B, kZeroBubbleH1, kPipeMare };

// "gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "pipemare".
const char* ScheduleName(ScheduleKind kind);
// InvalidConfig naming the value and the known names.
Result<ScheduleKind> ParseScheduleKind(const std::string& name);
std::vector<ScheduleKind> AllSchedules();

// The compute-only program of `kind` for `shape`; InvalidConfig naming the schedule and the
// shape where it cannot run it (virtual stages on a schedule without them, too few micro-batches,
// per_update on a synchronous schedule or missing on pipemare).
Result<Program> Generate(ScheduleKind kind, const Shape& shape);

Program GPipe(const Shape& shape);
Program OneFOneB(const Shape& shape);
Program Interleaved1F1B(const Shape& shape);
Result<Program> ZeroBubbleH1(const Shape& shape);  // Internal where its list scheduler stalls (a bug)
Program PipeMare(const Shape& shape);               // shape.per_update >= 1 dividing the micro-batches

}  // namespace meshwork::compiler::pipeline
