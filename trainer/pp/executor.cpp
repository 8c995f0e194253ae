#include "trainer/pp/executor.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "trainer/pp/split_backward.h"

namespace meshwork::pp {
namespace {

namespace pipeline = compiler::pipeline;
using pipeline::Action;
using pipeline::ActionKind;

double SteadyNow() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Status CheckGroup(const pipeline::Shape& shape, const dist::Communicator& comm) {
  if (shape.pp != comm.size()) {
    return InvalidInput("pipeline program for pp=" + std::to_string(shape.pp) + " on a group of " +
                        std::to_string(comm.size()) + " ranks");
  }
  return Status::Ok();
}

// The last stage's value on every rank (the others add 0).
Result<double> SumOverGroup(dist::Communicator& comm, double value) {
  torch::Tensor t = torch::tensor({value}, torch::kFloat64);
  MW_ASSIGN_OR_RETURN(auto reduce, comm.AllReduce(t, dist::ReduceOp::kSum));
  MW_RETURN_IF_ERROR(reduce->Wait());
  return t.item<double>();
}

// Whether activations travel in shares over options.replicas (PipelineStepOptions::replicas).
bool SendsShares(const PipelineStepOptions& o, int64_t numel) {
  return o.replicas != nullptr && o.replicas->size() > 1 && numel % o.replicas->size() == 0;
}

// What this rank sends of `t` (contiguous): its share, or all of it.
torch::Tensor SendShare(const torch::Tensor& t, const PipelineStepOptions& o) {
  if (!SendsShares(o, t.numel())) return t;
  const int64_t n = t.numel() / o.replicas->size();
  return t.view({-1}).narrow(0, o.replicas->rank() * n, n);
}

// One activation (or its gradient) on its way from `peer`: the receive is posted (Gloo moves a
// message only once its receive is), the tensor it fills is the whole or this rank's share.
struct PostedReceive {
  int peer = -1;
  std::unique_ptr<dist::Work> work;
  torch::Tensor whole;
  torch::Tensor share;  // defined where the replicas send shares
};

Result<PostedReceive> PostReceive(dist::Communicator& comm, int peer, const PipelineStepOptions& o) {
  PostedReceive r;
  r.peer = peer;
  r.whole = torch::empty(o.activation_sizes, torch::TensorOptions().dtype(o.activation_dtype));
  if (SendsShares(o, r.whole.numel())) {
    r.share = torch::empty({r.whole.numel() / o.replicas->size()}, r.whole.options());
  }
  MW_ASSIGN_OR_RETURN(r.work, comm.Recv(r.share.defined() ? r.share : r.whole, peer));
  return r;
}

// The received tensor whole: the transfer waited for, and with shares the others' gathered from the
// replicas (a collective of theirs, so at the receive's place in the program on every replica).
Result<torch::Tensor> FinishReceive(PostedReceive& r, const PipelineStepOptions& o) {
  MW_RETURN_IF_ERROR(r.work->Wait());
  if (!r.share.defined()) return r.whole;
  MW_ASSIGN_OR_RETURN(auto gather, o.replicas->AllGatherInto(r.whole.view({-1}), r.share));
  MW_RETURN_IF_ERROR(gather->Wait());
  return r.whole;
}

Result<torch::Tensor> ReceiveWhole(dist::Communicator& comm, int peer, const PipelineStepOptions& o) {
  MW_ASSIGN_OR_RETURN(PostedReceive r, PostReceive(comm, peer, o));
  return FinishReceive(r, o);
}

// What one (micro-batch, stage) has produced so far on this rank.
struct Slot {
  torch::Tensor input;        // the stage's input leaf (undefined on the first stage)
  torch::Tensor output;       // the forward's result: the activation passed on, or the scaled loss
  torch::Tensor output_grad;  // the gradient of output (received, or from the next stage here)
  torch::Tensor input_grad;   // the gradient of input, once B or I ran
  torch::Tensor embedded;     // the first stage under a split backward: what `input` was cut from
  bool split = false;         // I ran as half of a split backward; W finishes it from `weight`
  WeightBackward weight;
  int updates_at_forward = 0;  // asynchronous programs: the stage's updates before its forward
  bool InFlight() const { return input.defined() || output.defined() || output_grad.defined() || input_grad.defined(); }
};

using Sends = std::vector<std::pair<std::unique_ptr<dist::Work>, torch::Tensor>>;

}  // namespace

struct PipelineCarry::State {
  std::map<std::pair<int, int>, Slot> slots;  // numbered from the next step's first micro-batch
  std::map<int, int> updates;                 // stage -> its updates so far
  Sends sends;  // posted in the last step; a later step's receive may be what they wait for
};

namespace {

class StepRun {
 public:
  StepRun(const pipeline::Program& program, StageRunner& stages, dist::Communicator& comm,
          const std::vector<MicroBatch>& microbatches, const PipelineStepOptions& options, PipelineCarry* carry)
      : program_(program), stages_(stages), comm_(comm), microbatches_(microbatches), options_(options), carry_(carry) {
    if (carry_ && carry_->state) {
      slots_ = std::move(carry_->state->slots);
      updates_ = std::move(carry_->state->updates);
    }
    for (const auto& actions : program_.ranks) {
      for (const Action& a : actions) split_ = split_ || a.kind == ActionKind::kBackwardInput;
    }
  }

