// Training checkpoints on one process: save and resume restore parameters and AdamW state
// exactly, `latest` moves only once a checkpoint is complete, keep-N pruning, and every
// mismatched or damaged checkpoint is an error naming what differs and where.
#include "trainer/train/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <filesystem>
#include <sstream>

#include <unistd.h>

#include "common/file.h"
#include "trainer/data/token_file.h"
#include "trainer/io/safetensors.h"
#include "tests/common/temp_dir.h"
#include "trainer/model/compat.h"
#include "trainer/model/llama.h"
#include "trainer/train/adamw.h"
#include "trainer/train/engine.h"
#include "trainer/train/trainer.h"

namespace meshwork::train {
namespace {

namespace fs = std::filesystem;
using meshwork::testing::ReadBytes;
using meshwork::testing::TempDir;
using meshwork::testing::WriteBytes;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

model::LlamaConfig SmallDims() {
  model::LlamaConfig d;
  d.vocab_size = 64;
  d.hidden_size = 32;
  d.intermediate_size = 48;
  d.num_hidden_layers = 2;
  d.num_attention_heads = 4;
  d.num_key_value_heads = 2;
  d.max_position_embeddings = 64;
  return d;
}

// One process's training state, built as the trainer builds it.
struct TrainingState {
  config::TrainConfig cfg;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<AdamW> optimizer;
  std::unique_ptr<Checkpointer> checkpointer;
};

TrainingState MakeRun(const std::string& dir, uint64_t seed, model::LlamaConfig dims = SmallDims(), int64_t keep = 2,
            const std::string& resume = "auto", bool async = false) {
  TrainingState r;
  r.cfg.model.dims = dims;
  r.cfg.checkpoint.async = async;
  r.cfg.checkpoint.dir = dir;
  r.cfg.checkpoint.keep = keep;
  r.cfg.checkpoint.resume = *ParseName(config::kResumeNames, resume);
  torch::manual_seed(seed);
  model::LlamaForCausalLM net(dims);
  net->InitWeights(0.02);
  r.engine = MakeLocalEngine(std::move(net));
  std::vector<AdamWGroup> groups;
  groups.push_back({r.engine->DecayParams(), 0.1});
  groups.push_back({r.engine->NoDecayParams(), 0.0});
  r.optimizer = std::make_unique<AdamW>(std::move(groups), AdamWOptions{1e-2, 0.9, 0.999, 1e-8, {}});
  r.checkpointer = std::make_unique<Checkpointer>(r.cfg.checkpoint, *r.engine, *r.optimizer,
                                                  RunMeta(r.cfg, dims, *r.engine));
  return r;
}

// One optimizer step on tokens that depend only on `step`.
void Step(TrainingState& r, int64_t step) {
  torch::manual_seed(static_cast<uint64_t>(1000 + step));
  torch::Tensor tokens = torch::randint(0, r.cfg.model.dims.vocab_size, {2, 9}, torch::kLong);
  r.engine->ZeroGrad();
  r.engine->Loss(tokens.narrow(1, 0, 8), tokens.narrow(1, 1, 8), true).backward();
  r.optimizer->Step();
}

void ExpectSameParams(const TrainingState& a, const TrainingState& b) {
  const auto pa = a.engine->LocalParams(), pb = b.engine->LocalParams();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].first, pb[i].first);
    EXPECT_TRUE(torch::equal(pa[i].second, pb[i].second)) << pa[i].first;
  }
}

std::string LatestText(const std::string& dir) { return ReadBytes(dir + "/latest"); }

TEST(Checkpoint, ResumeRestoresParametersAndAdamWStateBitForBit) {
  TempDir tmp;
  const std::string dir = tmp.File("ckpt");
  TrainingState a = MakeRun(dir, 1);
  for (int64_t s = 0; s < 3; ++s) Step(a, s);
  ASSERT_TRUE(a.checkpointer->Save(3).ok());
  EXPECT_TRUE(fs::exists(dir + "/step-00000003/rank-00000.safetensors"));
  EXPECT_TRUE(fs::exists(dir + "/step-00000003/meta.json"));
  EXPECT_EQ(LatestText(dir), "step-00000003\n");
  EXPECT_FALSE(meshwork::testing::AnyNameContains(dir + "/step-00000003", ".tmp"));

  TrainingState b = MakeRun(dir, 2);  // other initial weights, no optimizer state
  auto point = b.checkpointer->Resume();
  ASSERT_TRUE(point.ok()) << point.status().ToString();
  EXPECT_EQ(point->step, 3);
  EXPECT_EQ(point->step_dir, dir + "/step-00000003");
  ExpectSameParams(a, b);
  // The next steps agree exactly only if the moments and step counts came back too (AdamW's
  // bias correction depends on the step count).
  for (int64_t s = 3; s < 5; ++s) {
    Step(a, s);
    Step(b, s);
  }
  ExpectSameParams(a, b);
}

// checkpoint.async: the save copies the state at its step; the updates after it, made while the
// thread writes, are not in the file; Finish commits it, and a resume gets that step's state.
TEST(Checkpoint, AsyncSaveHoldsTheStateOfItsStepAndResumesBitForBit) {
  TempDir tmp;
  const std::string dir = tmp.File("ckpt");
  TrainingState a = MakeRun(dir, 1, SmallDims(), 2, "auto", /*async=*/true);
  for (int64_t s = 0; s < 3; ++s) Step(a, s);
  std::vector<torch::Tensor> at_save;
  for (const auto& [name, t] : a.engine->LocalParams()) at_save.push_back(t.detach().clone());
  ASSERT_TRUE(a.checkpointer->Save(3).ok());
  EXPECT_GT(a.checkpointer->last_stall_seconds(), 0.0);
  Step(a, 3);  // while the thread may still be writing
  ASSERT_TRUE(a.checkpointer->Finish().ok());
  EXPECT_EQ(LatestText(dir), "step-00000003\n");
  EXPECT_TRUE(a.checkpointer->Finish().ok());  // nothing in flight: a no-op

  TrainingState b = MakeRun(dir, 2);
  auto point = b.checkpointer->Resume();
  ASSERT_TRUE(point.ok()) << point.status().ToString();
  EXPECT_EQ(point->step, 3);
  const auto params = b.engine->LocalParams();
  ASSERT_EQ(params.size(), at_save.size());
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i].second, at_save[i])) << params[i].first;
  Step(b, 3);
  ExpectSameParams(a, b);  // the moments and step counts came back too
}

