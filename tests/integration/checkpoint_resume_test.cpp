// Resume as the operator does it: a training job is killed (SIGKILL) after it wrote a
// checkpoint, then the same command runs again. The restarted run must continue from the
// checkpoint and end with exactly the losses of a run that was never interrupted: on one
// process, and on ranks started by `meshwork-train launch` (FSDP eager, compiled, HSDP); and
// resharded across world sizes, to fp32 rounding. A Hugging Face import (model.init_from) at every
// mesh trains as the same import on one process.
// Also `train --config-env VAR` as the operator passes a ConfigMap.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/free_port.h"
#include "tests/common/temp_dir.h"

namespace meshwork {
namespace {

namespace fs = std::filesystem;
using meshwork::testing::ReadBytes;
using meshwork::testing::TempDir;
using ::testing::HasSubstr;

const std::string kTrainer = std::string(MESHWORK_BINARY_DIR) + "/trainer/meshwork-train";

// A child process running `argv` with stdout and stderr to `log`, and `env` added.
class Process {
 public:
  Process(const std::vector<std::string>& argv, const std::string& log,
          const std::vector<std::pair<std::string, std::string>>& env = {}) {
    pid_ = ::fork();
    if (pid_ == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
  }
  ~Process() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      Wait();
    }
  }
  pid_t pid() const { return pid_; }
  // Exit code, or 128 + signal.
  int Wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  bool Running() {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      exit_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return false;
    }
    return true;
  }
  int exit_code() const { return exit_; }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int exit_ = -1;
};

// Processes whose parent is `parent` (the launcher's ranks).
std::vector<pid_t> ChildrenOf(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // pid (comm) state ppid ...: comm may hold spaces, so read after the last ')'.
    std::istringstream rest(line.substr(line.rfind(')') + 2));
    char state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent) out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

// step -> loss text (17 significant digits) from a jsonl log; a later line for a step wins
// (a resumed run appends the steps after its checkpoint again).
std::map<int, std::string> Losses(const std::string& jsonl) {
  std::map<int, std::string> out;
  std::ifstream in(jsonl);
  const std::regex re("\\{\"step\":([0-9]+),\"loss\":([^,]+),");
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, re)) out[std::stoi(m[1])] = m[2];
  }
  return out;
}

class ResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kTrainer)) << kTrainer << " is not built";
    tokens_ = tmp_.File("train.bin");
    Process prep({kTrainer, "prepare-data", "--out", tokens_, "/usr/share/common-licenses/GPL-3"},
                 tmp_.File("prep.log"));
    ASSERT_EQ(prep.Wait(), 0) << ReadBytes(tmp_.File("prep.log"));
  }

  // The train command of `nproc` ranks (1: no launcher) writing losses to NAME.jsonl.
  std::vector<std::string> Command(const std::string& name, int nproc, const std::vector<std::string>& extra,
                                   const std::string& checkpoint_dir) {
    std::vector<std::string> cmd{kTrainer};
    if (nproc > 1) {
      cmd.insert(cmd.end(), {"launch", "--nproc", std::to_string(nproc), "--master-port", std::to_string(meshwork::testing::FreePort())});
    }
    cmd.push_back("train");
    for (const std::string& s : std::vector<std::string>{
             "model.hidden_size=40", "model.intermediate_size=90", "model.num_hidden_layers=2",
          "model.num_attention_heads=4", "model.num_key_value_heads=2", "data.seq_len=32",
          "data.batch_size=" + std::to_string(8 / nproc), "schedule.steps=" + std::to_string(kSteps),
          "schedule.warmup_steps=5", "metrics.port=-1", "metrics.device_profile=cpu", "metrics.peak_tflops=1", "logging.every=1000", "optimizer.eps=1e-4",
          "dist.timeout_seconds=60", "training.threads=1", "data.train=" + tokens_,
          "logging.jsonl=" + tmp_.File(name + ".jsonl")}) {
      cmd.insert(cmd.end(), {"--set", s});
    }
    if (!checkpoint_dir.empty()) {
      cmd.insert(cmd.end(), {"--set", "checkpoint.dir=" + checkpoint_dir, "--set", "checkpoint.every=" + std::to_string(kEvery)});
    }
    cmd.insert(cmd.end(), extra.begin(), extra.end());
    return cmd;
  }


  // Trains without interruption, then kills a checkpointing run of the same config once it
  // committed a checkpoint, runs that command again, and compares every step's loss.
  // `relative`: 0 = every step's loss bit for bit; else within this relative difference.
  // `whole_checkpoints`: the uninterrupted run checkpoints too (where a checkpoint changes the
  // run: PipeMare drains its pipeline for one), to a directory of its own.
  void KillAndResume(int nproc, const std::vector<std::string>& extra, double relative = 0,
                     bool whole_checkpoints = false) {
    const std::string whole_log = tmp_.File("whole.log");
    Process whole(Command("whole", nproc, extra, whole_checkpoints ? tmp_.File("whole-ckpt") : ""), whole_log);
    ASSERT_EQ(whole.Wait(), 0) << ReadBytes(whole_log);
    const auto want = Losses(tmp_.File("whole.jsonl"));
    ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));

    const std::string ckpt = tmp_.File("ckpt");
    const auto cmd = Command("resumed", nproc, extra, ckpt);
    const std::string first_log = tmp_.File("first.log");
    {
      Process first(cmd, first_log);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
      while (!fs::exists(ckpt + "/latest") && first.Running() && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      ASSERT_TRUE(first.Running()) << "the run ended (exit " << first.exit_code()
                                   << ") before it could be killed after its first checkpoint:\n"
                                   << ReadBytes(first_log);
      ASSERT_TRUE(fs::exists(ckpt + "/latest")) << ReadBytes(first_log);
      // One process: kill it. Launched: kill one rank, as a failed pod; the launcher stops the rest.
      const std::vector<pid_t> ranks = nproc > 1 ? ChildrenOf(first.pid()) : std::vector<pid_t>{first.pid()};
      ASSERT_FALSE(ranks.empty());
      ::kill(ranks.back(), SIGKILL);
      const int rc = first.Wait();
      EXPECT_EQ(rc, 128 + SIGKILL) << ReadBytes(first_log);
    }
    const std::string latest = ReadBytes(ckpt + "/latest");

    const std::string second_log = tmp_.File("second.log");
    Process second(cmd, second_log);
    ASSERT_EQ(second.Wait(), 0) << ReadBytes(second_log);
    const std::string log = ReadBytes(second_log);
    std::smatch m;
    const std::regex resumed_line("resumed from (\\S+)/step-0*([0-9]+) \\(step ([0-9]+) of ([0-9]+)\\)");
    ASSERT_TRUE(std::regex_search(log, m, resumed_line)) << log;
    const int from = std::stoi(m[3]);
    std::cout << "killed after checkpoint " << latest.substr(0, latest.size() - 1) << "; " << m[0] << "\n";
    EXPECT_EQ(m[1].str(), ckpt);
    EXPECT_EQ(m[4].str(), std::to_string(kSteps));
    EXPECT_GT(from, 0);
    EXPECT_LT(from, kSteps) << "the run was not interrupted before its end";
    EXPECT_EQ(from % kEvery, 0);

    const auto got = Losses(tmp_.File("resumed.jsonl"));
    ASSERT_EQ(got.size(), static_cast<size_t>(kSteps)) << ReadBytes(tmp_.File("resumed.jsonl"));
    for (int step = 1; step <= kSteps; ++step) {
      if (relative == 0) {
        EXPECT_EQ(got.at(step), want.at(step)) << "step " << step << " (resumed from " << from << ")";
      } else {
        const double w = std::stod(want.at(step));
        EXPECT_NEAR(std::stod(got.at(step)), w, relative * std::abs(w)) << "step " << step << " (resumed from " << from << ")";
      }
    }
    std::cout << "final loss: uninterrupted " << want.at(kSteps) << ", resumed " << got.at(kSteps) << "\n";
  }

  // One segment of a resharded run: `nproc` ranks with `extra` flags.
  struct Segment {
    int nproc;
    std::vector<std::string> extra;
  };
  // Trains `whole` without interruption; then runs `segments` in turn on one checkpoint
  // directory, each killed once it saved past the previous one's checkpoint, and `last` to the
  // end; every step's loss must equal the uninterrupted run's within `relative`. The last run's
  // log must say `resharded` (its reshard note).
  void ReshardThrough(const Segment& whole, const std::vector<Segment>& segments, const Segment& last,
                      const std::string& resharded, double relative) {
    const std::string whole_log = tmp_.File("whole.log");
    Process uninterrupted(Command("whole", whole.nproc, whole.extra, ""), whole_log);
    ASSERT_EQ(uninterrupted.Wait(), 0) << ReadBytes(whole_log);
    const auto want = Losses(tmp_.File("whole.jsonl"));
    ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));

    const std::string ckpt = tmp_.File("ckpt");
    auto latest_step = [&]() -> int {
      std::ifstream in(ckpt + "/latest");
      std::string name;
      if (!(in >> name) || name.rfind("step-", 0) != 0) return 0;
      return std::stoi(name.substr(5));
    };
    int segment = 0;
    for (const Segment& part : segments) {
      const int past = latest_step();
      const std::string log = tmp_.File("segment" + std::to_string(++segment) + ".log");
      Process run(Command("resharded", part.nproc, part.extra, ckpt), log);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
      while (latest_step() <= past && run.Running() && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      ASSERT_TRUE(run.Running()) << "segment " << segment << " ended (exit " << run.exit_code()
                                 << ") before it could be killed after a checkpoint:\n" << ReadBytes(log);
      ASSERT_GT(latest_step(), past) << ReadBytes(log);
      const std::vector<pid_t> ranks = part.nproc > 1 ? ChildrenOf(run.pid()) : std::vector<pid_t>{run.pid()};
      ASSERT_FALSE(ranks.empty());
      ::kill(ranks.back(), SIGKILL);
      run.Wait();
      if (segment > 1) {
        EXPECT_THAT(ReadBytes(log), HasSubstr("resharded: the checkpoint was written by world size"));
      }
      std::cout << "segment " << segment << ": " << part.nproc << " rank(s), killed after step-" << latest_step() << "\n";
    }
    const std::string last_log = tmp_.File("last.log");
    Process end(Command("resharded", last.nproc, last.extra, ckpt), last_log);
    ASSERT_EQ(end.Wait(), 0) << ReadBytes(last_log);
    const std::string log = ReadBytes(last_log);
    EXPECT_THAT(log, HasSubstr(resharded));
    EXPECT_THAT(log, HasSubstr("MiB of the checkpoint's"));
    const auto got = Losses(tmp_.File("resharded.jsonl"));
    ASSERT_EQ(got.size(), static_cast<size_t>(kSteps));
    double worst = 0;
    for (int step = 1; step <= kSteps; ++step) {
      const double w = std::stod(want.at(step)), g = std::stod(got.at(step));
      worst = std::max(worst, std::abs(g - w) / std::abs(w));
      EXPECT_NEAR(g, w, relative * std::abs(w)) << "step " << step;
    }
    std::cout << "largest relative loss difference over " << kSteps << " steps: " << worst << "\n";
  }

  static constexpr int kSteps = 16;
  static constexpr int kEvery = 4;
  TempDir tmp_;
  std::string tokens_;
};

