// The pipeline executor against one process: the tiny Llama cut into stages over pp ranks (threads
// of this process, Gloo over loopback) runs each schedule's program (GPipe, 1F1B, interleaved
// 1F1B, ZB-H1), and its losses and every parameter's gradient after the step must equal those of
// the whole model on the same global batch (its micro-batches' gradients accumulated) within
// 1e-5, tied and untied embeddings, over three AdamW steps. A program that does not match the group is refused by name.
// Replicated activations (tensor parallelism without sequence parallelism) travel in shares.
// Receives are posted ahead of their place in the program (PipelineStepOptions::receives_ahead).
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/needs_gloo.h"
#include "tests/common/parallel_training.h"
#include "trainer/compiler/pipeline/generators.h"
#include "trainer/compiler/pipeline/program.h"
#include "trainer/dist/gloo_communicator.h"
#include "trainer/model/llama.h"
#include "trainer/pp/executor.h"
#include "trainer/pp/llama_stages.h"

namespace meshwork::pp {
namespace {

namespace pipeline = compiler::pipeline;

constexpr int64_t kSeq = 16;
constexpr int kSteps = 3;

model::LlamaConfig Config(bool tied) {
  model::LlamaConfig c = model::PresetConfig("tiny").value();
  c.tie_word_embeddings = tied;
  return c;
}

model::LlamaForCausalLM MakeModel(bool tied) {
  torch::manual_seed(11);
  model::LlamaForCausalLM m(Config(tied));
  m->InitWeights(0.2);
  return m;
}

// Step `step`'s global batch: tokens and next-token targets, [batch, kSeq] each.
MicroBatch GlobalBatch(int step, int64_t batch, int64_t vocab) {
  torch::manual_seed(500 + step);
  torch::Tensor seq = torch::randint(vocab, {batch, kSeq + 1}, torch::kInt64);
  return {seq.narrow(1, 0, kSeq).contiguous(), seq.narrow(1, 1, kSeq).contiguous()};
}

std::vector<MicroBatch> Split(const MicroBatch& b, int microbatches) {
  std::vector<MicroBatch> out;
  const int64_t rows = b.tokens.size(0) / microbatches;
  for (int m = 0; m < microbatches; ++m) {
    out.push_back({b.tokens.narrow(0, m * rows, rows).contiguous(), b.targets.narrow(0, m * rows, rows).contiguous()});
  }
  return out;
}

std::vector<torch::Tensor> DecayParams(model::LlamaForCausalLM& m, const std::vector<torch::Tensor>& held, bool decay) {
  std::vector<torch::Tensor> out;
  for (const auto& p : held) {
    if ((p.dim() >= 2) == decay) out.push_back(p);
  }
  (void)m;
  return out;
}

struct Case {
  pipeline::ScheduleKind kind;
  int pp;
  int virtual_stages;
  int microbatches;
  bool tied;
};

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  std::string name = pipeline::ScheduleName(info.param.kind);
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return name + "_pp" + std::to_string(info.param.pp) + "_v" + std::to_string(info.param.virtual_stages) + "_m" +
         std::to_string(info.param.microbatches) + (info.param.tied ? "_tied" : "_untied");
}

class PipelineExecutor : public testing::NeedsGloo<::testing::TestWithParam<Case>> {};

TEST_P(PipelineExecutor, LossesAndGradientsEqualOneProcess) {
  const Case c = GetParam();
  const pipeline::Shape shape{c.pp, c.virtual_stages, c.microbatches};
  auto compute = pipeline::Generate(c.kind, shape);
  ASSERT_TRUE(compute.ok()) << compute.status().message();
  auto program = pipeline::Lower(compute.value());
  ASSERT_TRUE(program.ok()) << program.status().message();
  ASSERT_TRUE(pipeline::Validate(program.value()).ok());
  const model::LlamaConfig config = Config(c.tied);
  const int64_t batch = 2 * c.microbatches;

  // One process: the whole model on the whole batch.
  model::LlamaForCausalLM reference = MakeModel(c.tied);
  std::vector<double> reference_losses;
  std::map<std::string, torch::Tensor> reference_grads;  // after the first step
  {
    auto all = reference->parameters();
    auto opt = testing::MakeOptimizer(DecayParams(reference, all, true), DecayParams(reference, all, false));
    for (int step = 0; step < kSteps; ++step) {
      // The global batch as the same micro-batches, their gradients accumulated in order (one
      // backward of the whole batch rounds differently, and AdamW turns 1e-7 into 1e-5 by step 3).
      opt.zero_grad();
      double loss = 0;
      for (const MicroBatch& mb : Split(GlobalBatch(step, batch, config.vocab_size), c.microbatches)) {
        torch::Tensor part = reference->Loss(mb.tokens, mb.targets) / static_cast<double>(c.microbatches);
        part.backward();
        loss += part.item<double>();
      }
      reference_losses.push_back(loss);
      if (step == 0) {
        for (const auto& item : reference->named_parameters()) reference_grads[item.key()] = item.value().grad().clone();
      }
      opt.step();
    }
  }

  // Models and batches before the threads: torch::manual_seed is global.
  auto cut = EvenCut(static_cast<int>(config.num_hidden_layers), shape.stages());
  ASSERT_TRUE(cut.ok()) << cut.status().message();
  std::vector<model::LlamaForCausalLM> models;
  std::vector<LlamaStages> stages;
  for (int r = 0; r < c.pp; ++r) {
    models.push_back(MakeModel(c.tied));
    auto made = LlamaStages::Create(models.back(), shape, cut.value(), r);
    ASSERT_TRUE(made.ok()) << made.status().message();
    stages.push_back(std::move(made).value());
    stages.back().ReleaseUnheld();
  }
  std::vector<std::vector<MicroBatch>> batches;
  for (int step = 0; step < kSteps; ++step) batches.push_back(Split(GlobalBatch(step, batch, config.vocab_size), c.microbatches));

  PipelineStepOptions options;
  options.activation_sizes = {batch / c.microbatches, kSeq, config.hidden_size};
  std::vector<std::vector<double>> losses(c.pp);
  std::vector<std::map<std::string, torch::Tensor>> grads(c.pp);
  std::vector<std::string> errors(c.pp);
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < c.pp; ++r) {
    threads.emplace_back([&, r] {
      dist::CommunicatorOptions o;
      o.timeout = std::chrono::seconds(60);
      o.group_name = "pp";
      auto comm = dist::MakeGlooCommunicator(store, r, c.pp, o, "127.0.0.1");
      if (!comm.ok()) {
        errors[r] = comm.status().ToString();
        return;
      }
      auto held = stages[r].HeldParameters();
      auto opt = testing::MakeOptimizer(DecayParams(models[r], held, true), DecayParams(models[r], held, false));
      for (int step = 0; step < kSteps; ++step) {
        opt.zero_grad();
        auto result = RunPipelineStep(program.value(), stages[r], **comm, batches[step], options);
        Status synced = result.ok() ? stages[r].SyncTiedGradients(**comm) : result.status();
        if (!synced.ok()) {
          errors[r] = synced.ToString();
          return;
        }
        losses[r].push_back(result->loss);
        if (step == 0) {
          for (const auto& item : models[r]->named_parameters()) {
            if (item.value().numel() > 0 && item.value().grad().defined()) grads[r][item.key()] = item.value().grad().clone();
          }
        }
        opt.step();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < c.pp; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;

  for (int r = 0; r < c.pp; ++r) {
    ASSERT_EQ(losses[r].size(), reference_losses.size());
    for (int step = 0; step < kSteps; ++step) {
      EXPECT_NEAR(losses[r][step], reference_losses[step], 1e-5) << "rank " << r << ", step " << step;
    }
  }
  // Every parameter's gradient is on the rank that holds it (the tied table on two), equal to
  // the whole model's.
  std::map<std::string, int> holders;
  for (int r = 0; r < c.pp; ++r) {
    for (const auto& [name, grad] : grads[r]) {
      ++holders[name];
      ASSERT_TRUE(reference_grads.count(name)) << name;
      const double diff = (grad - reference_grads[name]).abs().max().item<double>();
      EXPECT_LT(diff, 1e-5) << name << " on rank " << r;
    }
  }
  EXPECT_EQ(holders.size(), reference_grads.size()) << "a parameter no rank holds";
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, PipelineExecutor,
    ::testing::Values(Case{pipeline::ScheduleKind::kGPipe, 2, 1, 2, true},
                      Case{pipeline::ScheduleKind::k1F1B, 2, 1, 4, true},
                      Case{pipeline::ScheduleKind::k1F1B, 2, 1, 2, false},
                      Case{pipeline::ScheduleKind::kInterleaved1F1B, 2, 2, 4, true},
                      Case{pipeline::ScheduleKind::kZeroBubbleH1, 2, 1, 4, true},
                      Case{pipeline::ScheduleKind::kZeroBubbleH1, 2, 1, 2, false},
                      Case{pipeline::ScheduleKind::kGPipe, 1, 1, 2, true}),
    Name);

// `count` micro-batches of ToyStages' shape ([2, 3] tokens below 5), seeded from `seed`.
std::vector<MicroBatch> ToyBatches(int count, int seed) {
  std::vector<MicroBatch> batches;
  for (int m = 0; m < count; ++m) {
    torch::manual_seed(seed + m);
    batches.push_back({torch::randint(5, {2, 3}, torch::kInt64), torch::Tensor()});
  }
  return batches;
}

// Runs `body(rank, group)` on two threads, each with its end of a new two-rank Gloo group; each
// rank's error ("": none), from the group or from `body`.
std::vector<std::string> OnTwoRanks(
    const std::function<std::string(int rank, std::unique_ptr<dist::Communicator> group)>& body) {
  std::vector<std::string> errors(2);
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      dist::CommunicatorOptions o;
      o.timeout = std::chrono::seconds(60);
      auto gloo = dist::MakeGlooCommunicator(store, r, 2, o, "127.0.0.1");
      errors[r] = gloo.ok() ? body(r, std::move(gloo).value()) : gloo.status().ToString();
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Two stages of one weight each, the activation [2, 3, 4]: what tensor parallelism without
// sequence parallelism looks like to the executor (every tp rank computes the same activations).
class ToyStages final : public StageRunner {
 public:
  explicit ToyStages(int stage) : w_(torch::full({2, 3, 4}, 0.5 + stage).requires_grad_()) {}
  torch::Tensor Forward(int stage, const MicroBatch& mb, const torch::Tensor& input) override {
    if (stage == 0) return w_ * mb.tokens.to(torch::kFloat).unsqueeze(-1);
    return (torch::tanh(input) * w_).sum();
  }
  std::vector<torch::Tensor> Parameters(int) override { return {w_}; }
  const torch::Tensor& weight() const { return w_; }

 private:
  torch::Tensor w_;
};

class PipelineExecutorReplicas : public testing::NeedsGloo<> {};

// Two pipelines of two stages whose ranks hold the same activations (PipelineStepOptions::
// replicas): each rank sends half of every activation and gradient, the receiver gathers the
// other half from its replica, and the losses and gradients are those of whole sends.
TEST_F(PipelineExecutorReplicas, EachSendsItsShareAndTheStepIsTheSame) {
  const pipeline::Shape shape{2, 1, 2};
  auto program = pipeline::Lower(pipeline::Generate(pipeline::ScheduleKind::k1F1B, shape).value());
  ASSERT_TRUE(program.ok()) << program.status().message();
  const std::vector<MicroBatch> batches = ToyBatches(2, 40);
  struct Outcome {
    double loss = 0;
    torch::Tensor grad;
    int64_t sent = 0;
    std::string error;
  };
  // rank = 2 * pipeline + stage; the replicas of a stage are the two pipelines' ranks of it.
  auto run = [&](bool shares) {
    std::vector<Outcome> out(4);
    std::vector<c10::intrusive_ptr<c10d::Store>> pipe_stores{c10::make_intrusive<c10d::HashStore>(),
                                                             c10::make_intrusive<c10d::HashStore>()};
    std::vector<c10::intrusive_ptr<c10d::Store>> replica_stores{c10::make_intrusive<c10d::HashStore>(),
                                                                c10::make_intrusive<c10d::HashStore>()};
    std::vector<std::thread> threads;
    for (int r = 0; r < 4; ++r) {
      threads.emplace_back([&, r] {
        const int line = r / 2, stage = r % 2;
        dist::CommunicatorOptions o;
        o.timeout = std::chrono::seconds(60);
        o.group_name = "pp";
        auto pipe = dist::MakeGlooCommunicator(pipe_stores[line], stage, 2, o, "127.0.0.1");
        o.group_name = "tp";
        auto replicas = dist::MakeGlooCommunicator(replica_stores[stage], line, 2, o, "127.0.0.1");
        if (!pipe.ok() || !replicas.ok()) {
          out[r].error = "communicators";
          return;
        }
        ToyStages stages(stage);
        PipelineStepOptions options;
        options.activation_sizes = {2, 3, 4};
        if (shares) options.replicas = replicas->get();
        auto result = RunPipelineStep(program.value(), stages, **pipe, batches, options);
        if (!result.ok()) {
          out[r].error = result.status().ToString();
          return;
        }
        out[r].loss = result->loss;
        out[r].grad = stages.weight().grad().clone();
        out[r].sent = (*pipe)->stats().bytes_sent[static_cast<int>(dist::Collective::kSend)];
      });
    }
    for (auto& t : threads) t.join();
    return out;
  };
  const auto whole = run(false);
  const auto shared = run(true);
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(whole[r].error, "") << "rank " << r;
    ASSERT_EQ(shared[r].error, "") << "rank " << r;
    EXPECT_EQ(shared[r].loss, whole[r].loss) << "rank " << r;
    EXPECT_TRUE(torch::equal(shared[r].grad, whole[r].grad)) << "rank " << r;
    // Stage 0 sends two activations, stage 1 two gradients: 2 x 24 floats whole, half in shares.
    EXPECT_EQ(whole[r].sent, 2 * 24 * 4) << "rank " << r;
    EXPECT_EQ(shared[r].sent, 24 * 4) << "rank " << r;
  }
}

// Passes everything to a Gloo communicator and notes each receive it posts in `events`.
class NotingReceives final : public dist::Communicator {
 public:
  NotingReceives(std::unique_ptr<dist::Communicator> inner, std::vector<std::string>* events)
      : inner_(std::move(inner)), events_(events) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* backend() const override { return inner_->backend(); }
  const std::string& group_name() const override { return inner_->group_name(); }
  torch::Device device() const override { return inner_->device(); }
  Result<std::unique_ptr<dist::Work>> AllGatherInto(torch::Tensor out, torch::Tensor in) override {
    return inner_->AllGatherInto(out, in);
  }
  Result<std::unique_ptr<dist::Work>> ReduceScatter(torch::Tensor out, torch::Tensor in, dist::ReduceOp op) override {
    return inner_->ReduceScatter(out, in, op);
  }
  Result<std::unique_ptr<dist::Work>> AllReduce(torch::Tensor t, dist::ReduceOp op) override {
    return inner_->AllReduce(t, op);
  }
  Result<std::unique_ptr<dist::Work>> Broadcast(torch::Tensor t, int root) override { return inner_->Broadcast(t, root); }
  Result<std::unique_ptr<dist::Work>> Barrier() override { return inner_->Barrier(); }
  Result<std::unique_ptr<dist::Work>> Send(torch::Tensor t, int peer) override { return inner_->Send(t, peer); }
  Result<std::unique_ptr<dist::Work>> Recv(torch::Tensor t, int peer) override {
    events_->push_back("recv");
    return inner_->Recv(t, peer);
  }
  dist::CommStats stats() const override { return inner_->stats(); }

 private:
  std::unique_ptr<dist::Communicator> inner_;
  std::vector<std::string>* events_;
};

// ToyStages noting each forward in `events`.
class NotingForwards final : public StageRunner {
 public:
  NotingForwards(int stage, std::vector<std::string>* events) : toy_(stage), events_(events) {}
  torch::Tensor Forward(int stage, const MicroBatch& mb, const torch::Tensor& input) override {
    events_->push_back("F");
    return toy_.Forward(stage, mb, input);
  }
  std::vector<torch::Tensor> Parameters(int stage) override { return toy_.Parameters(stage); }
  const torch::Tensor& weight() const { return toy_.weight(); }

 private:
  ToyStages toy_;
  std::vector<std::string>* events_;
};

class PipelineExecutorReceives : public testing::NeedsGloo<> {};

// 1F1B over two stages and four micro-batches: with receives_ahead 1 the last stage posts its
// second micro-batch's receive before its first forward runs (so that transfer overlaps it); with
// 0 each receive is posted when the program reaches it. The step is the same either way.
TEST_F(PipelineExecutorReceives, ArePostedAheadOfTheirPlaceInTheProgram) {
  const pipeline::Shape shape{2, 1, 4};
  auto program = pipeline::Lower(pipeline::Generate(pipeline::ScheduleKind::k1F1B, shape).value());
  ASSERT_TRUE(program.ok()) << program.status().message();
  const std::vector<MicroBatch> batches = ToyBatches(4, 60);
  struct Outcome {
    std::vector<std::string> events;
    double loss = 0;
    torch::Tensor grad;
    std::string error;
  };
  auto run = [&](int ahead) {
    std::vector<Outcome> out(2);
    const auto errors = OnTwoRanks([&](int r, std::unique_ptr<dist::Communicator> group) {
      NotingReceives comm(std::move(group), &out[r].events);
      NotingForwards stages(r, &out[r].events);
      PipelineStepOptions options;
      options.activation_sizes = {2, 3, 4};
      options.receives_ahead = ahead;
      auto result = RunPipelineStep(program.value(), stages, comm, batches, options);
      if (!result.ok()) return result.status().ToString();
      out[r].loss = result->loss;
      out[r].grad = stages.weight().grad().clone();
      return std::string();
    });
    for (int r = 0; r < 2; ++r) out[r].error = errors[r];
    return out;
  };
  // The events up to the last stage's first forward.
  auto before_first_forward = [](const std::vector<std::string>& events) {
    std::vector<std::string> head;
    for (const auto& e : events) {
      if (e == "F") break;
      head.push_back(e);
    }
    return head;
  };
  const auto ahead = run(1);
  const auto in_place = run(0);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(ahead[r].error, "") << "rank " << r;
    ASSERT_EQ(in_place[r].error, "") << "rank " << r;
    EXPECT_EQ(ahead[r].loss, in_place[r].loss) << "rank " << r;
    EXPECT_TRUE(torch::equal(ahead[r].grad, in_place[r].grad)) << "rank " << r;
    // Each stage receives four times (activations on the last, gradients on the first).
    EXPECT_EQ(std::count(ahead[r].events.begin(), ahead[r].events.end(), "recv"), 4) << "rank " << r;
  }
  EXPECT_EQ(before_first_forward(ahead[1].events), (std::vector<std::string>{"recv", "recv"}));
  EXPECT_EQ(before_first_forward(in_place[1].events), (std::vector<std::string>{"recv"}));
}

// FSDP's ops as the program places them, noted in the same list as the forwards.
class NotingFsdpOps final : public FsdpOps {
 public:
  explicit NotingFsdpOps(std::vector<std::string>* events) : events_(events) {}
  Status StartGather(int unit) override {
    events_->push_back("ag" + std::to_string(unit));
    return Status::Ok();
  }
  void FinalDuring(const std::vector<int>& units) override {
    std::string text = "final";
    for (int u : units) text += " " + std::to_string(u);
    events_->push_back(text);
  }
  Status StartReduceScatter(int unit) override {
    events_->push_back("rs" + std::to_string(unit));
    return Status::Ok();
  }

 private:
  std::vector<std::string>* events_;
};

class PipelineExecutorFsdp : public testing::NeedsGloo<> {};

// 1F1B over two stages and two micro-batches with two units on each rank: the gathers run before
// the first forward, the last backward is told both units become final during it (the later unit
// first), and then each rs op is run; a step with FSDP ops and no FsdpOps is refused by name.
TEST_F(PipelineExecutorFsdp, RunsTheProgramsOpsAndArmsTheLastBackward) {
  const pipeline::Shape shape{2, 1, 2};
  auto lowered = pipeline::Lower(pipeline::Generate(pipeline::ScheduleKind::k1F1B, shape).value());
  ASSERT_TRUE(lowered.ok()) << lowered.status().message();
  auto program = pipeline::PlaceFsdp(*lowered, {{{0, true}, {0, true}}, {{1, true}, {1, true}}});
  ASSERT_TRUE(program.ok()) << program.status().message();
  const std::vector<MicroBatch> batches = ToyBatches(2, 70);
  std::vector<std::vector<std::string>> events(2);
  std::vector<std::string> unarmed(2);
  const auto errors = OnTwoRanks([&](int r, std::unique_ptr<dist::Communicator> group) {
    NotingForwards stages(r, &events[r]);
    NotingFsdpOps ops(&events[r]);
    PipelineStepOptions options;
    options.activation_sizes = {2, 3, 4};
    options.fsdp = &ops;
    auto result = RunPipelineStep(*program, stages, *group, batches, options);
    // Without FsdpOps: refused before any receive is posted.
    options.fsdp = nullptr;
    auto refused = RunPipelineStep(*program, stages, *group, batches, options);
    unarmed[r] = refused.ok() ? "ran" : refused.status().ToString();
    return result.ok() ? std::string() : result.status().ToString();
  });
  const std::vector<std::string> expected = {"ag0", "ag1", "F", "F", "final 1 0", "rs1", "rs0"};
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(events[r], expected) << "rank " << r;
    EXPECT_NE(unarmed[r].find("ag0@" + std::to_string(r) + ": an FSDP op, but the step runs without FSDP"),
              std::string::npos)
        << unarmed[r];
  }
}

TEST(StageCut, FlopBalancedGivesTheHeadsStageFewerLayers) {
  // llama-100m: a 32000-word head weighs several decoder layers, so the last of two stages takes
  // fewer layers; the tiny model's 320-word head weighs little, and its four layers split evenly.
  const model::LlamaConfig big = model::PresetConfig("llama-100m").value();
  auto cut = FlopBalancedCut(big, 256, 2, /*head_recomputes=*/true);
  ASSERT_TRUE(cut.ok()) << cut.status().message();
  ASSERT_EQ(cut->size(), 3u);
  EXPECT_EQ(cut->front(), 0);
  EXPECT_EQ(cut->back(), big.num_hidden_layers);
  EXPECT_GT((*cut)[1], big.num_hidden_layers / 2) << "the head's stage should hold fewer layers";
  auto even = FlopBalancedCut(model::PresetConfig("tiny").value(), 256, 2, true);
  ASSERT_TRUE(even.ok());
  EXPECT_EQ(even.value(), (std::vector<int>{0, 2, 4}));
  auto too_many = FlopBalancedCut(model::PresetConfig("tiny").value(), 256, 5, true);
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("4 decoder layers cannot make 5 stages"), std::string::npos)
      << too_many.status().message();
}

class PipelineExecutorInput : public testing::NeedsGloo<> {};

TEST_F(PipelineExecutorInput, AProgramForAnotherShapeIsRefusedByName) {
  const pipeline::Shape shape{2, 1, 2};
  auto program = pipeline::Lower(pipeline::GPipe(shape));
  ASSERT_TRUE(program.ok());
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto comm = dist::MakeGlooCommunicator(store, 0, 1, {}, "127.0.0.1");
  ASSERT_TRUE(comm.ok());
  model::LlamaForCausalLM m = MakeModel(true);
  auto stages = LlamaStages::Create(m, {1, 1, 2}, {0, 4}, 0);
  ASSERT_TRUE(stages.ok());
  auto result = RunPipelineStep(program.value(), stages.value(), **comm, {}, {});
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(result.status().message().find("pipeline program for pp=2 on a group of 1 ranks"), std::string::npos)
      << result.status().message();
  auto bad_cut = LlamaStages::Create(m, shape, {0, 4, 4}, 0);
  ASSERT_FALSE(bad_cut.ok());
  EXPECT_NE(bad_cut.status().message().find("the stage cut [0,4,4] does not split 4 decoder layers into 2 non-empty runs"),
            std::string::npos)
      << bad_cut.status().message();
}

}  // namespace
}  // namespace meshwork::pp