// A second save waits for the first; both end complete, `latest` on the second.
TEST(Checkpoint, AsyncSecondSaveWaitsForTheFirst) {
  TempDir tmp;
  const std::string dir = tmp.File("ckpt");
  TrainingState a = MakeRun(dir, 1, SmallDims(), 3, "auto", /*async=*/true);
  Step(a, 0);
  ASSERT_TRUE(a.checkpointer->Save(1).ok());
  Step(a, 1);
  ASSERT_TRUE(a.checkpointer->Save(2).ok());  // commits the first before it starts
  EXPECT_TRUE(fs::exists(dir + "/step-00000001/rank-00000.safetensors.sum"));
  ASSERT_TRUE(a.checkpointer->Finish().ok());
  EXPECT_EQ(LatestText(dir), "step-00000002\n");
  for (const char* d : {"/step-00000001", "/step-00000002"}) {
    EXPECT_TRUE(fs::exists(dir + d + "/rank-00000.safetensors.sum")) << d;
    EXPECT_FALSE(meshwork::testing::AnyNameContains(dir + d, ".tmp")) << d;
  }
}

// The chain a restarted gang goes through (on CUDA it once crashed at the second save): resume,
// train, save again, and a third run resumes from that save and still matches step for step.
TEST(Checkpoint, ResumedRunSavesAgainAndThatSaveResumesExactly) {
  TempDir tmp;
  const std::string dir = tmp.File("ckpt");
  TrainingState a = MakeRun(dir, 1);
  for (int64_t s = 0; s < 2; ++s) Step(a, s);
  ASSERT_TRUE(a.checkpointer->Save(2).ok());

  TrainingState b = MakeRun(dir, 2);
  ASSERT_TRUE(b.checkpointer->Resume().ok());
  for (int64_t s = 2; s < 4; ++s) {
    Step(a, s);
    Step(b, s);
  }
  ASSERT_TRUE(b.checkpointer->Save(4).ok());
  EXPECT_EQ(LatestText(dir), "step-00000004\n");

  TrainingState c = MakeRun(dir, 3);
  auto point = c.checkpointer->Resume();
  ASSERT_TRUE(point.ok()) << point.status().ToString();
  EXPECT_EQ(point->step, 4);
  ExpectSameParams(a, c);
  for (int64_t s = 4; s < 6; ++s) {
    Step(a, s);
    Step(c, s);
  }
  ExpectSameParams(a, c);
}

// A checkpoint taken before the first optimizer step has no AdamW state; resuming it clears any
// state the resuming optimizer had, as a fresh run's would be.
TEST(Checkpoint, ParametersWithoutAdamWStateResumeWithout) {
  TempDir tmp;
  const std::string dir = tmp.File("ckpt");
  TrainingState a = MakeRun(dir, 1);
  ASSERT_TRUE(a.checkpointer->Save(1).ok());
  TrainingState b = MakeRun(dir, 2);
  Step(b, 0);
  ASSERT_TRUE(b.optimizer->HasState());
  ASSERT_TRUE(b.checkpointer->Resume().ok());
  EXPECT_FALSE(b.optimizer->HasState());
  ExpectSameParams(a, b);
  Step(a, 1);
  Step(b, 1);
  ExpectSameParams(a, b);
}

// The shard file is a safetensors file any reader can check: each piece flattened, named
// "<param>@<begin>", its moments beside it, and the header's metadata giving the whole shape, the
// offset, the AdamW step and a checksum per tensor.
TEST(Checkpoint, ShardFileHoldsPiecesWithOffsetsAndAdamWState) {
  TempDir tmp;
  const std::string dir = tmp.File("ckpt");
  TrainingState a = MakeRun(dir, 1);
  for (int64_t s = 0; s < 3; ++s) Step(a, s);
  ASSERT_TRUE(a.checkpointer->Save(3).ok());
  const std::string file = dir + "/step-00000003/rank-00000.safetensors";
  auto header = io::ReadSafetensorsHeader(file);
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  EXPECT_EQ(header->metadata.at("format"), "meshwork-shards");
  EXPECT_EQ(header->metadata.at("step"), "3");
  auto tensors = io::ReadSafetensors(file);
  ASSERT_TRUE(tensors.ok());
  const auto pieces = a.engine->LocalShards();
  ASSERT_FALSE(pieces.empty());
  const ShardPiece& first = pieces.front();
  EXPECT_EQ(first.begin, 0);
  const std::string key = first.name + "@0";
  ASSERT_EQ(tensors->count(key), 1u);
  EXPECT_TRUE(torch::equal(tensors->at(key), first.value.reshape({-1})));
  const AdamWParamState* state = a.optimizer->State(first.value);
  ASSERT_NE(state, nullptr);
  EXPECT_TRUE(torch::equal(tensors->at(key + "/exp_avg"), state->exp_avg.reshape({-1})));
  const std::string described = header->metadata.at("pieces");
  EXPECT_THAT(described, HasSubstr("\"key\":\"" + key + "\""));
  EXPECT_THAT(described, HasSubstr("\"adamw_step\":3"));
  EXPECT_EQ(tensors->size(), 3 * pieces.size());  // value and two moments each
}