TEST_F(ResumeTest, OneProcessKilledAfterACheckpointEndsWithTheUninterruptedLosses) { KillAndResume(1, {}); }

// checkpoint.save_on_terminate: SIGTERM to the launcher, as Kubernetes stops a Pod it deletes,
// makes every rank finish its step, save that step's checkpoint and exit 143; the next run
// resumes from exactly that step (no checkpoint.every step in between: every 1000) and ends with
// the uninterrupted losses.
TEST_F(ResumeTest, SigtermSavesTheStepItStoppedAtAndTheNextRunResumesThere) {
  constexpr int kLong = 120;
  const std::vector<std::string> extra{"--set", "schedule.steps=" + std::to_string(kLong), "--set",
                                       "checkpoint.every=1000"};
  const std::string whole_log = tmp_.File("whole.log");
  Process whole(Command("whole", 2, extra, ""), whole_log);
  ASSERT_EQ(whole.Wait(), 0) << ReadBytes(whole_log);
  const auto want = Losses(tmp_.File("whole.jsonl"));
  ASSERT_EQ(want.size(), static_cast<size_t>(kLong));

  const std::string ckpt = tmp_.File("ckpt");
  const auto cmd = Command("resumed", 2, extra, ckpt);
  const std::string first_log = tmp_.File("first.log");
  {
    Process first(cmd, first_log);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (Losses(tmp_.File("resumed.jsonl")).size() < 10 && first.Running() &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_TRUE(first.Running()) << "the run ended (exit " << first.exit_code() << ") before its SIGTERM:\n"
                                 << ReadBytes(first_log);
    ASSERT_FALSE(fs::exists(ckpt + "/latest")) << "a checkpoint before the SIGTERM: the test would not tell";
    ::kill(first.pid(), SIGTERM);
    EXPECT_EQ(first.Wait(), 128 + SIGTERM) << ReadBytes(first_log);
  }
  const std::string log = ReadBytes(first_log);
  std::smatch stopped;
  ASSERT_TRUE(std::regex_search(log, stopped, std::regex("stopped by SIGTERM after step ([0-9]+) of 120"))) << log;
  const int at = std::stoi(stopped[1]);
  EXPECT_GE(at, 10);
  EXPECT_LT(at, kLong) << "the run was not stopped before its end";
  EXPECT_THAT(log, HasSubstr("meshwork-launch: received SIGTERM, forwarding to all ranks"));
  EXPECT_THAT(ReadBytes(ckpt + "/latest"), HasSubstr(std::to_string(at)));

  const std::string second_log = tmp_.File("second.log");
  Process second(cmd, second_log);
  ASSERT_EQ(second.Wait(), 0) << ReadBytes(second_log);
  std::smatch m;
  const std::string resumed_log = ReadBytes(second_log);
  ASSERT_TRUE(std::regex_search(resumed_log, m, std::regex("resumed from \\S+/step-0*([0-9]+) \\(step ([0-9]+) of"))) << resumed_log;
  EXPECT_EQ(std::stoi(m[2]), at) << "the next run resumes at the step the SIGTERM stopped";
  const auto got = Losses(tmp_.File("resumed.jsonl"));
  ASSERT_EQ(got.size(), static_cast<size_t>(kLong));
  for (int step = 1; step <= kLong; ++step) EXPECT_EQ(got.at(step), want.at(step)) << "step " << step;
  std::cout << "stopped by SIGTERM after step " << at << "; resumed there; final loss " << got.at(kLong) << "\n";
}

TEST_F(ResumeTest, FsdpTwoRanksKilledAfterACheckpointEndsWithTheUninterruptedLosses) { KillAndResume(2, {}); }

// A resumed compiled run warms up again: its first two steps after the checkpoint run the eager
// schedule, which reduce-scatters the whole embedding table, where the uninterrupted run's plan
// reads it by rows (fsdp.embedding_rows) and sums its gradients in another order. So the losses
// agree to fp32 rounding, not bit for bit; with the table read whole they agree bit for bit.
TEST_F(ResumeTest, CompiledFsdpTwoRanksKilledAfterACheckpointEndsWithTheUninterruptedLosses) {
  KillAndResume(2, {"--set", "fsdp.mode=compiled"}, 1e-6);
}

TEST_F(ResumeTest, CompiledFsdpWithTheTableReadWholeResumesBitForBit) {
  KillAndResume(2, {"--set", "fsdp.mode=compiled", "--set", "fsdp.embedding_rows=false"});
}

TEST_F(ResumeTest, HsdpTwoByTwoKilledAfterACheckpointEndsWithTheUninterruptedLosses) {
  KillAndResume(4, {"--set", "mesh.dp_replicate=2"});
}

// A checkpoint reshards to any mesh: 4 ranks, then 2, then 1 process, then 4 again, each run
// killed once it saved past the previous one's checkpoint, the global batch the same throughout
// (data.batch_size is per rank), ends with the losses of 4 ranks never interrupted. The world
// sizes sum gradients in different orders, so to fp32 rounding, not bit for bit.
TEST_F(ResumeTest, ReshardedFourTwoOneFourEndsWithTheUninterruptedLosses) {
  ReshardThrough({4, {}}, {{4, {}}, {2, {}}, {1, {}}}, {4, {}},
                 "resharded: the checkpoint was written by world size 1 (dp_replicate 1 x dp_shard 1), "
                 "this run is 4 (1 x 4)",
                 1e-6);
}

// An elastic job's resize: training.global_batch_size keeps 8 rows a step while every rank runs
// micro-batches of at most 2 rows (its memory), so 4 ranks take one micro-batch, 2 ranks two and
// one process four (gradient accumulation). 4 -> 2 -> 1 -> 4 ends with the losses of 4 ranks
// never interrupted, to fp32 rounding.
TEST_F(ResumeTest, ResizedWithAGlobalBatchByGradientAccumulationEndsWithTheUninterruptedLosses) {
  const std::vector<std::string> elastic = {"--set", "data.batch_size=2", "--set", "training.global_batch_size=8"};
  ReshardThrough({4, {}}, {{4, elastic}, {2, elastic}, {1, elastic}}, {4, elastic},
                 "resharded: the checkpoint was written by world size 1 (dp_replicate 1 x dp_shard 1), "
                 "this run is 4 (1 x 4)",
                 1e-6);
  EXPECT_THAT(ReadBytes(tmp_.File("segment3.log")),
              HasSubstr("batch: training.global_batch_size 8 rows a step = 1 data parallel rank x 4 micro-batches "
                        "(training.grad_accum) x 2 rows (data.batch_size)"));
  EXPECT_THAT(ReadBytes(tmp_.File("segment2.log")), HasSubstr("= 2 data parallel ranks x 2 micro-batches"));
}

// Tensor parallelism: o_proj and down_proj are column blocks on a tp rank. FSDP over 4 ranks,
// then dp_shard 2 x tp 2, then tp 2 alone, then FSDP over 4 again (the global batch 8 rows
// throughout: data.batch_size is per data parallel rank) ends with the losses of FSDP over 4
// ranks never interrupted, to fp32 rounding.
TEST_F(ResumeTest, ReshardedThroughTensorParallelMeshesEndsWithTheUninterruptedLosses) {
  const std::vector<std::string> fsdp2_tp2 = {"--set", "mesh.tp=2", "--set", "mesh.dp_shard=2", "--set",
                                              "data.batch_size=4"};
  const std::vector<std::string> tp2 = {"--set", "mesh.tp=2", "--set", "data.batch_size=8"};
  ReshardThrough({4, {}}, {{4, {}}, {4, fsdp2_tp2}, {2, tp2}}, {4, {}},
                 "resharded: the checkpoint was written by world size 2 (dp_replicate 1 x dp_shard 1 x tp 2), "
                 "this run is 4 (1 x 4 x 1)",
                 1e-6);
}

// The same mesh resumes bit for bit with tensor parallelism too.
TEST_F(ResumeTest, FsdpTimesTensorParallelKilledAfterACheckpointEndsWithTheUninterruptedLosses) {
  KillAndResume(4, {"--set", "mesh.tp=2", "--set", "mesh.dp_shard=2", "--set", "data.batch_size=4"});
}

// Pipeline stages: each rank saves the parameters of its stages whole (the tied table on both of
// its ranks) with their AdamW moments. 2 stages of 1F1B over 2 micro-batches of 4 rows resume bit
// for bit.
const std::vector<std::string> kTwoStages = {"--set", "mesh.pp=2", "--set", "data.batch_size=4", "--set",
                                             "training.grad_accum=2"};

const std::vector<std::string> kTwoShardedStages = {"--set", "mesh.pp=2", "--set", "mesh.dp_shard=2", "--set",
                                                    "data.batch_size=2", "--set", "training.grad_accum=2"};

TEST_F(ResumeTest, PipelineStagesKilledAfterACheckpointEndWithTheUninterruptedLosses) {
  KillAndResume(2, kTwoStages);
}

// PipeMare: a checkpoint drains the pipeline (the micro-batches in flight run their backwards and
// updates) and resets the correction's velocity, so the resumed run, which fills the pipeline
// anew, continues as the uninterrupted one (checkpointing at the same steps) does.
TEST_F(ResumeTest, PipeMareStagesKilledAfterACheckpointEndWithTheUninterruptedLosses) {
  KillAndResume(2,
                {"--set", "mesh.pp=2", "--set", "data.batch_size=4", "--set", "training.grad_accum=2", "--set",
                 "pipeline.schedule=pipemare", "--set", "model.tie_word_embeddings=false"},
                0, /*whole_checkpoints=*/true);
}

// FSDP inside the stages: each rank saves its dp_shard run of its stages' flat group.
TEST_F(ResumeTest, ShardedPipelineStagesKilledAfterACheckpointEndWithTheUninterruptedLosses) {
  KillAndResume(4, kTwoShardedStages);
}

// Compiled: the program carries FSDP's ops (ag, rs); the checkpoint is the eager one's.
TEST_F(ResumeTest, CompiledShardedPipelineStagesKilledAfterACheckpointEndWithTheUninterruptedLosses) {
  std::vector<std::string> compiled = kTwoShardedStages;
  compiled.insert(compiled.end(), {"--set", "fsdp.mode=compiled", "--set", "pipeline.schedule=zb-h1"});
  KillAndResume(4, compiled);
}

// 3-D: 2 stages x dp_shard 2 x tp 2 over 8 ranks; a rank's pieces are runs of its tensor parallel
// slices (column blocks for o_proj and down_proj).
TEST_F(ResumeTest, ThreeDimensionalMeshKilledAfterACheckpointEndsWithTheUninterruptedLosses) {
  KillAndResume(8, {"--set", "mesh.pp=2", "--set", "mesh.dp_shard=2", "--set", "mesh.tp=2", "--set", "data.batch_size=2",
                    "--set", "training.grad_accum=2"});
}

// A checkpoint of pipeline stages reshards as any other: FSDP over 2 ranks, then 2 stages with
// FSDP inside over 2 ranks each, then 2 stages with tensor parallelism inside over 2 ranks each,
// then one process to the end (8 rows a step throughout) ends with the losses of FSDP over 2 ranks
// never interrupted, to fp32 rounding.
TEST_F(ResumeTest, ReshardedThroughPipelineStagesEndsWithTheUninterruptedLosses) {
  const std::vector<std::string> tensor_parallel = {"--set", "mesh.pp=2", "--set", "mesh.tp=2", "--set",
                                                    "data.batch_size=4", "--set", "training.grad_accum=2"};
  ReshardThrough({2, {}}, {{2, {}}, {4, kTwoShardedStages}, {4, tensor_parallel}}, {1, {}},
                 "resharded: the checkpoint was written by world size 4 (pp 2 x dp_replicate 1 x dp_shard 1 x tp 2), "
                 "this run is 1 (1 x 1 x 1 x 1)",
                 1e-6);
}

// checkpoint.async, killed at every phase of the save of step 8 (before the copy, while the
// thread writes, before `latest` moves): `latest` stays on step 4, and the rerun, resuming from
// it, ends with the uninterrupted losses bit for bit.
TEST_F(ResumeTest, AsyncSaveKilledAtEveryPhaseLeavesTheLastCompleteCheckpoint) {
  const std::vector<std::string> async = {"--set", "checkpoint.async=true"};
  Process whole(Command("whole", 1, {}, ""), tmp_.File("whole.log"));
  ASSERT_EQ(whole.Wait(), 0) << ReadBytes(tmp_.File("whole.log"));
  const auto want = Losses(tmp_.File("whole.jsonl"));
  for (const std::string phase : {"copy", "write", "commit"}) {
    const std::string ckpt = tmp_.File("ckpt-" + phase), log = tmp_.File(phase + ".log");
    const auto cmd = Command("async-" + phase, 1, async, ckpt);
    {
      Process first(cmd, log, {{"MESHWORK_CHECKPOINT_TEST_PAUSE", phase + ":8:60"}});
      const std::string marker = "test pause at " + phase + " of step 8";
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
      while (ReadBytes(log).find(marker) == std::string::npos && first.Running() &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      ASSERT_THAT(ReadBytes(log), HasSubstr(marker));
      ::kill(first.pid(), SIGKILL);
      first.Wait();
    }
    EXPECT_EQ(ReadBytes(ckpt + "/latest"), "step-00000004\n") << phase;
    const std::string rerun_log = tmp_.File(phase + "-rerun.log");
    Process rerun(cmd, rerun_log);
    ASSERT_EQ(rerun.Wait(), 0) << ReadBytes(rerun_log);
    EXPECT_THAT(ReadBytes(rerun_log), HasSubstr("(step 4 of " + std::to_string(kSteps) + ")")) << phase;
    EXPECT_THAT(ReadBytes(rerun_log), HasSubstr("in the background; the step stalled")) << phase;
    const auto got = Losses(tmp_.File("async-" + phase + ".jsonl"));
    ASSERT_EQ(got.size(), static_cast<size_t>(kSteps)) << phase;
    for (int step = 1; step <= kSteps; ++step) EXPECT_EQ(got.at(step), want.at(step)) << phase << " step " << step;
  }
}

TEST_F(ResumeTest, ACheckpointOfAnotherModelIsExitCode3NamingTheDifference) {
  const std::string ckpt = tmp_.File("ckpt");
  Process one(Command("one", 1, {"--set", "schedule.steps=2", "--set", "schedule.warmup_steps=1"}, ckpt),
              tmp_.File("one.log"));
  ASSERT_EQ(one.Wait(), 0) << ReadBytes(tmp_.File("one.log"));
  Process two(Command("two", 2, {"--set", "model.intermediate_size=96"}, ckpt), tmp_.File("two.log"));
  EXPECT_EQ(two.Wait(), 3) << ReadBytes(tmp_.File("two.log"));
  const std::string log = ReadBytes(tmp_.File("two.log"));
  EXPECT_THAT(log, HasSubstr("model.intermediate_size 90 in the checkpoint, 96 in this run"));
  EXPECT_THAT(log, HasSubstr(ckpt + "/step-00000002"));
}

// --- model.init_from at any mesh --------------------------------------------------------------

// An HF checkpoint imported by every rank of a sharded run, each reading only its pieces (FSDP's
// runs, tensor parallelism's slices and column blocks) trains as the same import on one process.
class HfImportTest : public ResumeTest {
 protected:
  // The checkpoint: 3 steps of training exported in bf16 (so its weights are not the seed's
  // initialisation, and the import converts them).
  std::string Export() {
    const std::string hf = tmp_.File("hf");
    Process source(Command("source", 1,
                           {"--set", "schedule.steps=3", "--set", "schedule.warmup_steps=1", "--set",
                            "checkpoint.export_hf=" + hf, "--set", "checkpoint.export_dtype=bf16"},
                           ""),
                   tmp_.File("source.log"));
    EXPECT_EQ(source.Wait(), 0) << ReadBytes(tmp_.File("source.log"));
    return hf;
  }
};

TEST_F(HfImportTest, EveryMeshTrainsAsOneProcessReadingItsShare) {
  const std::string hf = Export();

  struct Mesh {
    std::string name;
    int nproc;
    std::vector<std::string> extra;
    // What rank 0 may read of the checkpoint, in percent: about its share; the replicated norms,
    // and a tp rank's FSDP-sharded slice, add a little.
    double most = 60;
  };
  const std::vector<Mesh> meshes = {
      {"one", 1, {}},
      {"fsdp2", 2, {}},
      {"compiled2", 2, {"--set", "fsdp.mode=compiled"}},
      {"tp2", 2, {"--set", "mesh.tp=2", "--set", "data.batch_size=8"}},
      {"fsdp2_tp2", 4, {"--set", "mesh.tp=2", "--set", "mesh.dp_shard=2", "--set", "data.batch_size=4"}},
      // Two pipeline stages, 1F1B over 2 micro-batches of 4 rows: the tied table is held by the
      // first stage (embedding) and the last (head), and both copies must be the import's. Rank 0
      // reads the table (half of this model) and its layer, not the other stage's.
      {"pp2", 2, {"--set", "mesh.pp=2", "--set", "data.batch_size=4", "--set", "training.grad_accum=2"}, 75},
      {"pp2_dp2", 4,
       {"--set", "mesh.pp=2", "--set", "mesh.dp_replicate=2", "--set", "data.batch_size=2", "--set",
        "training.grad_accum=2"},
       75},
      // FSDP inside the stages: rank 0 reads half of its stage.
      {"pp2_fsdp2", 4,
       {"--set", "mesh.pp=2", "--set", "mesh.dp_shard=2", "--set", "data.batch_size=2", "--set",
        "training.grad_accum=2"},
       40},
      // Tensor parallelism inside them: its slices of its stage (the norms whole).
      {"pp2_tp2", 4,
       {"--set", "mesh.pp=2", "--set", "mesh.tp=2", "--set", "data.batch_size=4", "--set", "training.grad_accum=2"},
       40},
  };
  constexpr int kImportSteps = 6;
  std::map<std::string, std::map<int, std::string>> losses;
  for (const Mesh& mesh : meshes) {
    std::vector<std::string> extra = {"--set", "schedule.steps=" + std::to_string(kImportSteps), "--set",
                                      "model.init_from=" + hf};
    extra.insert(extra.end(), mesh.extra.begin(), mesh.extra.end());
    const std::string log_path = tmp_.File(mesh.name + ".log");
    Process run(Command(mesh.name, mesh.nproc, extra, ""), log_path);
    ASSERT_EQ(run.Wait(), 0) << mesh.name << ":\n" << ReadBytes(log_path);
    const std::string log = ReadBytes(log_path);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(log, m, std::regex("loaded weights from \\S+: this rank read .* of its .* "
                                                     "\\(([0-9.]+)%\\)")))
        << mesh.name << ":\n" << log;
    const double percent = std::stod(m[1]);
    std::cout << mesh.name << ": " << m[0] << "\n";
    if (mesh.nproc == 1) {
      EXPECT_EQ(percent, 100);
    } else {
      EXPECT_LT(percent, mesh.most) << mesh.name;
    }
    losses[mesh.name] = Losses(tmp_.File(mesh.name + ".jsonl"));
    ASSERT_EQ(losses[mesh.name].size(), static_cast<size_t>(kImportSteps)) << mesh.name;
  }

  // Without the import the same run starts elsewhere: the weights were read, not the seed's.
  Process scratch(Command("scratch", 1, {"--set", "schedule.steps=1", "--set", "schedule.warmup_steps=0"}, ""),
                  tmp_.File("scratch.log"));
  ASSERT_EQ(scratch.Wait(), 0) << ReadBytes(tmp_.File("scratch.log"));
  EXPECT_NE(Losses(tmp_.File("scratch.jsonl")).at(1), losses["one"].at(1));

  for (const Mesh& mesh : meshes) {
    for (int step = 1; step <= kImportSteps; ++step) {
      const double want = std::stod(losses["one"].at(step)), got = std::stod(losses[mesh.name].at(step));
      EXPECT_NEAR(got, want, 1e-5 * std::abs(want)) << mesh.name << " step " << step;
    }
  }
}

// A run that resumes from its own checkpoint takes every weight from it: the import is not read
// (on every gang restart of a large model it would cost minutes); both ranks decide alike.
TEST_F(HfImportTest, ARunThatResumesDoesNotReadTheImport) {
  const std::string hf = Export();
  const std::string ckpt = tmp_.File("ckpt");
  const std::vector<std::string> from = {"--set", "model.init_from=" + hf, "--set", "schedule.warmup_steps=1"};
  std::vector<std::string> first = from, second = from;
  first.insert(first.end(), {"--set", "schedule.steps=" + std::to_string(kEvery)});
  second.insert(second.end(), {"--set", "schedule.steps=" + std::to_string(kEvery + 2)});
  Process one(Command("first", 2, first, ckpt), tmp_.File("first.log"));
  ASSERT_EQ(one.Wait(), 0) << ReadBytes(tmp_.File("first.log"));
  EXPECT_THAT(ReadBytes(tmp_.File("first.log")), HasSubstr("loaded weights from " + hf));
  Process two(Command("second", 2, second, ckpt), tmp_.File("second.log"));
  ASSERT_EQ(two.Wait(), 0) << ReadBytes(tmp_.File("second.log"));
  const std::string log = ReadBytes(tmp_.File("second.log"));
  EXPECT_THAT(log, HasSubstr("model.init_from " + hf + ": not read, the run resumes from " + ckpt + "/latest"));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("loaded weights from")));
  EXPECT_THAT(log, HasSubstr("resumed from " + ckpt + "/step-0000000" + std::to_string(kEvery)));
}

