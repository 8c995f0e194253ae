// SpawnProcess with real processes: the exec, its environment and stdio, and each way a start
// fails coming back as the failing step and its errno (not as a child that exits 127 unnoticed).
#include "common/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/common/temp_dir.h"

namespace meshwork {
namespace {

int Reap(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(SpawnProcess, RunsTheProgramWithExactlyItsEnvironmentAndStdio) {
  testing::TempDir dir;
  const std::string log = dir.path() + "/out.log";
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "echo \"$GREETING from $(pwd)\"; echo err >&2; test -z \"$HOME\""};
  o.env = {"GREETING=hello", "PATH=/usr/bin:/bin"};
  o.stdout_fd = o.stderr_fd = fd;
  o.working_dir = dir.path();
  Spawned child = SpawnProcess(o);
  ::close(fd);
  ASSERT_TRUE(child.ok()) << child.failure->ToString();
  EXPECT_EQ(Reap(child.pid), 0) << "the child saw a HOME it was not given";
  EXPECT_EQ(ReadAll(log), "hello from " + dir.path() + "\nerr\n");
}

TEST(SpawnProcess, SearchesPathOnlyWhenAsked) {
  SpawnOptions o;
  o.argv = {"true"};
  o.env = {"PATH=/usr/bin:/bin"};
  Spawned direct = SpawnProcess(o);
  ASSERT_TRUE(direct.failure.has_value());
  EXPECT_EQ(direct.failure->step, "exec");
  EXPECT_EQ(direct.failure->error, ENOENT);
  ASSERT_GT(direct.pid, 0) << "a failed exec still leaves a child to reap";
  EXPECT_EQ(Reap(direct.pid), 127);

  o.search_path = true;
  Spawned searched = SpawnProcess(o);
  ASSERT_TRUE(searched.ok()) << searched.failure->ToString();
  EXPECT_EQ(Reap(searched.pid), 0);
}

TEST(SpawnProcess, AProgramOtherThanArgvZeroRuns) {
  SpawnOptions o;
  o.program = "/bin/sh";
  o.argv = {"renamed", "-c", "exit 7"};
  Spawned child = SpawnProcess(o);
  ASSERT_TRUE(child.ok());
  EXPECT_EQ(Reap(child.pid), 7);
}

TEST(SpawnProcess, AMissingWorkingDirectoryIsTheChdirStep) {
  SpawnOptions o;
  o.argv = {"/bin/true"};
  o.working_dir = "/nonexistent/meshwork";
  o.failure_exit_code = 99;
  Spawned child = SpawnProcess(o);
  ASSERT_TRUE(child.failure.has_value());
  EXPECT_EQ(child.failure->step, "chdir");
  EXPECT_EQ(child.failure->error, ENOENT);
  EXPECT_EQ(child.failure->ToString(), "chdir: No such file or directory");
  EXPECT_EQ(Reap(child.pid), 99);
}

TEST(SpawnProcess, ANonExecutableFileIsEacces) {
  testing::TempDir dir;
  const std::string script = dir.path() + "/not-executable";
  std::ofstream(script) << "#!/bin/sh\nexit 0\n";
  SpawnOptions o;
  o.argv = {script};
  Spawned child = SpawnProcess(o);
  ASSERT_TRUE(child.failure.has_value());
  EXPECT_EQ(child.failure->step, "exec");
  EXPECT_EQ(child.failure->error, EACCES);
  Reap(child.pid);
}

TEST(SpawnProcess, NoArgvIsAnErrorWithoutAChild) {
  Spawned child = SpawnProcess(SpawnOptions{});
  ASSERT_TRUE(child.failure.has_value());
  EXPECT_EQ(child.pid, -1);
}

TEST(SpawnProcess, TheChildLeadsItsOwnProcessGroupOrSession) {
  SpawnOptions o;
  o.argv = {"/bin/sleep", "5"};
  Spawned group = SpawnProcess(o);
  ASSERT_TRUE(group.ok());
  EXPECT_EQ(::getpgid(group.pid), group.pid);
  EXPECT_NE(::getsid(group.pid), group.pid);
  o.new_session = true;
  Spawned session = SpawnProcess(o);
  ASSERT_TRUE(session.ok());
  EXPECT_EQ(::getsid(session.pid), session.pid);
  ::kill(-group.pid, SIGKILL);
  ::kill(-session.pid, SIGKILL);
  EXPECT_EQ(Reap(group.pid), 128 + SIGKILL);
  EXPECT_EQ(Reap(session.pid), 128 + SIGKILL);
}

TEST(SpawnProcess, InheritedDescriptorsAreClosedWhenAsked) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);  // not close-on-exec: a child would inherit it
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "test ! -e /proc/self/fd/" + std::to_string(pipe_fds[1])};
  o.close_other_fds = true;
  Spawned closed = SpawnProcess(o);
  ASSERT_TRUE(closed.ok());
  EXPECT_EQ(Reap(closed.pid), 0);
  o.close_other_fds = false;
  Spawned inherited = SpawnProcess(o);
  ASSERT_TRUE(inherited.ok());
  EXPECT_EQ(Reap(inherited.pid), 1) << "without close_other_fds the descriptor is inherited";
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
}

