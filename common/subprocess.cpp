#include "common/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

namespace meshwork {
namespace {

// The child's steps, as numbers it can write into the pipe.
enum Step : int {
  kNone = 0,
  kNetns,
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
  static const char* kNames[kStepCount] = {"start", "join the network namespace", "unshare(mount, uts namespace)", "make / private",
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

// write(2) that returns EPIPE instead of raising SIGPIPE (which would end this process when the
// reader is gone): SIGPIPE is blocked in this thread for the write, and one it raised is taken off
// the pending set before the mask is restored, unless one was pending already.
ssize_t WriteNoSigpipe(int fd, const char* data, size_t size) {
  sigset_t pipe_set, old_mask, pending;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  sigpending(&pending);
  const bool was_pending = sigismember(&pending, SIGPIPE) == 1;
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old_mask);
  const ssize_t wrote = ::write(fd, data, size);
  const int err = errno;
  if (wrote < 0 && err == EPIPE && !was_pending) {
    const timespec zero{0, 0};
    while (sigtimedwait(&pipe_set, nullptr, &zero) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  errno = err;
  return wrote;
}

}  // namespace

std::string SpawnFailure::ToString() const { return step + ": " + std::strerror(error); }

namespace {

// What the child reads: all of it prepared by the parent, whose memory the child shares until it
// execs or exits.
struct ChildArgs {
  const SpawnOptions* o;
  char* const* argv;
  char* const* envp;
  const char* program;
  const char* wd;
  bool isolate;
  pid_t parent;
  int err_fd;
};

[[noreturn]] void ChildFail(const ChildArgs& a, int step) {
  ChildError ce{step, errno};
  ssize_t ignored = ::write(a.err_fd, &ce, sizeof(ce));
  (void)ignored;
  ::_exit(a.o->failure_exit_code);
}

// The child's steps. It runs on its own small stack in the parent's memory (CLONE_VM), so it
// only makes system calls: no allocation, no locks, nothing written but its own stack.
int ChildMain(void* arg) {
  const ChildArgs& a = *static_cast<const ChildArgs*>(arg);
  const SpawnOptions& o = *a.o;
  if (o.new_session) {
    ::setsid();
  } else {
    ::setpgid(0, 0);
  }
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != a.parent) ::_exit(o.failure_exit_code);  // the parent died before prctl
  // Default dispositions while every signal is still blocked (the parent blocked them before the
  // clone): none of the parent's handlers may run here, on the parent's memory.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; ++s) ::sigaction(s, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (!o.netns.empty()) {
    const int fd = ::open(o.netns.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) ChildFail(a, kNetns);
    ::close(fd);
  }
  if (a.isolate) {
    if (::unshare(CLONE_NEWNS | CLONE_NEWUTS) != 0) ChildFail(a, kUnshare);
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) ChildFail(a, kPrivateRoot);
    // Every mount stacked there (a directory bind-mounted onto itself, and a mount left under it
    // by an agent that died): until EINVAL, not a mount point any more.
    if (!o.detach_mount.empty()) {
      while (::umount2(o.detach_mount.c_str(), MNT_DETACH) == 0) {
      }
    }
    if (!o.hosts_file.empty() && ::mount(o.hosts_file.c_str(), "/etc/hosts", nullptr, MS_BIND, nullptr) != 0) {
      ChildFail(a, kBindHosts);
    }
    if (!o.hostname.empty() && ::sethostname(o.hostname.data(), o.hostname.size()) != 0) ChildFail(a, kSetHostname);
  }
  if ((o.stdin_fd >= 0 && ::dup2(o.stdin_fd, 0) < 0) || (o.stdout_fd >= 0 && ::dup2(o.stdout_fd, 1) < 0) ||
      (o.stderr_fd >= 0 && ::dup2(o.stderr_fd, 2) < 0)) {
    ChildFail(a, kStdio);
  }
  if (o.close_other_fds) CloseAllAbove2Except(a.err_fd);  // the pipe closes itself on exec
  if (a.wd != nullptr && ::chdir(a.wd) != 0) ChildFail(a, kChdir);
  if (o.search_path) {
    ::execvpe(a.program, a.argv, a.envp);
  } else {
    ::execve(a.program, a.argv, a.envp);
  }
  ChildFail(a, kExec);
}

// The child's stack: execvpe builds each PATH candidate on it.
constexpr size_t kChildStackBytes = 256 << 10;

}  // namespace

// clone(CLONE_VM | CLONE_VFORK), as posix_spawn does, rather than fork: fork copies the parent's
// page tables, a cost that grows with its memory (the node agent's cache of every Pod, a launcher
// beside a large model), and the child only makes system calls before it execs.
Spawned SpawnProcess(const SpawnOptions& o) {
  Spawned out;
  std::vector<char*> argv = CStrings(o.argv);
  std::vector<char*> envp = CStrings(o.env);
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
  void* stack = ::mmap(nullptr, kChildStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (stack == MAP_FAILED) {
    out.failure = SpawnFailure{"fork", errno};
    ::close(err_pipe[0]);
    ::close(err_pipe[1]);
    return out;
  }
  const ChildArgs args{&o,
                       argv.data(),
                       envp.data(),
                       program,
                       o.working_dir.empty() ? nullptr : o.working_dir.c_str(),
                       !o.hosts_file.empty() || !o.hostname.empty(),
                       ::getpid(),
                       err_pipe[1]};
  sigset_t all, old_mask;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old_mask);
  // Returns once the child has exec'd or exited (CLONE_VFORK).
  const pid_t pid = ::clone(ChildMain, static_cast<char*>(stack) + kChildStackBytes, CLONE_VM | CLONE_VFORK | SIGCHLD,
                            const_cast<ChildArgs*>(&args));
  const int clone_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  ::munmap(stack, kChildStackBytes);
  ::close(err_pipe[1]);
  if (pid < 0) {
    ::close(err_pipe[0]);
    out.failure = SpawnFailure{"fork", clone_errno};
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

Result<Captured> RunCaptured(SpawnOptions options, const std::string& input, std::chrono::milliseconds timeout,
                             bool merge_stderr) {
  using Clock = std::chrono::steady_clock;
  int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
  auto close_all = [&] {
    for (int* p : {in, out, err}) {
      for (int i = 0; i < 2; ++i) {
        if (p[i] >= 0) ::close(p[i]);
        p[i] = -1;
      }
    }
  };
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0 || (!merge_stderr && ::pipe2(err, O_CLOEXEC) != 0)) {
    const int e = errno;
    close_all();
    return Unavailable(std::string("pipe: ") + std::strerror(e));
  }
  options.stdin_fd = in[0];
  options.stdout_fd = out[1];
  options.stderr_fd = merge_stderr ? out[1] : err[1];
  options.close_other_fds = true;
  options.new_session = false;  // its own process group, which a timeout kills
  const std::string name = options.program.empty() && !options.argv.empty() ? options.argv[0] : options.program;
  Spawned child = SpawnProcess(options);
  ::close(in[0]), ::close(out[1]);
  in[0] = out[1] = -1;
  if (err[1] >= 0) ::close(err[1]), err[1] = -1;
  if (!child.ok()) {
    close_all();
    if (child.pid > 0) {
      while (::waitpid(child.pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
    return Unavailable("cannot run " + name + ": " + (child.failure ? child.failure->ToString() : "no child"));
  }
  // stdin is fed from the same loop that drains stdout and stderr (non-blocking, so that neither
  // side waits on a full pipe), and the timeout counts from here, the write included.
  Captured run;
  const auto deadline = Clock::now() + timeout;
  size_t written = 0;
  if (input.empty()) {
    ::close(in[1]);
    in[1] = -1;
  } else {
    ::fcntl(in[1], F_SETFL, ::fcntl(in[1], F_GETFL) | O_NONBLOCK);
  }
  pollfd fds[3] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}, {in[1], POLLOUT, 0}};
  bool timed_out = false;
  while (fds[0].fd >= 0 || fds[1].fd >= 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    const int n = ::poll(fds, 3, static_cast<int>(left));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    if (fds[2].fd >= 0 && fds[2].revents != 0) {
      const ssize_t wrote = WriteNoSigpipe(fds[2].fd, input.data() + written, input.size() - written);
      if (wrote > 0) written += static_cast<size_t>(wrote);
      // Done, or the child closed its stdin (EPIPE: it reads no more; what it wrote is the answer).
      if (written == input.size() || (wrote < 0 && errno != EAGAIN && errno != EINTR)) {
        ::close(in[1]);
        in[1] = fds[2].fd = -1;
      }
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[4096];
      const ssize_t got = ::read(fds[i].fd, buf, sizeof(buf));
      if (got > 0) {
        (i == 0 ? run.out : run.err).append(buf, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        fds[i].fd = -1;
      }
    }
  }
  close_all();
  // Its output is closed: it is exiting, or it closed them and runs on until the deadline.
  int status = 0;
  while (!timed_out) {
    const pid_t r = ::waitpid(child.pid, &status, WNOHANG);
    if (r == child.pid) break;
    if (r < 0 && errno != EINTR) {
      // ECHILD: reaped elsewhere (SIGCHLD ignored in this process); how it ended is unknown.
      return Unavailable("waiting for " + name + ": " + std::strerror(errno));
    }
    if (Clock::now() > deadline) timed_out = true;
    else std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (timed_out) {
    ::kill(-child.pid, SIGKILL);
    while (::waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  if (timed_out) return Unavailable(name + " did not finish within " + std::to_string(timeout.count()) + " ms");
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return run;
}

}  // namespace meshwork
