// Pipeline schedules as programs (issue 47): one training step of pipeline parallelism as each
// pipeline rank's list of actions, in the order that rank runs them. An action is one
// micro-batch's forward (F), backward (B), or the backward's two halves that zero-bubble
// schedules place apart: backward for the inputs (I, the gradient the previous stage waits for)
// and for the weights (W, which nothing downstream waits for); or a point-to-point transfer
// between stages: an activation sent forward, its gradient sent back.
//
// A schedule is a generator (generators.h) that writes the compute order; Lower adds the
// transfers; Validate checks any program, generated or written by hand; SimulatePipeline
// (simulate.h) prices it and draws its timeline. The executor runs any valid program, so a new
// schedule is a new generator, not new runtime code.
//
// Stages: the model in pp x virtual_stages contiguous chunks of layers; stage s runs on rank
// s % pp (Megatron's interleaved placement: rank r holds stages r, r + pp, r + 2 pp, ...; with one
// virtual stage, stage r is rank r). Micro-batch m enters at stage 0; the last stage's forward
// ends in the loss, so its backward needs nothing from another stage.
//
// Text form (Print -> Parse -> Print is the identity), one line per rank:
//
//   pipeline pp=2 virtual=1 microbatches=2
//   rank 0: F0@0 sa0@0 F1@0 sa1@0 rg0@0 B0@0 rg1@0 B1@0
//   rank 1: ra0@1 F0@1 B0@1 sg0@1 ra1@1 F1@1 B1@1 sg1@1
//
// F/B/I/W<m>@<s>: compute of micro-batch m on stage s. sa<m>@<s>: send stage s's output
// activation of m to stage s + 1; ra<m>@<s>: receive stage s's input activation (from s - 1).
// sg<m>@<s>: send the gradient of stage s's input to s - 1; rg<m>@<s>: receive the gradient of
// stage s's output (from s + 1).
//
// FSDP inside the stages (compiled mode, PlaceFsdp): a rank's parameters are units (one collective
// each: a decoder layer's flat group, the embedding's, the head's), numbered on each rank in the
// order its stages use them, and its program says when each unit's collectives start:
//
//   rank 0: ag0@0 ag1@0 ag2@0 F0@0 sa0@0 F1@0 sa1@0 rg0@0 B0@0 rg1@0 B1@0 rs2@0 rs1@0 rs0@0
//
// ag<u>@<s>: start unit u's all-gather (u is used by stage s); its parameters are waited for at
// their first use inside a compute of stage s. rs<u>@<s>: unit u's gradients are final once the
// compute before it has run (the step's last backward through stage s: B, I or W); its
// reduce-scatter starts inside that compute as soon as they are (as each layer's backward ends),
// and at the latest when the rs is reached. A unit with no rs (a tied table, whose two copies'
// gradients the stages exchange first) is reduce-scattered after the program.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace meshwork::compiler::pipeline {

enum class ActionKind {
  kForward,
  kBackward,        // the whole backward: I and W together
  kBackwardInput,   // I
  kBackwardWeight,  // W
  kSendActivation,
  kRecvActivation,
  kSendGrad,
  kRecvGrad,
  kUpdate,          // U: the stage's parameters updated (asynchronous programs); `microbatch` is the minibatch
  kGather,          // ag: an FSDP unit's all-gather started; `microbatch` is the unit
  kReduceScatter,   // rs: an FSDP unit's gradients final; `microbatch` is the unit
};

struct Action {
  ActionKind kind = ActionKind::kForward;
  int microbatch = 0;
  int stage = 0;
  bool operator==(const Action& o) const { return kind == o.kind && microbatch == o.microbatch && stage == o.stage; }
};

bool IsCompute(ActionKind kind);   // F, B, I, W
bool IsTransfer(ActionKind kind);  // sa, ra, sg, rg
bool IsFsdp(ActionKind kind);      // ag, rs
bool IsBackward(ActionKind kind);  // B, I, W
// "F3@1", "sa3@1", ...
std::string ToString(const Action& a);

struct Shape {
  int pp = 1;              // pipeline ranks
  int virtual_stages = 1;  // stages per rank (interleaved schedules: > 1)
  int microbatches = 1;
  // Asynchronous programs: micro-batches per update (U), microbatches a multiple of it; 0 for a
  // synchronous program (one update after it, outside the program: the trainer's).
  int per_update = 0;
  int stages() const { return pp * virtual_stages; }
  int RankOf(int stage) const { return stage % pp; }
};

struct Program {
  Shape shape;
  std::vector<std::vector<Action>> ranks;  // ranks[r]: rank r's actions in order
  bool operator==(const Program& o) const {
    return shape.pp == o.shape.pp && shape.virtual_stages == o.shape.virtual_stages &&
           shape.microbatches == o.shape.microbatches && shape.per_update == o.shape.per_update && ranks == o.ranks;
  }
};

std::string Print(const Program& p);
// InvalidInput naming the line and the token for malformed text; the program is not validated.
Result<Program> Parse(std::string_view text);

// The program with its transfers: before a forward whose input comes from another rank, that
// activation's receive; after a forward whose output goes to another rank, its send; the same
// for the gradients around B and I. Transfers between stages on one rank are not needed (the
// tensors stay in memory). InvalidInput where the program already has transfers.
Result<Program> Lower(const Program& compute_only);

// Checks a program (compute only, or lowered), InvalidInput naming the rank and the action:
//   - shape: pp, virtual stages and micro-batches >= 1, one action list per rank;
//   - every action on the rank that holds its stage, micro-batch and stage in range;
//   - every micro-batch's F once on every stage, and either one B or one I and one W;
//   - on a rank: F before its B or I, I before its W;
//   - asynchronous (per_update > 0): every stage's U<k> once for each minibatch k, after the stage's
//     backwards (B or W) of minibatch k and before any of a later one; no U in a synchronous one;
//   - FSDP's ops (ag, rs): only in a synchronous program; a unit on one stage, on its rank; at
//     most one ag and one rs per unit, an rs only for a unit gathered here; a unit's ag before
//     every compute of its stage, its rs after every backward of its stage;
//   - a lowered program: every transfer between ranks present once (a send after the compute
//     that produces it, a receive before the compute that needs it), none within a rank;
//   - runs to the end: ranks run their actions in order, a receive waits for its send and a
//     compute for its inputs (sends never wait: they are posted, as isend); a program in which
//     every unfinished rank waits is a deadlock, reported with what each rank waits for.
Status Validate(const Program& p);

// One FSDP unit of a rank's parameters (see the text form above): the stage that uses it, and
// whether its gradients are reduce-scattered inside the program (false: after it, a tied table's).
struct FsdpUnit {
  int stage = 0;
  bool reduced_in_program = true;
};
// `lowered` (synchronous, without FSDP ops) with `units[r]` (rank r's, in the order its stages use
// them) placed in it: every unit's ag at the start of its rank's list, in that order (the gathers
// then run one after another while the first computes wait only for their own); each rs right
// after the compute that makes the unit's gradients final (its stage's last backward on the rank)
// and that compute's send, the later units first (a backward reaches them first). InvalidInput naming the rank and unit where a unit's stage is not on
// its rank, or where the program is asynchronous or already has FSDP ops.
Result<Program> PlaceFsdp(const Program& lowered, const std::vector<std::vector<FsdpUnit>>& units);

}  // namespace meshwork::compiler::pipeline
