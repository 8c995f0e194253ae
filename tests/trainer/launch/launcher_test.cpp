// The per-pod launcher with /bin/sh ranks: rank environment, teardown when one rank fails or is
// killed, exit-code propagation, and command-line parsing.
#include "trainer/launch/launcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/common/temp_dir.h"

namespace meshwork::launch {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using meshwork::testing::ReadBytes;
using meshwork::testing::TempDir;

LaunchOptions ShellRanks(int nproc, const std::string& script) {
  LaunchOptions o;
  o.nproc = nproc;
  o.command = {"/bin/sh", "-c", script};
  return o;
}

bool Alive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

TEST(RunLauncherTest, EveryRankGetsItsEnvironment) {
  TempDir dir;
  LaunchOptions o = ShellRanks(
      3, "echo $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT "
         "$MESHWORK_RANK $MESHWORK_WORLD_SIZE $MESHWORK_LOCAL_RANK $MESHWORK_MASTER_PORT > " +
             dir.path() + "/rank_$LOCAL_RANK");
  o.nnodes = 2;
  o.node_rank = 1;
  o.master_addr = "trainer-0.example";
  o.master_port = 31337;
  std::ostringstream log;
  EXPECT_EQ(RunLauncher(o, log), 0) << log.str();
  for (int i = 0; i < 3; ++i) {
    const std::string rank = std::to_string(3 + i);
    EXPECT_EQ(ReadBytes(dir.File("rank_" + std::to_string(i))),
              rank + " " + std::to_string(i) + " 6 3 trainer-0.example 31337 " + rank + " 6 " +
                  std::to_string(i) + " 31337\n");
  }
}

// All ranks on one node share a token of this launch, and the next launch draws another: a rank
// of one cannot join the other's store on a reused port. A token in the environment (the
// operator's) is passed on, and ranks on several nodes, whose launchers cannot agree on a drawn
// token, get none.
TEST(RunLauncherTest, RanksOfOneLaunchShareARendezvousTokenOfTheirOwn) {
  TempDir dir;
  ::unsetenv("MESHWORK_RENDEZVOUS_TOKEN");
  auto tokens = [&](const std::string& launch, int nnodes) {
    LaunchOptions o = ShellRanks(2, "echo \"$MESHWORK_RENDEZVOUS_TOKEN\" > " + dir.path() + "/" + launch + "_$LOCAL_RANK");
    o.nnodes = nnodes;
    std::ostringstream log;
    EXPECT_EQ(RunLauncher(o, log), 0) << log.str();
    return std::vector<std::string>{ReadBytes(dir.File(launch + "_0")), ReadBytes(dir.File(launch + "_1"))};
  };
  const auto first = tokens("first", 1);
  EXPECT_EQ(first[0].size(), 33u) << first[0];  // 32 hex digits and the newline
  EXPECT_EQ(first[0], first[1]);
  const auto second = tokens("second", 1);
  EXPECT_EQ(second[0], second[1]);
  EXPECT_NE(first[0], second[0]);
  EXPECT_EQ(tokens("nodes", 2), (std::vector<std::string>{"\n", "\n"}));
  ::setenv("MESHWORK_RENDEZVOUS_TOKEN", "from-the-secret", 1);
  EXPECT_EQ(tokens("set", 1), (std::vector<std::string>{"from-the-secret\n", "from-the-secret\n"}));
  ::unsetenv("MESHWORK_RENDEZVOUS_TOKEN");
}

TEST(RunLauncherTest, FailingRankStopsTheOthersAndPropagatesItsExitCode) {
  TempDir dir;
  // Rank 1 fails once the sleepers have written their pids; `exec` makes the pid the sleeper's.
  LaunchOptions o = ShellRanks(
      3, "if [ $LOCAL_RANK = 1 ]; then sleep 0.3; exit 3; fi; echo $$ > " + dir.path() +
             "/pid_$LOCAL_RANK; exec sleep 60");
  std::ostringstream log;
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(RunLauncher(o, log), 3);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(took, 15.0);  // SIGTERM stops `sleep` at once; 60 s would mean nobody was stopped
  EXPECT_THAT(log.str(), HasSubstr("rank 1 (pid"));
  EXPECT_THAT(log.str(), HasSubstr("exited with code 3"));
  for (int i : {0, 2}) {
    std::string pid_text = ReadBytes(dir.File("pid_" + std::to_string(i)));
    ASSERT_FALSE(pid_text.empty()) << "rank " << i << " never started";
    pid_t pid = std::stoi(pid_text);
    EXPECT_FALSE(Alive(pid)) << "rank " << i << " (pid " << pid << ") outlived the launcher";
  }
}

TEST(RunLauncherTest, RankIgnoringSigtermIsKilledAfterTheGracePeriod) {
  TempDir dir;
  LaunchOptions o = ShellRanks(
      2, "if [ $LOCAL_RANK = 1 ]; then sleep 0.3; exit 4; fi; trap '' TERM; echo $$ > " +
             dir.path() + "/pid; while true; do sleep 0.1; done");
  o.grace_period = std::chrono::milliseconds(500);
  std::ostringstream log;
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(RunLauncher(o, log), 4);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(took, 10.0);
  EXPECT_THAT(log.str(), HasSubstr("SIGKILL"));
  pid_t pid = std::stoi(ReadBytes(dir.File("pid")));
  EXPECT_FALSE(Alive(pid));
}

TEST(RunLauncherTest, KilledRankReturns128PlusSignalAndNamesIt) {
  LaunchOptions o = ShellRanks(2, "if [ $LOCAL_RANK = 0 ]; then kill -9 $$; fi; exec sleep 60");
  std::ostringstream log;
  EXPECT_EQ(RunLauncher(o, log), 137);
  EXPECT_THAT(log.str(), AllOf(HasSubstr("rank 0 (pid"),
                               HasSubstr("was killed by signal 9 (SIGKILL)")));
}

TEST(RunLauncherTest, AllRanksSucceedingReturnsZero) {
  std::ostringstream log;
  EXPECT_EQ(RunLauncher(ShellRanks(4, "exit 0"), log), 0);
  EXPECT_EQ(log.str(), "");
}

TEST(RunLauncherTest, MissingExecutableIsReportedAs127) {
  LaunchOptions o;
  o.nproc = 1;
  o.command = {"/nonexistent/meshwork-train"};
  std::ostringstream log;
  EXPECT_EQ(RunLauncher(o, log), 127);
  EXPECT_THAT(log.str(), HasSubstr("cannot execute '/nonexistent/meshwork-train'"));
}

TEST(ParseLaunchArgsTest, ParsesFlagsAndCommand) {
  auto r = ParseLaunchArgs({"--nproc", "4", "--nnodes=2", "--node-rank", "1", "--master-addr",
                            "trainer-0.svc", "--master-port", "1234", "--grace-period-s", "3",
                            "--", "meshwork-train", "--config", "x.yaml"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->nproc, 4);
  EXPECT_EQ(r->nnodes, 2);
  EXPECT_EQ(r->node_rank, 1);
  EXPECT_EQ(r->master_addr, "trainer-0.svc");
  EXPECT_EQ(r->master_port, 1234);
  EXPECT_EQ(r->grace_period, std::chrono::seconds(3));
  EXPECT_EQ(r->command, (std::vector<std::string>{"meshwork-train", "--config", "x.yaml"}));
}

TEST(ParseLaunchArgsTest, CommandStartsAtFirstNonFlag) {
  auto r = ParseLaunchArgs({"--nproc-per-node", "2", "meshwork-train", "--nproc", "9"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->nproc, 2);
  EXPECT_EQ(r->command, (std::vector<std::string>{"meshwork-train", "--nproc", "9"}));
}

struct BadArgs {
  std::vector<std::string> args;
  std::vector<std::string> expected;
};

class ParseLaunchArgsErrorTest : public ::testing::TestWithParam<BadArgs> {};

TEST_P(ParseLaunchArgsErrorTest, IsInvalidConfigNamingFlagAndValue) {
  auto r = ParseLaunchArgs(GetParam().args);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidConfig);
  for (const auto& s : GetParam().expected) EXPECT_THAT(r.status().message(), HasSubstr(s));
}

INSTANTIATE_TEST_SUITE_P(
    Table, ParseLaunchArgsErrorTest,
    ::testing::Values(
        BadArgs{{}, {"no command"}},
        BadArgs{{"--nproc", "2"}, {"no command"}},
        BadArgs{{"--nproc", "2", "--"}, {"no command"}},
        BadArgs{{"--nproc", "two", "x"}, {"--nproc", "'two'", "not an integer"}},
        BadArgs{{"--nproc", "0", "x"}, {"--nproc 0", "out of range"}},
        BadArgs{{"--nnodes", "-1", "x"}, {"--nnodes -1"}},
        BadArgs{{"--master-port", "70000", "x"}, {"--master-port 70000", "out of range"}},
        BadArgs{{"--master-port=abc", "x"}, {"--master-port 'abc'"}},
        BadArgs{{"--master-addr=", "x"}, {"--master-addr"}},
        BadArgs{{"--node-rank", "2", "--nnodes", "2", "x"}, {"--node-rank 2", "--nnodes 2"}},
        // In range one by one, but 2048 x 2^20 ranks overflowed RANK and WORLD_SIZE.
        BadArgs{{"--nproc", "2048", "--nnodes", "1048576", "x"}, {"--nnodes 1048576 x --nproc 2048"}},
        BadArgs{{"--nproc"}, {"--nproc needs a value"}},
        BadArgs{{"--bogus", "1", "x"}, {"unknown flag '--bogus'"}}));

}  // namespace
}  // namespace meshwork::launch