// The loader on its own: pieces saved as one split of each parameter fill another split, moments
// and all, reading only the pieces that overlap; a missing piece and another shape are named.
TEST(Checkpoint, ShardsSavedAsHalvesLoadAsThirds) {
  TempDir tmp;
  const std::string dir = tmp.path();
  torch::manual_seed(3);
  const torch::Tensor w = torch::randn({6, 5}), b = torch::randn({7});
  auto split = [](const std::string& name, const torch::Tensor& full, int parts, int part) {
    const int64_t n = full.numel(), size = (n + parts - 1) / parts, begin = std::min(n, part * size);
    const int64_t end = std::min(n, begin + size);
    return ShardPiece{name, full.sizes().vec(), begin, full.reshape({-1}).narrow(0, begin, end - begin).clone()};
  };
  CheckpointMeta saved;
  saved.step = 5;
  saved.world_size = 2;
  for (int r = 0; r < 2; ++r) {
    std::vector<ShardPiece> mine = {split("w", w, 2, r), split("b", b, 2, r)};
    std::vector<AdamWGroup> groups{{{mine[0].value, mine[1].value}, 0.0}};
    AdamW opt(groups, AdamWOptions{1e-2, 0.9, 0.999, 1e-8, {}});
    for (auto& p : mine) opt.SetState(p.value, AdamWParamState{5, p.value * 2, p.value * 3});
    saved.files.push_back(ShardFileName(r));
    ASSERT_TRUE(SaveShardFile(dir + "/" + ShardFileName(r), 5, mine, opt).ok());
  }
  for (int r = 0; r < 3; ++r) {
    std::vector<ShardPiece> mine = {split("w", torch::zeros({6, 5}), 3, r), split("b", torch::zeros({7}), 3, r)};
    std::vector<AdamWGroup> groups{{{mine[0].value, mine[1].value}, 0.0}};
    AdamW opt(groups, AdamWOptions{1e-2, 0.9, 0.999, 1e-8, {}});
    auto report = LoadShards(dir, saved, mine, opt);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    // The first and last thirds lie within one half each: one file is read, not both.
    if (r != 1) {
      EXPECT_EQ(report->files_read, 1) << "rank " << r;
    }
    for (const auto& [p, full] : {std::pair{mine[0], w}, std::pair{mine[1], b}}) {
      const torch::Tensor want = full.reshape({-1}).narrow(0, p.begin, p.value.numel());
      EXPECT_TRUE(torch::equal(p.value, want)) << p.name << " rank " << r;
      const AdamWParamState* st = opt.State(p.value);
      ASSERT_NE(st, nullptr);
      EXPECT_EQ(st->step, 5);
      EXPECT_TRUE(torch::equal(st->exp_avg, want * 2));
      EXPECT_TRUE(torch::equal(st->exp_avg_sq, want * 3));
    }
  }
  std::vector<ShardPiece> other = {ShardPiece{"w", {5, 6}, 0, torch::zeros({30})}};
  std::vector<AdamWGroup> groups{{{other[0].value}, 0.0}};
  AdamW opt(groups, AdamWOptions{1e-2, 0.9, 0.999, 1e-8, {}});
  auto shape = LoadShards(dir, saved, other, opt);
  EXPECT_EQ(shape.status().code(), StatusCode::kInvalidInput);
  EXPECT_THAT(shape.status().message(), HasSubstr("tensor 'w' has shape [6, 5], this model's is [5, 6]"));
  std::vector<ShardPiece> absent = {ShardPiece{"c", {4}, 0, torch::zeros({4})}};
  auto missing = LoadShards(dir, saved, absent, opt);
  EXPECT_THAT(missing.status().message(), HasSubstr("has no tensor 'c'"));
  fs::remove(dir + "/" + ShardFileName(1));
  fs::remove(dir + "/" + ShardFileName(1) + ".sum");
  saved.files = {ShardFileName(0)};
  std::vector<ShardPiece> whole = {ShardPiece{"b", {7}, 0, torch::zeros({7})}};
  auto gap = LoadShards(dir, saved, whole, opt);
  EXPECT_THAT(gap.status().message(), HasSubstr("holds no file with elements [4, 7) of tensor 'b'"));
}

// Tensor parallelism: a tp rank's slice of a column-split parameter is a column block (every
// row, some columns), and FSDP shards it as runs of the block flattened. Saved as 2 tp ranks x 2
// FSDP shards, it loads as runs of the whole (no tp), as 4 narrower blocks (tp 4) and as an odd
// run of a block; a missing file names the row and column no file holds.
TEST(Checkpoint, ColumnBlocksLoadAsRunsAndAsOtherBlocks) {
  TempDir tmp;
  const std::string dir = tmp.path();
  torch::manual_seed(5);
  const torch::Tensor w = torch::randn({6, 8});
  // Columns [c0, c0 + cols) of w flattened, elements [begin, end).
  auto block = [&](const torch::Tensor& full, int64_t c0, int64_t cols, int64_t begin, int64_t end) {
    ShardPiece p{"w", {6, 8}, begin, full.narrow(1, c0, cols).contiguous().reshape({-1}).narrow(0, begin, end - begin).clone()};
    p.col_begin = c0;
    p.cols = cols;
    return p;
  };
  CheckpointMeta saved;
  saved.step = 2;
  saved.world_size = 4;
  for (int r = 0; r < 4; ++r) {
    const int tp = r % 2, shard = r / 2;  // tp innermost
    std::vector<ShardPiece> mine = {block(w, 4 * tp, 4, 12 * shard, 12 * shard + 12)};
    std::vector<AdamWGroup> groups{{{mine[0].value}, 0.0}};
    AdamW opt(groups, AdamWOptions{1e-2, 0.9, 0.999, 1e-8, {}});
    opt.SetState(mine[0].value, AdamWParamState{2, mine[0].value * 2, mine[0].value * 3});
    saved.files.push_back(ShardFileName(r));
    ASSERT_TRUE(SaveShardFile(dir + "/" + ShardFileName(r), 2, mine, opt).ok());
  }
  // Loads `mine` and checks each piece against w's elements it addresses.
  auto load = [&](std::vector<ShardPiece> mine) {
    std::vector<torch::Tensor> values;
    for (auto& p : mine) values.push_back(p.value);
    std::vector<AdamWGroup> groups{{values, 0.0}};
    AdamW opt(groups, AdamWOptions{1e-2, 0.9, 0.999, 1e-8, {}});
    auto report = LoadShards(dir, saved, mine, opt);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    for (size_t i = 0; i < mine.size(); ++i) {
      const ShardPiece& p = mine[i];
      const torch::Tensor source = p.cols > 0 ? w.narrow(1, p.col_begin, p.cols).contiguous().reshape({-1}) : w.reshape({-1});
      const torch::Tensor right = source.narrow(0, p.begin, p.value.numel());
      EXPECT_TRUE(torch::equal(p.value, right)) << "piece " << i << ": " << p.value << " want " << right;
      const AdamWParamState* st = opt.State(p.value);
      ASSERT_NE(st, nullptr);
      EXPECT_EQ(st->step, 2);
      EXPECT_TRUE(torch::equal(st->exp_avg, right * 2));
      EXPECT_TRUE(torch::equal(st->exp_avg_sq, right * 3));
    }
  };
  const torch::Tensor zeros = torch::zeros({6, 8});
  auto run = [&](int64_t begin, int64_t end) {
    return ShardPiece{"w", {6, 8}, begin, zeros.reshape({-1}).narrow(0, begin, end - begin).clone()};
  };
  load({run(0, 16), run(16, 32), run(32, 48)});  // FSDP over 3, no tp
  load({block(zeros, 0, 2, 0, 12), block(zeros, 2, 2, 0, 12), block(zeros, 4, 2, 0, 12), block(zeros, 6, 2, 0, 12)});  // tp 4
  load({block(zeros, 4, 4, 5, 17), run(7, 8)});  // an odd run of a block; one element
  fs::remove(dir + "/" + ShardFileName(3));
  fs::remove(dir + "/" + ShardFileName(3) + ".sum");
  saved.files.pop_back();
  std::vector<ShardPiece> whole = {run(0, 48)};
  std::vector<AdamWGroup> groups{{{whole[0].value}, 0.0}};
  AdamW opt(groups, AdamWOptions{1e-2, 0.9, 0.999, 1e-8, {}});
  auto gap = LoadShards(dir, saved, whole, opt);
  EXPECT_EQ(gap.status().code(), StatusCode::kInvalidInput);
  // Rank 3 held tp 1's columns 4-7 of rows 3-5.
  EXPECT_THAT(gap.status().message(), HasSubstr("holds no file with row 3, column 4 of tensor 'w'"));
}