// --- train --config-env -----------------------------------------------------------------------

TEST(ConfigEnvFlag, ReadsTheConfigFromTheVariableWithSetOnTop) {
  TempDir tmp;
  Process p({kTrainer, "config", "--config-env", "MW_CFG", "--set", "schedule.steps=7"}, tmp.File("log"),
            {{"MW_CFG", "schedule:\n  steps: 3\ncheckpoint:\n  dir: /ckpt\n  every: 2\n"}});
  ASSERT_EQ(p.Wait(), 0) << ReadBytes(tmp.File("log"));
  const std::string out = ReadBytes(tmp.File("log"));
  EXPECT_THAT(out, HasSubstr("steps: 7"));
  EXPECT_THAT(out, HasSubstr("dir: /ckpt"));
  EXPECT_THAT(out, HasSubstr("every: 2"));
}

TEST(ConfigEnvFlag, WithConfigTooIsAUsageError) {
  TempDir tmp;
  Process p({kTrainer, "train", "--config", "run.yaml", "--config-env", "MW_CFG"}, tmp.File("log"),
            {{"MW_CFG", "schedule:\n  steps: 3\n"}});
  EXPECT_EQ(p.Wait(), 2);
  EXPECT_THAT(ReadBytes(tmp.File("log")), HasSubstr("--config run.yaml and --config-env MW_CFG both name the config"));
}

