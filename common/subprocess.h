// Starting a child process the way every Meshwork supervisor does (the rank launcher, the node
// agent): a child, a fixed list of steps in it, exec, and a close-on-exec pipe that carries
// the failing step and its errno back, so "cannot exec" is an error of the caller, not a child
// that silently exits 127.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace meshwork {

struct SpawnOptions {
  std::string program;             // a path, or a name when search_path; "": argv[0]
  std::vector<std::string> argv;
  std::vector<std::string> env;   // "NAME=value": the child's whole environment
  bool search_path = false;       // look argv[0] up in the child's PATH (execvpe)

  // The child leads a new process group (so signalling -pid reaches its helpers), or a new
  // session (no controlling terminal either).
  bool new_session = false;

  // Own mount and UTS namespaces, `hosts_file` bind-mounted over /etc/hosts and `hostname` set.
  // Needs CAP_SYS_ADMIN; both empty: the parent's.
  std::string hosts_file;
  std::string hostname;
  // With its own mount namespace: a mount point detached there (not in the parent's namespace),
  // so that the child's copy of the mount table does not pin what is mounted under it. A path
  // that is not a mount point is ignored.
  std::string detach_mount;
  // A network namespace to join (a file pinning one, as `ip netns` makes them), before anything
  // else; empty: the parent's. Needs CAP_SYS_ADMIN.
  std::string netns;

  // Descriptors dup'ed onto 0, 1 and 2; -1 leaves the inherited one.
  int stdin_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
  bool close_other_fds = false;  // close every inherited descriptor above 2
  std::string working_dir;       // "": the parent's

  // What the child exits with when a step fails (the parent learns the step through the pipe).
  int failure_exit_code = 127;
};

// Why a child did not reach its program.
struct SpawnFailure {
  std::string step;  // "pipe", "fork", "unshare(mount, uts namespace)", ..., "chdir", "exec"
  int error = 0;     // errno
  std::string ToString() const;
};

struct Spawned {
  // The child, also when a step after fork failed: it has then exited with failure_exit_code
  // and is the caller's to reap. -1 when there is no child (pipe or fork failed).
  pid_t pid = -1;
  std::optional<SpawnFailure> failure;
  bool ok() const { return pid > 0 && !failure; }
};

// Starts a child (sharing this process's memory until it execs, as posix_spawn does, so the cost
// does not grow with the parent's size) and runs its steps in this order: new group or session; SIGKILL when the parent
// dies (PR_SET_PDEATHSIG; the calling thread must outlive the child); empty signal mask and
// default dispositions; network namespace; mount and UTS namespaces; stdio; close other descriptors; working directory; exec.
// Returns once the exec has succeeded or a step has failed. Everything the child touches is
// prepared before the child starts, so the child only makes system calls.
Spawned SpawnProcess(const SpawnOptions& options);

// What a command wrote, and how it ended.
struct Captured {
  int exit_code = 0;  // 128 + the signal when a signal ended it
  std::string out;    // stdout (and stderr with merge_stderr)
  std::string err;    // stderr, unless merged
};

// Runs `options` with its stdin, stdout and stderr replaced by pipes (its other descriptors
// closed): `input` is written to stdin while what it writes is collected, until it exits (a
// child that closes stdin early is not an error, and raises no SIGPIPE here). After `timeout`,
// counted from the start, it is killed with its process group (it leads one). Unavailable when it
// cannot start, runs past the timeout, or was reaped elsewhere (SIGCHLD ignored).
Result<Captured> RunCaptured(SpawnOptions options, const std::string& input, std::chrono::milliseconds timeout,
                             bool merge_stderr = false);

}  // namespace meshwork