// Files of format 1 (libtorch's optimizer archive inside) still resume exactly.
TEST(Checkpoint, FormatOneFilesStillResume) {
  TempDir tmp;
  const std::string dir = tmp.File("ckpt");
  TrainingState a = MakeRun(dir, 1);
  for (int64_t s = 0; s < 3; ++s) Step(a, s);
  ASSERT_TRUE(a.checkpointer->Save(3).ok());
  // Rewrite the rank file as format 1 wrote it, with a matching checksum file.
  const std::string file = dir + "/step-00000003/rank-00000.pt";
  {
    torch::serialize::OutputArchive archive;
    archive.write("format_version", torch::tensor(int64_t{1}));
    archive.write("step", torch::tensor(int64_t{3}));
    std::string names;
    const auto params = a.engine->LocalParams();
    for (const auto& [name, tensor] : params) names += name + "\n";
    archive.write("param_names", c10::IValue(names));
    for (size_t i = 0; i < params.size(); ++i) archive.write("param/" + std::to_string(i), params[i].second.detach());
    // libtorch's own AdamW over the same groups, holding a's state, wrote the optimizer archive.
    std::vector<torch::optim::OptimizerParamGroup> groups;
    for (const AdamWGroup& g : a.optimizer->groups()) {
      groups.emplace_back(g.params, std::make_unique<torch::optim::AdamWOptions>(
                                        torch::optim::AdamWOptions(1e-2).weight_decay(g.weight_decay)));
    }
    torch::optim::AdamW libtorch(groups, torch::optim::AdamWOptions(1e-2));
    for (const auto& [name, param] : params) {
      const AdamWParamState* s = a.optimizer->State(param);
      if (s == nullptr) continue;
      auto st = std::make_unique<torch::optim::AdamWParamState>();
      st->step(s->step);
      st->exp_avg(s->exp_avg.clone());
      st->exp_avg_sq(s->exp_avg_sq.clone());
      libtorch.state()[compat::OptimizerStateKey(libtorch.state(), param)] = std::move(st);
    }
    torch::serialize::OutputArchive optimizer_archive(archive.compilation_unit());
    libtorch.save(optimizer_archive);
    archive.write("optimizer", optimizer_archive);
    archive.save_to(file);
  }
  ASSERT_TRUE(WriteChecksumFile(file).ok());
  // ... and meta.json as format 2 names its files.
  auto meta = ReadMeta(dir + "/step-00000003");
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  meta->format_version = 2;
  meta->files = {"rank-00000.pt"};
  WriteBytes(dir + "/step-00000003/meta.json", MetaToJson(*meta));

  TrainingState b = MakeRun(dir, 2);
  auto point = b.checkpointer->Resume();
  ASSERT_TRUE(point.ok()) << point.status().ToString();
  ExpectSameParams(a, b);
  for (int64_t s = 3; s < 5; ++s) {
    Step(a, s);
    Step(b, s);
  }
  ExpectSameParams(a, b);
}

TEST(Checkpoint, LatestMovesOnlyAfterACheckpointIsComplete) {
  TempDir tmp;
  const std::string dir = tmp.File("ckpt");
  TrainingState a = MakeRun(dir, 1);
  Step(a, 0);
  ASSERT_TRUE(a.checkpointer->Save(1).ok());
  Step(a, 1);
  // Files of step 2 written (as by ranks that got that far before a crash), never committed.
  ASSERT_TRUE(a.checkpointer->WriteFiles(2).ok());
  EXPECT_TRUE(fs::exists(dir + "/step-00000002/rank-00000.safetensors"));
  EXPECT_EQ(LatestText(dir), "step-00000001\n");

  TrainingState b = MakeRun(dir, 2);
  auto point = b.checkpointer->Resume();
  ASSERT_TRUE(point.ok()) << point.status().ToString();
  EXPECT_EQ(point->step, 1);

  ASSERT_TRUE(a.checkpointer->Commit(2).ok());
  EXPECT_EQ(LatestText(dir), "step-00000002\n");
}