  Result<PipelineStepResult> Run() {
    const pipeline::Shape& shape = program_.shape;
    MW_RETURN_IF_ERROR(CheckGroup(shape, comm_));
    bool forwards = false;
    for (const Action& a : program_.ranks[static_cast<size_t>(comm_.rank())]) forwards |= a.kind == ActionKind::kForward;
    const bool drain = carry_ != nullptr && microbatches_.empty();
    if (drain && forwards) return InvalidInput("pipeline step without micro-batches, but its program has forwards");
    if (!drain && static_cast<int>(microbatches_.size()) != shape.microbatches) {
      return InvalidInput("pipeline program for " + std::to_string(shape.microbatches) + " micro-batches given " +
                          std::to_string(microbatches_.size()));
    }
    const int rank = comm_.rank();
    for (const Action& a : program_.ranks[static_cast<size_t>(rank)]) {
      // Refused before any receive is posted.
      if (pipeline::IsFsdp(a.kind) && options_.fsdp == nullptr) {
        return Missing(a, "an FSDP op, but the step runs without FSDP");
      }
      if (a.kind == ActionKind::kRecvActivation) receives_.push_back(shape.RankOf(a.stage - 1));
      if (a.kind == ActionKind::kRecvGrad) receives_.push_back(shape.RankOf(a.stage + 1));
    }
    MW_RETURN_IF_ERROR(PostAhead(Ahead()));
    PipelineStepResult result;
    const std::vector<Action>& list = program_.ranks[static_cast<size_t>(rank)];
    for (size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      const double start = SteadyNow();
      if (pipeline::IsCompute(a.kind)) MW_RETURN_IF_ERROR(ArmReduceScatters(list, i));
      MW_RETURN_IF_ERROR(Step(a));
      result.spans.push_back({a, start, SteadyNow()});
    }
    MW_RETURN_IF_ERROR(FinishSends(drain));
    if (!result.spans.empty()) result.seconds = SteadyNow() - result.spans.front().start;
    MW_ASSIGN_OR_RETURN(result.loss, SumOverGroup(comm_, loss_sum_));
    return result;
  }

