// The per-pod launcher, like torchrun --nproc-per-node: starts one process per local rank with
// its rank environment, forwards SIGINT/SIGTERM, and when one rank fails stops all the others
// so the pod exits with the failing rank's code.
#pragma once

#include <chrono>
#include <ostream>
#include <string>
#include <vector>

#include "common/status.h"

namespace meshwork::launch {

struct LaunchOptions {
  int nproc = 1;      // processes on this node
  int node_rank = 0;  // this node's index among nnodes
  int nnodes = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // After a failure, how long the other ranks get between SIGTERM and SIGKILL.
  std::chrono::milliseconds grace_period{std::chrono::seconds(10)};
  std::vector<std::string> command;  // argv of each rank (searched in PATH)
};

// `--nproc N --nnodes N --node-rank N --master-addr A --master-port P --grace-period-s S
// [--] COMMAND...` (also `--flag=value`, and torchrun's `--nproc-per-node`). The first
// argument that is not a flag starts the command. A bad flag or value, or no command, is
// kInvalidConfig naming the flag and value.
Result<LaunchOptions> ParseLaunchArgs(const std::vector<std::string>& args);

// Runs nproc children, each in its own process group with RANK = node_rank·nproc + i,
// WORLD_SIZE = nnodes·nproc, LOCAL_RANK = i, LOCAL_WORLD_SIZE = nproc, MASTER_ADDR,
// MASTER_PORT and the MESHWORK_* equivalents added to this process's environment, and
// MESHWORK_RENDEZVOUS_TOKEN: the environment's, else, when nnodes is 1, one drawn for this launch
// (so that another launch's ranks on the same port are refused by rank 0's store).
// Returns 0 when every rank exits 0. When a rank exits non-zero or is killed, logs which rank
// and how, sends SIGTERM to the others, SIGKILL after the grace period, and returns that
// rank's exit code, or 128 + signal if it was killed (127 if the command cannot be executed).
// Children get PR_SET_PDEATHSIG(SIGKILL): call this from the thread that lives as long as
// the launch (the main thread), since the kernel ties that signal to the parent thread.
int RunLauncher(const LaunchOptions& options, std::ostream& log);

}  // namespace meshwork::launch