TEST(Checkpoint, SavingAgainClearsThisRanksTemporaryFilesFromAKilledAttempt) {
  TempDir tmp;
  const std::string dir = tmp.File("ckpt");
  WriteBytes(dir + "/step-00000001/rank-00000.pt.tmp.99999", "partial");
  WriteBytes(dir + "/step-00000001/meta.json.tmp.99999", "{");
  WriteBytes(dir + "/step-00000001/rank-00001.pt.tmp.99999", "another rank's");
  TrainingState a = MakeRun(dir, 1);
  Step(a, 0);
  ASSERT_TRUE(a.checkpointer->Save(1).ok());
  EXPECT_FALSE(fs::exists(dir + "/step-00000001/rank-00000.pt.tmp.99999"));
  EXPECT_FALSE(fs::exists(dir + "/step-00000001/meta.json.tmp.99999"));
  EXPECT_TRUE(fs::exists(dir + "/step-00000001/rank-00001.pt.tmp.99999"));
  EXPECT_TRUE(fs::exists(dir + "/step-00000001/rank-00000.safetensors"));
}

TEST(Checkpoint, KeepsTheNewestCompleteCheckpointsAndDeletesOlderOnes) {
  TempDir tmp;
  const std::string dir = tmp.File("ckpt");
  TrainingState a = MakeRun(dir, 1, SmallDims(), /*keep=*/2);
  Step(a, 0);
  ASSERT_TRUE(a.checkpointer->Save(1).ok());
  ASSERT_TRUE(a.checkpointer->Save(2).ok());
  EXPECT_TRUE(fs::exists(dir + "/step-00000001"));
  // Debris of a crashed save older than the next checkpoint, and an unfinished later one.
  WriteBytes(dir + "/step-00000003/rank-00000.pt.tmp.123", "partial");
  WriteBytes(dir + "/step-00000009/rank-00000.pt.tmp.123", "partial");
  ASSERT_TRUE(a.checkpointer->Save(4).ok());
  EXPECT_FALSE(fs::exists(dir + "/step-00000001"));
  EXPECT_TRUE(fs::exists(dir + "/step-00000002"));
  EXPECT_FALSE(fs::exists(dir + "/step-00000003"));
  EXPECT_TRUE(fs::exists(dir + "/step-00000004"));
  EXPECT_TRUE(fs::exists(dir + "/step-00000009"));  // later than `latest`: rewritten when reached
  ASSERT_TRUE(a.checkpointer->Save(5).ok());
  EXPECT_FALSE(fs::exists(dir + "/step-00000002"));
  EXPECT_TRUE(fs::exists(dir + "/step-00000004"));
  EXPECT_TRUE(fs::exists(dir + "/step-00000005"));
}

TEST(Checkpoint, KeepOneLeavesOnlyTheLatest) {
  TempDir tmp;
  const std::string dir = tmp.File("ckpt");
  TrainingState a = MakeRun(dir, 1, SmallDims(), /*keep=*/1);
  Step(a, 0);
  for (int64_t s = 1; s <= 3; ++s) ASSERT_TRUE(a.checkpointer->Save(s).ok());
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-00000003"}));
}

TEST(Checkpoint, NoLatestMeansAFreshStartAndResumeNeverIgnoresOne) {
  TempDir tmp;
  const std::string dir = tmp.File("ckpt");
  TrainingState fresh = MakeRun(dir, 1);
  auto none = fresh.checkpointer->Resume();
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ(none->step, 0);
  Step(fresh, 0);
  ASSERT_TRUE(fresh.checkpointer->Save(1).ok());
  TrainingState never = MakeRun(dir, 1, SmallDims(), 2, "never");
  auto ignored = never.checkpointer->Resume();
  ASSERT_TRUE(ignored.ok()) << ignored.status().ToString();
  EXPECT_EQ(ignored->step, 0);
}

// A run that started afresh (resume: never) and reaches a step an earlier run saved rewrites
// that directory in place. Cut short after its rank file is replaced but before the file's
// checksum is (here: the checksum's temporary path is taken by a directory), it must not leave
// `latest` naming files that fail their checksums: every later start would fail (exit 3).
TEST(Checkpoint, ARewriteOfTheCheckpointLatestNamesCutShortLeavesNoLatestNamingIt) {
  TempDir tmp;
  const std::string dir = tmp.File("ckpt");
  TrainingState first = MakeRun(dir, 1);
  Step(first, 0);
  ASSERT_TRUE(first.checkpointer->Save(1).ok());
  ASSERT_EQ(LatestText(dir), "step-00000001\n");

  TrainingState again = MakeRun(dir, 7, SmallDims(), 2, "never");
  Step(again, 0);
  const std::string sum_tmp = dir + "/step-00000001/rank-00000.safetensors.sum.tmp." + std::to_string(::getpid());
  fs::create_directories(sum_tmp + "/blocker");
  const Status cut = again.checkpointer->Save(1);
  ASSERT_FALSE(cut.ok());
  EXPECT_EQ(cut.code(), StatusCode::kIOError) << cut.ToString();
  EXPECT_FALSE(fs::exists(dir + "/latest"));

  // The next start finds no checkpoint and starts afresh; it does not fail on the torn one.
  TrainingState next = MakeRun(dir, 1);
  auto point = next.checkpointer->Resume();
  ASSERT_TRUE(point.ok()) << point.status().ToString();
  EXPECT_EQ(point->step, 0);

  // Once the save goes through, `latest` names it again.
  ASSERT_TRUE(RemoveTree(sum_tmp).ok());  // not fs::remove_all: PyPI libtorch's copy of it crashes (common/file.h)
  ASSERT_TRUE(again.checkpointer->Save(1).ok());
  EXPECT_EQ(LatestText(dir), "step-00000001\n");
  TrainingState resumed = MakeRun(dir, 1);
  auto loaded = resumed.checkpointer->Resume();
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->step, 1);
}

