#include "common/subprocess.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace meshwork {
namespace {

// The child's steps, as numbers it can write into the pipe.
enum Step : int {
  kNone = 0,
  kUnshare,
  kPrivateRoot,
  kBindHosts,
  kSetHostname,
  kStdio,
  kChdir,
  kExec,
  kStepCount,
};

const char* StepName(int step) {
  static const char* kNames[kStepCount] = {"start", "unshare(mount, uts namespace)", "make / private",
                                           "bind-mount /etc/hosts", "sethostname", "redirect stdio",
                                           "chdir", "exec"};
  return step > 0 && step < kStepCount ? kNames[step] : "start";
}

struct ChildError {
  int step;
  int error;
};

std::vector<char*> CStrings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

void CloseAllAbove2Except(int keep) {
  if (::syscall(SYS_close_range, 3u, static_cast<unsigned>(keep - 1), 0u) == 0 &&
      ::syscall(SYS_close_range, static_cast<unsigned>(keep + 1), ~0u, 0u) == 0) {
    return;
  }
  for (int fd = 3; fd < 65536; ++fd) {
    if (fd != keep) ::close(fd);
  }
}

}  // namespace

std::string SpawnFailure::ToString() const { return step + ": " + std::strerror(error); }

Spawned SpawnProcess(const SpawnOptions& o) {
  Spawned out;
  std::vector<char*> argv = CStrings(o.argv);
  std::vector<char*> envp = CStrings(o.env);
  const bool isolate = !o.hosts_file.empty() || !o.hostname.empty();
  const char* wd = o.working_dir.empty() ? nullptr : o.working_dir.c_str();
  const char* program = o.program.empty() ? (o.argv.empty() ? nullptr : o.argv[0].c_str()) : o.program.c_str();
  int err_pipe[2];
  if (program == nullptr) {
    out.failure = SpawnFailure{"exec", ENOENT};
    return out;
  }
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    out.failure = SpawnFailure{"pipe", errno};
    return out;
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    auto die = [&](int step) {
      ChildError ce{step, errno};
      ssize_t ignored = ::write(err_pipe[1], &ce, sizeof(ce));
      (void)ignored;
      ::_exit(o.failure_exit_code);
    };
    if (o.new_session) {
      ::setsid();
    } else {
      ::setpgid(0, 0);
    }
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(o.failure_exit_code);  // the parent died before prctl
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int s = 1; s < NSIG; ++s) ::sigaction(s, &dfl, nullptr);
    if (isolate) {
      if (::unshare(CLONE_NEWNS | CLONE_NEWUTS) != 0) die(kUnshare);
      if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) die(kPrivateRoot);
      if (!o.hosts_file.empty() &&
          ::mount(o.hosts_file.c_str(), "/etc/hosts", nullptr, MS_BIND, nullptr) != 0) {
        die(kBindHosts);
      }
      if (!o.hostname.empty() && ::sethostname(o.hostname.data(), o.hostname.size()) != 0) die(kSetHostname);
    }
    if ((o.stdin_fd >= 0 && ::dup2(o.stdin_fd, 0) < 0) || (o.stdout_fd >= 0 && ::dup2(o.stdout_fd, 1) < 0) ||
        (o.stderr_fd >= 0 && ::dup2(o.stderr_fd, 2) < 0)) {
      die(kStdio);
    }
    if (o.close_other_fds) CloseAllAbove2Except(err_pipe[1]);  // the pipe closes itself on exec
    if (wd != nullptr && ::chdir(wd) != 0) die(kChdir);
    if (o.search_path) {
      ::execvpe(program, argv.data(), envp.data());
    } else {
      ::execve(program, argv.data(), envp.data());
    }
    die(kExec);
  }
  const int fork_errno = errno;
  ::close(err_pipe[1]);
  if (pid < 0) {
    ::close(err_pipe[0]);
    out.failure = SpawnFailure{"fork", fork_errno};
    return out;
  }
  // Also here, so that signalling the group cannot race the child's own setpgid.
  if (!o.new_session) ::setpgid(pid, pid);
  out.pid = pid;
  ChildError ce{kNone, 0};
  ssize_t n;
  do {
    n = ::read(err_pipe[0], &ce, sizeof(ce));
  } while (n < 0 && errno == EINTR);
  ::close(err_pipe[0]);
  if (n == static_cast<ssize_t>(sizeof(ce))) out.failure = SpawnFailure{StepName(ce.step), ce.error};
  return out;
}

}  // namespace meshwork