 private:
  // A send's tensor must live until its transfer is done. In a synchronous program all of them
  // are by the step's end. In an asynchronous one a send may wait for a receive of the next step:
  // the sends of the step before this one are done by now (their receives, if not in this
  // rank's peers' last step, were in this one, which every rank has run), this step's are kept.
  // The micro-batches still in flight go to the carry, renumbered from the next step's first.
  Status FinishSends(bool drain) {
    if (carry_ == nullptr) {
      for (auto& [work, tensor] : sends_) MW_RETURN_IF_ERROR(work->Wait());
      sends_.clear();
      return Status::Ok();
    }
    if (!carry_->state) carry_->state = std::make_shared<PipelineCarry::State>();
    PipelineCarry::State& state = *carry_->state;
    for (auto& [work, tensor] : state.sends) MW_RETURN_IF_ERROR(work->Wait());
    state.sends = std::move(sends_);
    if (drain) {
      for (auto& [work, tensor] : state.sends) MW_RETURN_IF_ERROR(work->Wait());
      state.sends.clear();
    }
    state.slots.clear();
    const int n = program_.shape.microbatches;
    for (auto& [key, slot] : slots_) {
      if (slot.InFlight()) state.slots[{key.first - n, key.second}] = std::move(slot);
    }
    if (drain && !state.slots.empty()) {
      return Internal("pipeline rank " + std::to_string(comm_.rank()) + ": a drain left " +
                      std::to_string(state.slots.size()) + " micro-batches in flight");
    }
    state.updates = std::move(updates_);
    return Status::Ok();
  }

 public:

 private:
  bool Last(int stage) const { return stage == program_.shape.stages() - 1; }
  bool Here(int stage) const { return program_.shape.RankOf(stage) == comm_.rank(); }

  Status Missing(const Action& a, const char* what) const {
    return InvalidInput("pipeline rank " + std::to_string(comm_.rank()) + ", " + pipeline::ToString(a) + ": " + what +
                        " (does the program validate?)");
  }

  // The rs ops between the compute at `at` and the next compute: the units it makes final.
  Status ArmReduceScatters(const std::vector<Action>& list, size_t at) {
    std::vector<int> units;
    for (size_t i = at + 1; i < list.size() && !pipeline::IsCompute(list[i].kind); ++i) {
      if (list[i].kind == ActionKind::kReduceScatter) units.push_back(list[i].microbatch);
    }
    if (!units.empty()) options_.fsdp->FinalDuring(units);  // Run checked it is there
    return Status::Ok();
  }