TEST(Checkpoint, DueEveryNStepsAndAtTheLastStep) {
  TempDir tmp;
  TrainingState r = MakeRun(tmp.File("ckpt"), 1);
  config::CheckpointConfig every3 = r.cfg.checkpoint;
  every3.every = 3;
  Checkpointer c(every3, *r.engine, *r.optimizer, CheckpointMeta());
  EXPECT_FALSE(c.Due(1, 10));
  EXPECT_TRUE(c.Due(3, 10));
  EXPECT_TRUE(c.Due(9, 10));
  EXPECT_TRUE(c.Due(10, 10));
  config::CheckpointConfig at_end = r.cfg.checkpoint;
  Checkpointer end(at_end, *r.engine, *r.optimizer, CheckpointMeta());
  EXPECT_FALSE(end.Due(3, 10));
  EXPECT_TRUE(end.Due(10, 10));
  config::CheckpointConfig off;
  off.every = 1;
  Checkpointer none(off, *r.engine, *r.optimizer, CheckpointMeta());
  EXPECT_FALSE(none.Due(10, 10));
}

// --- mismatches and damage ------------------------------------------------------------------

class DamagedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.File("ckpt");
    TrainingState a = MakeRun(dir_, 1);
    Step(a, 0);
    ASSERT_TRUE(a.checkpointer->Save(1).ok());
  }
  Status ResumeWith(model::LlamaConfig dims = SmallDims()) {
    TrainingState b = MakeRun(dir_, 2, dims);
    auto r = b.checkpointer->Resume();
    return r.ok() ? Status::Ok() : r.status();
  }
  std::string StepDir() const { return dir_ + "/step-00000001"; }
  std::string RankFile() const { return StepDir() + "/rank-00000.safetensors"; }

  TempDir tmp_;
  std::string dir_;
};

TEST_F(DamagedCheckpoint, OtherModelDimsNameEveryDifferenceAndTheDirectory) {
  model::LlamaConfig other = SmallDims();
  other.hidden_size = 64;
  other.num_hidden_layers = 3;
  const Status s = ResumeWith(other);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_EQ(ExitCodeFor(s.code()), 3);
  EXPECT_THAT(s.message(), HasSubstr(StepDir()));
  EXPECT_THAT(s.message(), HasSubstr("model.hidden_size 32 in the checkpoint, 64 in this run"));
  EXPECT_THAT(s.message(), HasSubstr("model.num_hidden_layers 2 in the checkpoint, 3 in this run"));
}

// Not shapes, but another function of the same weights: refused on resume too.
// Not shapes, but another function of the same weights: the resume says so (a larger theta on
// resume is how a run extends its context, so it is not refused).
TEST_F(DamagedCheckpoint, OtherRopeThetaOrNormEpsilonResumesWithANote) {
  model::LlamaConfig other = SmallDims();
  other.rope_theta = 500.0;
  other.rms_norm_eps = 1e-6;
  TrainingState b = MakeRun(dir_, 2, other);
  auto point = b.checkpointer->Resume();
  ASSERT_TRUE(point.ok()) << point.status().ToString();
  EXPECT_EQ(point->step, 1);
  const std::string notes = ::testing::PrintToString(point->notes);
  EXPECT_THAT(notes, HasSubstr("model.rope_theta was 10000 when the checkpoint was written, now 500"));
  EXPECT_THAT(notes, HasSubstr("model.rms_norm_eps was 1e-05 when the checkpoint was written, now 1e-06"));

  // A checkpoint from before they were recorded has nothing to compare: no note.
  std::string meta = ReadBytes(StepDir() + "/meta.json");
  for (const std::string key : {"rope_theta", "rms_norm_eps"}) {
    const auto at = meta.find("\"" + key + "\":");
    ASSERT_NE(at, std::string::npos) << meta;
    const auto line = meta.rfind('\n', at);
    meta.erase(line, meta.find('\n', at) - line);  // the whole line, its comma too (keys are sorted)
  }
  WriteBytes(StepDir() + "/meta.json", meta);
  TrainingState c = MakeRun(dir_, 2, other);
  auto old = c.checkpointer->Resume();
  ASSERT_TRUE(old.ok()) << old.status().ToString() << meta;
  EXPECT_THAT(::testing::PrintToString(old->notes), Not(HasSubstr("rope_theta")));
}

// Format 2's rank files hold tensors by position: only the mesh that wrote them reads them.
TEST_F(DamagedCheckpoint, AFormatTwoCheckpointOfAnotherWorldSizeAndMeshIsRefusedNamingThem) {
  auto meta = ReadMeta(StepDir());
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  meta->format_version = 2;
  meta->world_size = 4;
  meta->dp_shard = 2;
  meta->dp_replicate = 2;
  meta->files.clear();
  WriteBytes(StepDir() + "/meta.json", MetaToJson(*meta));
  const Status s = ResumeWith();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_THAT(s.message(), HasSubstr("world size 4 in the checkpoint, 1 in this run"));
  EXPECT_THAT(s.message(), HasSubstr("mesh dp_shard 2 in the checkpoint, 1 in this run"));
  EXPECT_THAT(s.message(), HasSubstr("mesh dp_replicate 2 in the checkpoint, 1 in this run"));
  EXPECT_THAT(s.message(), HasSubstr(StepDir()));
}

TEST_F(DamagedCheckpoint, AMetaListingTooFewFilesIsNamed) {
  std::string meta = ReadBytes(StepDir() + "/meta.json");
  const auto at = meta.find("\"world_size\": 1");
  ASSERT_NE(at, std::string::npos);
  meta.replace(at, 15, "\"world_size\": 2");
  WriteBytes(StepDir() + "/meta.json", meta);
  const Status s = ResumeWith();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_THAT(s.message(), HasSubstr("lists 1 files for world_size 2"));
}

TEST_F(DamagedCheckpoint, TruncatedRankFileNamesTheFile) {
  const std::string bytes = ReadBytes(RankFile());
  WriteBytes(RankFile(), bytes.substr(0, bytes.size() / 2));
  const Status s = ResumeWith();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_THAT(s.message(), HasSubstr("checkpoint file '" + RankFile() + "' is corrupt or truncated"));
}