TEST(ConfigEnvFlag, UnsetOrEmptyVariableIsExitCode2NamingIt) {
  TempDir tmp;
  ::unsetenv("MW_CFG_UNSET");
  Process unset({kTrainer, "train", "--config-env", "MW_CFG_UNSET"}, tmp.File("unset.log"));
  EXPECT_EQ(unset.Wait(), 2);
  EXPECT_THAT(ReadBytes(tmp.File("unset.log")),
              HasSubstr("--config-env MW_CFG_UNSET: environment variable 'MW_CFG_UNSET' is not set"));
  Process empty({kTrainer, "train", "--config-env", "MW_CFG"}, tmp.File("empty.log"), {{"MW_CFG", ""}});
  EXPECT_EQ(empty.Wait(), 2);
  EXPECT_THAT(ReadBytes(tmp.File("empty.log")), HasSubstr("'MW_CFG' is empty"));
}

TEST(ConfigEnvFlag, AnErrorInTheTextNamesTheVariableAndKey) {
  TempDir tmp;
  Process p({kTrainer, "train", "--config-env", "MW_CFG"}, tmp.File("log"), {{"MW_CFG", "checkpoint:\n  keep: 0\n"}});
  EXPECT_EQ(p.Wait(), 2);
  EXPECT_THAT(ReadBytes(tmp.File("log")), HasSubstr("env MW_CFG: key 'checkpoint.keep': must be"));
}

}  // namespace
}  // namespace meshwork