  Status Step(const Action& a) {
    const int m = a.microbatch, s = a.stage;
    if (pipeline::IsFsdp(a.kind)) {  // the unit, not a micro-batch: no slot (Run checked fsdp is set)
      return a.kind == ActionKind::kGather ? options_.fsdp->StartGather(m) : options_.fsdp->StartReduceScatter(m);
    }
    if (a.kind == ActionKind::kUpdate) {  // U names a minibatch, not a micro-batch: no slot
      MW_RETURN_IF_ERROR(stages_.Update(s, m));
      ++updates_[s];
      return Status::Ok();
    }
    Slot& slot = slots_[{m, s}];
    switch (a.kind) {
      case ActionKind::kForward: {
        if (s > 0 && !slot.input.defined()) {
          // The previous stage ran here: its output, cut from its graph, is this stage's input.
          auto prev = slots_.find({m, s - 1});
          if (!Here(s - 1) || prev == slots_.end() || !prev->second.output.defined()) {
            return Missing(a, "its input was neither received nor computed here");
          }
          slot.input = prev->second.output.detach().requires_grad_(true);
        }
        if (m < 0 || m >= static_cast<int>(microbatches_.size())) return Missing(a, "no such micro-batch in this step");
        if (s == 0 && split_) {
          slot.embedded = stages_.FirstStageInput(microbatches_[static_cast<size_t>(m)]);
          if (slot.embedded.defined()) slot.input = slot.embedded.detach().requires_grad_(true);
        }
        slot.updates_at_forward = updates_[s];
        torch::Tensor out = stages_.Forward(s, microbatches_[static_cast<size_t>(m)], slot.input);
        if (Last(s)) {
          loss_sum_ += out.item<double>() / program_.shape.microbatches;
          out = out / static_cast<double>(program_.shape.microbatches);
        }
        slot.output = out;
        return Status::Ok();
      }
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput: {
        MW_RETURN_IF_ERROR(TakeOutputGrad(a, slot));
        if (a.kind == ActionKind::kBackward) {
          MW_RETURN_IF_ERROR(stages_.BeforeBackward(s, updates_[s] - slot.updates_at_forward));
          torch::autograd::backward({slot.output}, {slot.output_grad});
          MW_RETURN_IF_ERROR(stages_.AfterBackward(s));
          if (slot.input.defined()) slot.input_grad = slot.input.grad();
          slot.output = slot.output_grad = torch::Tensor();
        } else if (slot.input.defined()) {
          slot.input_grad = BackwardInput(slot.output, slot.output_grad, slot.input, stages_.Parameters(s), &slot.weight);
          slot.split = true;
        }
        return Status::Ok();
      }
      case ActionKind::kBackwardWeight: {
        if (!slot.output.defined() || !slot.output_grad.defined()) return Missing(a, "no I ran before it");
        if (slot.split) {
          BackwardWeight(slot.weight, slot.embedded, slot.embedded.defined() ? slot.input_grad : torch::Tensor());
          if (slot.embedded.defined()) slot.embedded = slot.input = slot.input_grad = torch::Tensor();
          slot.split = false;
        } else {
          // No input to split at (a first stage without FirstStageInput): the whole backward.
          torch::autograd::backward({slot.output}, {slot.output_grad}, /*retain_graph=*/false, /*create_graph=*/false,
                                    stages_.Parameters(s));
        }
        slot.output = slot.output_grad = torch::Tensor();
        return Status::Ok();
      }
      case ActionKind::kSendActivation: {
        if (!slot.output.defined()) return Missing(a, "no forward output to send");
        return Send(slot.output.detach().contiguous(), program_.shape.RankOf(s + 1));
      }
      case ActionKind::kSendGrad: {
        if (!slot.input_grad.defined()) return Missing(a, "no input gradient to send");
        torch::Tensor grad = slot.input_grad.contiguous();
        slot.input_grad = torch::Tensor();
        slot.input = torch::Tensor();
        return Send(grad, program_.shape.RankOf(s - 1));
      }
      case ActionKind::kRecvActivation: {
        MW_ASSIGN_OR_RETURN(torch::Tensor got, Recv(program_.shape.RankOf(s - 1)));
        slot.input = got.requires_grad_(true);
        return Status::Ok();
      }
      case ActionKind::kRecvGrad: {
        MW_ASSIGN_OR_RETURN(slot.output_grad, Recv(program_.shape.RankOf(s + 1)));
        return Status::Ok();
      }
      case ActionKind::kUpdate:
      case ActionKind::kGather:
      case ActionKind::kReduceScatter: break;  // above
    }
    return Missing(a, "an unknown action");
  }

  // The gradient of the slot's output: 1 for the last stage's (already scaled) loss; else what
  // was received, or the next stage's input gradient when that stage ran here.
  Status TakeOutputGrad(const Action& a, Slot& slot) {
    const int m = a.microbatch, s = a.stage;
    if (!slot.output.defined()) return Missing(a, "no forward ran before it");
    if (Last(s)) {
      slot.output_grad = torch::ones_like(slot.output);
    } else if (!slot.output_grad.defined()) {
      auto next = slots_.find({m, s + 1});
      if (!Here(s + 1) || next == slots_.end() || !next->second.input_grad.defined()) {
        return Missing(a, "the gradient of its output was neither received nor computed here");
      }
      slot.output_grad = next->second.input_grad;
      next->second.input_grad = next->second.input = torch::Tensor();
    }
    return Status::Ok();
  }

  Status Send(const torch::Tensor& t, int peer) {
    torch::Tensor share = SendShare(t, options_);
    MW_ASSIGN_OR_RETURN(auto work, comm_.Send(share, peer));
    sends_.emplace_back(std::move(work), std::move(share));
    return Status::Ok();
  }