TEST_F(DamagedCheckpoint, GarbageRankFileNamesTheFile) {
  WriteBytes(RankFile(), std::string(4096, 'x'));
  const Status s = ResumeWith();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_THAT(s.message(), HasSubstr(RankFile()));
}

TEST_F(DamagedCheckpoint, FlippedBytesInsideATensorAreCaughtByTheChecksum) {
  // libtorch's zip reader does not check CRCs: without the .sum file this would load silently.
  std::string bytes = ReadBytes(RankFile());
  for (size_t i = bytes.size() / 2; i < bytes.size() / 2 + 16; ++i) bytes[i] = static_cast<char>(bytes[i] ^ 0x5a);
  WriteBytes(RankFile(), bytes);
  const Status s = ResumeWith();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_THAT(s.message(), HasSubstr("checkpoint file '" + RankFile() + "' is corrupt: the checksum of tensor"));
}

TEST_F(DamagedCheckpoint, MissingChecksumFileIsNamed) {
  fs::remove(RankFile() + ".sum");
  const Status s = ResumeWith();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(ExitCodeFor(s.code()), 3);
  EXPECT_THAT(s.message(), HasSubstr(RankFile() + ".sum"));
}

TEST_F(DamagedCheckpoint, MissingRankFileIsNotFoundNamingIt) {
  fs::remove(RankFile());
  const Status s = ResumeWith();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(ExitCodeFor(s.code()), 3);
  EXPECT_THAT(s.message(), HasSubstr(RankFile()));
}

TEST_F(DamagedCheckpoint, CorruptMetaNamesTheFile) {
  WriteBytes(StepDir() + "/meta.json", "{\"format\": \"meshwork-training-checkpoint\", \"vers");
  const Status s = ResumeWith();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_THAT(s.message(), HasSubstr(StepDir() + "/meta.json"));
}

TEST_F(DamagedCheckpoint, LatestThatNamesNoStepDirectoryIsNamed) {
  WriteBytes(dir_ + "/latest", "hello\n");
  Status s = ResumeWith();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_THAT(s.message(), HasSubstr(dir_ + "/latest"));
  WriteBytes(dir_ + "/latest", "step-00000007\n");
  s = ResumeWith();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("step-00000007"));
}

// A checkpoint from before the flat FSDP layout (no shard_layout key: sharded by rows) cannot
// resume a sharded run, and says why; with dp_shard 1 every shard is a whole parameter.
TEST(Checkpoint, ShardLayoutMustMatchWhenSharded) {
  TempDir tmp;
  const std::string& dir = tmp.path();
  CheckpointMeta flat;
  flat.format_version = 2;  // format 3's pieces carry their offsets: any layout loads them
  flat.world_size = 2;
  flat.dp_shard = 2;
  std::string json = MetaToJson(flat);
  EXPECT_THAT(json, HasSubstr("\"shard_layout\": \"flat\""));
  json.replace(json.find("\"shard_layout\": \"flat\","), 26, "");
  WriteBytes(dir + "/meta.json", json);
  auto old = ReadMeta(dir);
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  EXPECT_EQ(old->shard_layout, "rows");
  const Status s = CheckCompatible(*old, flat, dir);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_THAT(s.message(), HasSubstr("shard layout 'rows' in the checkpoint, 'flat' in this run"));
  old->world_size = flat.world_size = 1;
  old->dp_shard = flat.dp_shard = 1;
  EXPECT_TRUE(CheckCompatible(*old, flat, dir).ok());
}

// meta.json records the pipeline's ranks; one written before it had none reads as pp 1, and a
// resume at another pp is a reshard the log names, not a refusal (format 3).
TEST(Checkpoint, MetaRecordsPipelineStagesAndAReshardNamesThem) {
  TempDir tmp;
  const std::string& dir = tmp.path();
  CheckpointMeta stages;
  stages.world_size = 2;
  stages.pp = 2;
  std::string json = MetaToJson(stages);
  WriteBytes(dir + "/meta.json", json);
  auto read = ReadMeta(dir);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->pp, 2);

  const size_t at = json.find("\"pp\": 2,");
  ASSERT_NE(at, std::string::npos) << json;
  json.erase(at, 8);
  ASSERT_EQ(json.find("\"pp\""), std::string::npos) << json;
  WriteBytes(dir + "/meta.json", json);
  read = ReadMeta(dir);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->pp, 1);

  CheckpointMeta fsdp;
  fsdp.world_size = 2;
  fsdp.dp_shard = 2;
  EXPECT_TRUE(CheckCompatible(stages, fsdp, dir).ok());
  EXPECT_THAT(DescribeSoftDifferences(stages, fsdp),
              Contains("resharded: the checkpoint was written by world size 2 (pp 2 x dp_replicate 1 x dp_shard 1), "
                       "this run is 2 (1 x 1 x 2)"));
  // Format 2's rank files load at their own mesh only: pp is part of it.
  CheckpointMeta old_stages = stages;
  old_stages.format_version = 2;
  const Status s = CheckCompatible(old_stages, fsdp, dir);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("mesh pp 2 in the checkpoint, 1 in this run"));
}

// --- through Train() ------------------------------------------------------------------------

