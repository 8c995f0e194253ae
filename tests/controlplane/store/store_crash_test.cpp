// Crash test for the store: a child process writes in a loop and reports each acknowledged write
// on a pipe; it is SIGKILLed mid-stream, and every acknowledged write must be there on reopen.
#include "controlplane/store/store.h"

#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <set>

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

namespace meshwork::controlplane {
namespace {

using nlohmann::json;

// The child: opens the store, creates then updates keys forever, printing "c <i>\n" after each
// acknowledged Create and "u <i>\n" after each acknowledged Update. Never returns.
[[noreturn]] void ChildWriter(const std::string& dir, int out_fd, bool fsync, int first) {
  StoreOptions o;
  o.fsync = fsync;
  o.snapshot_every = 97;  // snapshots (and WAL truncations) happen mid-run too
  o.log = [](const std::string&) {};
  auto store = Store::Open(dir, o);
  if (!store.ok()) _exit(3);
  for (int i = first;; ++i) {
    std::string key = "pods/default/p" + std::to_string(i);
    json pod = {{"metadata", {{"name", key}}}, {"spec", {{"n", i}, {"pad", std::string(200, 'x')}}}};
    if (!store.value()->Create(key, pod).ok()) _exit(4);
    std::string line = "c " + std::to_string(i) + "\n";
    if (::write(out_fd, line.data(), line.size()) < 0) _exit(5);
    if (i % 5 == 0) {
      pod["spec"]["updated"] = true;
      if (!store.value()->Update(key, pod, 0).ok()) _exit(6);
      line = "u " + std::to_string(i) + "\n";
      if (::write(out_fd, line.data(), line.size()) < 0) _exit(5);
    }
  }
}

void RunCrash(bool fsync, int kill_after_acks) {
  std::string tmpl = ::testing::TempDir() + "/meshwork-crash-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const std::string dir = tmpl;
  std::set<int> deleted;
  for (int round = 0; round < 3; ++round) {  // each round continues the same directory
    SCOPED_TRACE("round " + std::to_string(round));
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      ChildWriter(dir, fds[1], fsync, round * 1000000);  // fresh keys each round
    }
    ::close(fds[1]);
    std::string acks;
    int lines = 0;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (lines < kill_after_acks && std::chrono::steady_clock::now() < deadline) {
      pollfd p{fds[0], POLLIN, 0};
      if (::poll(&p, 1, 1000) <= 0) continue;
      char buf[4096];
      ssize_t n = ::read(fds[0], buf, sizeof(buf));
      if (n <= 0) break;
      acks.append(buf, static_cast<size_t>(n));
      lines = static_cast<int>(std::count(acks.begin(), acks.end(), '\n'));
    }
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer exited by itself with " << WEXITSTATUS(status)
                                     << " (3: open failed, 4: create failed, 6: update failed)";
    // Whatever the child wrote to the pipe before dying was acknowledged by the store.
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) acks.append(buf, static_cast<size_t>(n));
    ::close(fds[0]);
    ASSERT_GE(lines, kill_after_acks) << "the writer was too slow";

    std::set<int> created, updated;
    size_t start = 0;
    while (true) {
      size_t nl = acks.find('\n', start);
      if (nl == std::string::npos) break;
      std::string line = acks.substr(start, nl - start);
      start = nl + 1;
      (line[0] == 'c' ? created : updated).insert(std::stoi(line.substr(2)));
    }
    StoreOptions o;
    o.fsync = fsync;
    auto reopened = Store::Open(dir, o);
    ASSERT_TRUE(reopened.ok()) << reopened.error().ToString();
    Store& store = *reopened.value();
    for (int i : created) {
      auto obj = store.Get("pods/default/p" + std::to_string(i));
      ASSERT_TRUE(obj.has_value()) << "acknowledged create " << i << " was lost";
      EXPECT_EQ((*obj)["spec"]["n"], i);
    }
    for (int i : updated) {
      auto obj = store.Get("pods/default/p" + std::to_string(i));
      ASSERT_TRUE(obj.has_value());
      EXPECT_EQ((*obj)["spec"].value("updated", false), true) << "acknowledged update " << i << " was lost";
    }
    // Revisions stay consistent: every stored object's revision is at most the store's.
    EXPECT_GE(store.Revision(), created.size() + updated.size());
    for (const auto& item : store.List("pods/").items) EXPECT_LE(ObjectRevision(item), store.Revision());
    // Deletes after a crash are durable too; the next round checks they stay deleted.
    for (int i : created) {
      if (i % 10 != 1) continue;
      ASSERT_TRUE(store.Delete("pods/default/p" + std::to_string(i), 0).ok());
      deleted.insert(i);
    }
    for (int i : deleted) EXPECT_FALSE(store.Get("pods/default/p" + std::to_string(i)).has_value());
  }
  std::filesystem::remove_all(dir);
}

TEST(StoreCrashTest, SigkillLosesNoAcknowledgedWriteWithFsync) { RunCrash(/*fsync=*/true, 300); }

TEST(StoreCrashTest, SigkillLosesNoAcknowledgedWriteWithoutFsync) { RunCrash(/*fsync=*/false, 3000); }

}  // namespace
}  // namespace meshwork::controlplane