  // The program's next options_.receives_ahead receives are kept posted ahead of their actions,
  // in program order (so the k-th from a peer still meets its k-th send): a transfer then runs
  // while the actions before its receive compute, instead of starting when the receive is reached.
  Status PostAhead(size_t ahead) {
    while (posted_.size() < ahead && next_receive_ < receives_.size()) {
      MW_ASSIGN_OR_RETURN(PostedReceive r, PostReceive(comm_, receives_[next_receive_], options_));
      posted_.push_back(std::move(r));
      ++next_receive_;
    }
    return Status::Ok();
  }

  size_t Ahead() const { return static_cast<size_t>(std::max(0, options_.receives_ahead)); }

  Result<torch::Tensor> Recv(int peer) {
    MW_RETURN_IF_ERROR(PostAhead(1));  // the one reached, where none was posted ahead
    if (posted_.front().peer != peer) {
      return Internal("pipeline rank " + std::to_string(comm_.rank()) + ": a receive from rank " +
                      std::to_string(peer) + " out of the program's order of receives");
    }
    PostedReceive r = std::move(posted_.front());
    posted_.pop_front();
    MW_RETURN_IF_ERROR(PostAhead(Ahead()));
    return FinishReceive(r, options_);
  }

  const pipeline::Program& program_;
  StageRunner& stages_;
  dist::Communicator& comm_;
  const std::vector<MicroBatch>& microbatches_;
  const PipelineStepOptions& options_;
  PipelineCarry* carry_;
  std::map<std::pair<int, int>, Slot> slots_;  // (micro-batch, stage)
  std::map<int, int> updates_;                 // stage -> its updates (asynchronous programs)
  Sends sends_;
  std::vector<int> receives_;          // the peer of each of this rank's receives, in program order
  size_t next_receive_ = 0;            // the first not yet posted
  std::deque<PostedReceive> posted_;   // posted, not yet reached
  double loss_sum_ = 0;  // the last stage's mean loss over the step, on its rank
  bool split_ = false;   // the program splits backwards into I and W
};

}  // namespace

Result<double> RunPipelineForward(const compiler::pipeline::Shape& shape, StageRunner& stages, dist::Communicator& comm,
                                  const MicroBatch& mb, const PipelineStepOptions& options) {
  MW_RETURN_IF_ERROR(CheckGroup(shape, comm));
  torch::NoGradGuard no_grad;
  const int rank = comm.rank();
  double loss = 0;
  torch::Tensor h;  // the activation of the last stage run here
  Sends sends;
  try {
    for (int s = 0; s < shape.stages(); ++s) {
      if (shape.RankOf(s) != rank) continue;
      if (s > 0 && shape.RankOf(s - 1) != rank) {
        MW_ASSIGN_OR_RETURN(h, ReceiveWhole(comm, shape.RankOf(s - 1), options));
      }
      torch::Tensor out = stages.Forward(s, mb, s == 0 ? torch::Tensor() : h);
      if (s == shape.stages() - 1) {
        loss = out.item<double>();
      } else {
        h = out.contiguous();
        if (shape.RankOf(s + 1) != rank) {
          torch::Tensor share = SendShare(h, options);
          MW_ASSIGN_OR_RETURN(auto send, comm.Send(share, shape.RankOf(s + 1)));
          sends.emplace_back(std::move(send), std::move(share));  // the tensor lives until its send is done
        }
      }
    }
  } catch (const c10::Error& e) {
    return Internal("pipeline forward on rank " + std::to_string(rank) + ": " + e.what_without_backtrace());
  }
  for (auto& [send, tensor] : sends) MW_RETURN_IF_ERROR(send->Wait());
  return SumOverGroup(comm, loss);
}

Result<PipelineStepResult> RunPipelineStep(const compiler::pipeline::Program& program, StageRunner& stages,
                                           dist::Communicator& comm, const std::vector<MicroBatch>& microbatches,
                                           const PipelineStepOptions& options, PipelineCarry* carry) {
  StepRun run(program, stages, comm, microbatches, options, carry);
  try {
    return run.Run();
  } catch (const c10::Error& e) {
    return Internal(std::string("pipeline step on rank ") + std::to_string(comm.rank()) + ": " +
                    e.what_without_backtrace());
  }
}

}  // namespace meshwork::pp