config::TrainConfig TrainCfg(std::vector<std::string> extra) {
  std::vector<std::string> o = {"model.hidden_size=32",    "model.intermediate_size=48", "model.num_hidden_layers=2",
                                "model.num_attention_heads=4", "model.num_key_value_heads=2", "data.seq_len=16",
                                "data.batch_size=4",        "schedule.steps=8",           "schedule.warmup_steps=2",
                                "metrics.port=-1",          "metrics.device_profile=cpu", "metrics.peak_tflops=1",
                                "logging.every=100"};
  o.insert(o.end(), extra.begin(), extra.end());
  auto c = config::LoadConfig("", o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : config::TrainConfig();
}

TEST(CheckpointTrain, ResumedRunRepeatsTheUninterruptedLossesBitForBit) {
  TempDir tmp;
  const std::string dir = tmp.File("ckpt");
  std::ostringstream log;
  auto whole = Train(TrainCfg({}), log);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  auto saving = Train(TrainCfg({"checkpoint.dir=" + dir, "checkpoint.every=3", "checkpoint.keep=3"}), log);
  ASSERT_TRUE(saving.ok()) << saving.status().ToString();
  EXPECT_EQ(saving->losses, whole->losses);  // saving does not change training
  EXPECT_TRUE(fs::exists(dir + "/step-00000003"));
  EXPECT_TRUE(fs::exists(dir + "/step-00000006"));
  EXPECT_TRUE(fs::exists(dir + "/step-00000008"));  // the last step is always saved

  // As if the job had died after step 6: `latest` names step 6, and the same command runs again.
  WriteBytes(dir + "/latest", "step-00000006\n");
  std::ostringstream resumed_log;
  auto resumed = Train(TrainCfg({"checkpoint.dir=" + dir, "checkpoint.every=3", "checkpoint.keep=3"}), resumed_log);
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_THAT(resumed_log.str(), HasSubstr("resumed from " + dir + "/step-00000006 (step 6 of 8)\n"));
  EXPECT_EQ(resumed->resumed_from, 6);
  EXPECT_EQ(resumed->steps, 2);
  ASSERT_EQ(resumed->losses.size(), 2u);
  EXPECT_EQ(resumed->losses[0], whole->losses[6]);
  EXPECT_EQ(resumed->losses[1], whole->losses[7]);
}

// data.order epochs: a checkpoint records where the data stands, and a resume under another
// global batch continues the order from that sample and says so.
TEST(CheckpointTrain, EpochOrderResumesAtTheRecordedSampleUnderAnotherBatch) {
  TempDir tmp;
  const std::string dir = tmp.File("ckpt"), tokens = tmp.File("t.bin");
  std::vector<uint32_t> ids(4000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>(i % 64);
  ASSERT_TRUE(data::WriteTokenFile(tokens, ids, data::TokenFormat::kLlmc).ok());
  const std::vector<std::string> keys = {"data.train=" + tokens, "data.order=epochs", "checkpoint.dir=" + dir,
                                         "checkpoint.every=3"};
  std::ostringstream log;
  auto saving = Train(TrainCfg(keys), log);
  ASSERT_TRUE(saving.ok()) << saving.status().ToString();
  auto meta = ReadMeta(dir + "/step-00000006");
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  EXPECT_EQ(meta->samples, 24);  // 6 steps of 4 rows
  WriteBytes(dir + "/latest", "step-00000006\n");
  std::vector<std::string> smaller = keys;
  smaller.push_back("data.batch_size=2");
  std::ostringstream resumed_log;
  auto resumed = Train(TrainCfg(smaller), resumed_log);
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_THAT(resumed_log.str(), HasSubstr("resume: note: data: the checkpoint's run took 4 rows a step, this one "
                                           "takes 2; the epoch order continues at sample 24"));
  auto last = ReadMeta(dir + "/step-00000008");
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_EQ(last->samples, 28);  // and 2 steps of 2
}

TEST(CheckpointTrain, ResumeAfterTheLastStepFinishesAtOnceAndStillExports) {
  TempDir tmp;
  const std::string dir = tmp.File("ckpt");
  std::ostringstream log;
  ASSERT_TRUE(Train(TrainCfg({"checkpoint.dir=" + dir}), log).ok());
  EXPECT_EQ(LatestText(dir), "step-00000008\n");
  std::ostringstream again_log;
  auto again = Train(TrainCfg({"checkpoint.dir=" + dir, "checkpoint.export_hf=" + tmp.File("hf")}), again_log);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->resumed_from, 8);
  EXPECT_EQ(again->steps, 0);
  EXPECT_TRUE(again->losses.empty());
  EXPECT_THAT(again_log.str(), HasSubstr("(step 8 of 8)"));
  EXPECT_TRUE(fs::exists(tmp.File("hf") + "/model.safetensors"));
}

// A resumed gang's /metrics opens only once the checkpoint has loaded, its step already the
// checkpoint's: before, rank 0 served step 0 while it loaded and the operator's STEP column went
// 117 -> 0 -> 113 (issue 20). Seen here through a resume that fails: /metrics never opened.
TEST(CheckpointTrain, MetricsOpenOnlyOnceTheCheckpointHasLoaded) {
  TempDir tmp;
  const std::string dir = tmp.File("ckpt");
  std::ostringstream log;
  ASSERT_TRUE(Train(TrainCfg({"checkpoint.dir=" + dir, "schedule.steps=2"}), log).ok());
  WriteBytes(dir + "/latest", "step-00000007\n");  // names a step that is not there
  std::ostringstream failed_log;
  auto failed = Train(TrainCfg({"checkpoint.dir=" + dir, "metrics.port=0", "metrics.host=127.0.0.1"}), failed_log);
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().message(), HasSubstr("step-00000007"));
  EXPECT_THAT(failed_log.str(), Not(HasSubstr("metrics: http://"))) << failed_log.str();
  // A resume that loads: /metrics is announced, after the checkpoint was read.
  WriteBytes(dir + "/latest", "step-00000002\n");
  std::ostringstream resumed_log;
  auto resumed = Train(TrainCfg({"checkpoint.dir=" + dir, "metrics.port=0", "metrics.host=127.0.0.1",
                                 "schedule.steps=3"}), resumed_log);
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_THAT(resumed_log.str(), HasSubstr("metrics: http://127.0.0.1:"));
  EXPECT_EQ(resumed->resumed_from, 2);
}

TEST(CheckpointTrain, ACheckpointOfAnotherModelStopsTheRunWithExitCode3) {
  TempDir tmp;
  const std::string dir = tmp.File("ckpt");
  std::ostringstream log;
  ASSERT_TRUE(Train(TrainCfg({"checkpoint.dir=" + dir, "schedule.steps=2"}), log).ok());
  auto other = Train(TrainCfg({"checkpoint.dir=" + dir, "model.num_hidden_layers=3"}), log);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(ExitCodeFor(other.status().code()), 3);
  EXPECT_THAT(other.status().message(), HasSubstr("model.num_hidden_layers 2 in the checkpoint, 3 in this run"));
}

}  // namespace
}  // namespace meshwork::train