TEST(RunCaptured, FeedsStdinAndCollectsBothStreams) {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "cat; echo to-err >&2; exit 3"};
  auto run = RunCaptured(o, "config text\n", std::chrono::seconds(30));
  ASSERT_TRUE(run.ok()) << run.status().message();
  EXPECT_EQ(run->exit_code, 3);
  EXPECT_EQ(run->out, "config text\n");
  EXPECT_EQ(run->err, "to-err\n");
  auto merged = RunCaptured(o, "x\n", std::chrono::seconds(30), /*merge_stderr=*/true);
  ASSERT_TRUE(merged.ok());
  EXPECT_EQ(merged->out, "x\nto-err\n");
  EXPECT_EQ(merged->err, "");
}

TEST(RunCaptured, AnInputLargerThanAPipeGoesThroughWhileItsOutputIsRead) {
  // 1 MiB in, echoed back: writing it all before reading would fill both pipes and stall.
  std::string input;
  for (int i = 0; input.size() < (1u << 20); ++i) input += "line " + std::to_string(i) + "\n";
  SpawnOptions o;
  o.argv = {"/bin/cat"};
  auto run = RunCaptured(o, input, std::chrono::seconds(60));
  ASSERT_TRUE(run.ok()) << run.status().message();
  EXPECT_EQ(run->exit_code, 0);
  EXPECT_EQ(run->out.size(), input.size());
  EXPECT_TRUE(run->out == input);
}

TEST(RunCaptured, AChildThatClosesItsStdinEarlyIsNotAnErrorHere) {
  // Without SIGPIPE handled, writing the rest would end the test process.
  std::string input(1u << 20, 'x');
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "exec 0<&-; echo done"};
  auto run = RunCaptured(o, input, std::chrono::seconds(60));
  ASSERT_TRUE(run.ok()) << run.status().message();
  EXPECT_EQ(run->exit_code, 0);
  EXPECT_EQ(run->out, "done\n");
  sigset_t pending;
  sigpending(&pending);
  EXPECT_EQ(sigismember(&pending, SIGPIPE), 0) << "a SIGPIPE was left pending";
}

TEST(RunCaptured, KillsWhatRunsPastItsTimeoutWithItsGroup) {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "sleep 30 & sleep 30"};  // a grandchild holding the pipes too
  const auto start = std::chrono::steady_clock::now();
  auto run = RunCaptured(o, "", std::chrono::milliseconds(300));
  ASSERT_FALSE(run.ok());
  EXPECT_EQ(run.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(run.status().message().find("/bin/sh did not finish within 300 ms"), std::string::npos)
      << run.status().message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));  // a bound, not a timing
}

TEST(RunCaptured, AProgramThatCannotStartIsAnError) {
  SpawnOptions o;
  o.argv = {"/nonexistent/program"};
  auto run = RunCaptured(o, "", std::chrono::seconds(5));
  ASSERT_FALSE(run.ok());
  EXPECT_NE(run.status().message().find("cannot run /nonexistent/program: exec"), std::string::npos)
      << run.status().message();
}

}  // namespace
}  // namespace meshwork
