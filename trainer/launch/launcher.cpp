// RunLauncher and ParseLaunchArgs: fork/exec one process per local rank and supervise them.
#include "trainer/launch/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "common/subprocess.h"

extern char** environ;

namespace meshwork::launch {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kRendezvousTokenEnv = "MESHWORK_RENDEZVOUS_TOKEN";

// The last SIGINT/SIGTERM received, for forwarding. A signal handler can only reach state
// through a global; this one lives only while RunLauncher has its handlers installed.
volatile sig_atomic_t g_pending_signal = 0;

void RecordSignal(int sig) { g_pending_signal = sig; }

// Installs the forwarding handlers for SIGINT and SIGTERM; restores the old ones on scope exit.
class ScopedSignalForwarding {
 public:
  ScopedSignalForwarding() {
    g_pending_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = RecordSignal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  ~ScopedSignalForwarding() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }
  ScopedSignalForwarding(const ScopedSignalForwarding&) = delete;
  ScopedSignalForwarding& operator=(const ScopedSignalForwarding&) = delete;

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

const char* SignalName(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
  }
  return "unknown signal";
}

struct Child {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  bool running = false;
};

// This process's environment with the rank variables replaced.
std::vector<std::string> ChildEnvironment(const std::map<std::string, std::string>& vars) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string entry(*e);
    std::string key = entry.substr(0, entry.find('='));
    if (vars.count(key) == 0) env.push_back(entry);
  }
  for (const auto& [k, v] : vars) env.push_back(k + "=" + v);
  return env;
}

// Forks and execs one rank in its own process group. Returns the pid, or -1 with the reason in
// *error; a failed exec returns the pid too, with the reason.
pid_t SpawnRank(const LaunchOptions& o, int local_rank, const std::string& token, std::string* error) {
  const int rank = o.node_rank * o.nproc + local_rank;
  const std::string world = std::to_string(o.nnodes * o.nproc);
  std::map<std::string, std::string> vars;
  if (!token.empty()) vars[kRendezvousTokenEnv] = token;
  for (const char* prefix : {"", "MESHWORK_"}) {
    const std::string p = prefix;
    vars[p + "RANK"] = std::to_string(rank);
    vars[p + "WORLD_SIZE"] = world;
    vars[p + "LOCAL_RANK"] = std::to_string(local_rank);
    vars[p + "LOCAL_WORLD_SIZE"] = std::to_string(o.nproc);
    vars[p + "MASTER_ADDR"] = o.master_addr;
    vars[p + "MASTER_PORT"] = std::to_string(o.master_port);
  }
  SpawnOptions spawn;
  spawn.argv = o.command;
  spawn.env = ChildEnvironment(vars);
  spawn.search_path = true;
  Spawned child = SpawnProcess(spawn);
  if (child.failure) {
    *error = child.failure->step == "exec"
                 ? "cannot execute '" + o.command[0] + "': " + std::strerror(child.failure->error)
                 : child.failure->ToString();
  }
  return child.pid;  // after a failed exec, a child that exits 127: the caller reaps it
}

// The token the ranks present to rank 0's store: the one in the environment (the operator's, from
// the job's Secret), else, when every rank is on this node, one of this launch's own. Two
// launches that land on one port (a port reused too soon, two jobs picking the same one) then
// refuse each other's ranks instead of one joining the other's gang and hanging it. Ranks on
// other nodes have their own launchers, which cannot share a token drawn here.
std::string RendezvousToken(const LaunchOptions& o) {
  const char* set = std::getenv(kRendezvousTokenEnv);
  if (set != nullptr && *set != '\0') return set;
  if (o.nnodes != 1) return "";
  std::random_device random;
  std::string token;
  constexpr char kHex[] = "0123456789abcdef";
  for (int i = 0; i < 32; ++i) token += kHex[random() % 16];
  return token;
}

void SignalGroups(const std::vector<Child>& children, int sig) {
  // Exited ranks too: their group may still hold helpers they started.
  for (const Child& c : children) {
    if (c.pid > 0) ::kill(-c.pid, sig);
  }
}

Status ParseInt(const std::string& flag, const std::string& value, int min, int max, int* out) {
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(value.c_str(), &end, 10);
  bool starts_like_number =
      !value.empty() && (std::isdigit(static_cast<unsigned char>(value[0])) || value[0] == '-');
  if (!starts_like_number || *end != '\0' || errno == ERANGE) {
    return InvalidConfig(flag + " '" + value + "' is not an integer");
  }
  if (v < min || v > max) {
    return InvalidConfig(flag + " " + value + " is out of range [" + std::to_string(min) + ", " +
                         std::to_string(max) + "]");
  }
  *out = static_cast<int>(v);
  return Status::Ok();
}

}  // namespace

Result<LaunchOptions> ParseLaunchArgs(const std::vector<std::string>& args) {
  LaunchOptions o;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.rfind("--", 0) != 0) break;  // the command starts here
    std::string flag = arg;
    std::optional<std::string> value;
    if (size_t eq = arg.find('='); eq != std::string::npos) {
      flag = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    static const char* kFlags[] = {"--nproc", "--nproc-per-node", "--nnodes", "--node-rank",
                                   "--master-addr", "--master-port", "--grace-period-s"};
    bool known = false;
    for (const char* f : kFlags) known = known || flag == f;
    if (!known) {
      return InvalidConfig("unknown flag '" + flag +
                           "'; known: --nproc (--nproc-per-node), --nnodes, --node-rank, "
                           "--master-addr, --master-port, --grace-period-s");
    }
    if (!value) {
      if (i + 1 >= args.size()) return InvalidConfig(flag + " needs a value");
      value = args[++i];
    }
    if (flag == "--nproc" || flag == "--nproc-per-node") {
      MW_RETURN_IF_ERROR(ParseInt(flag, *value, 1, 4096, &o.nproc));
    } else if (flag == "--nnodes") {
      MW_RETURN_IF_ERROR(ParseInt(flag, *value, 1, 1 << 20, &o.nnodes));
    } else if (flag == "--node-rank") {
      MW_RETURN_IF_ERROR(ParseInt(flag, *value, 0, INT_MAX, &o.node_rank));
    } else if (flag == "--master-addr") {
      if (value->empty()) return InvalidConfig("--master-addr must not be empty");
      o.master_addr = *value;
    } else if (flag == "--master-port") {
      MW_RETURN_IF_ERROR(ParseInt(flag, *value, 1, 65535, &o.master_port));
    } else if (flag == "--grace-period-s") {
      int s = 0;
      MW_RETURN_IF_ERROR(ParseInt(flag, *value, 0, 3600, &s));
      o.grace_period = std::chrono::seconds(s);
    }
  }
  o.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  if (o.command.empty()) {
    return InvalidConfig("no command to launch: usage: meshwork-launch [--nproc N] [--nnodes N] "
                         "[--node-rank N] [--master-addr A] [--master-port P] [--] COMMAND...");
  }
  if (o.node_rank >= o.nnodes) {
    return InvalidConfig("--node-rank " + std::to_string(o.node_rank) +
                         " must be less than --nnodes " + std::to_string(o.nnodes));
  }
  // Each flag is in range alone; the world they make must still be a rank number.
  if (static_cast<int64_t>(o.nnodes) * o.nproc > std::numeric_limits<int32_t>::max()) {
    return InvalidConfig("--nnodes " + std::to_string(o.nnodes) + " x --nproc " + std::to_string(o.nproc) +
                         " processes is more than the " + std::to_string(std::numeric_limits<int32_t>::max()) +
                         " ranks a world can have");
  }
  return o;
}

int RunLauncher(const LaunchOptions& o, std::ostream& log) {
  if (o.command.empty() || o.nproc < 1) {
    log << "meshwork-launch: nothing to run (nproc " << o.nproc << ", empty command)\n";
    return 2;
  }
  ScopedSignalForwarding forwarding;
  std::vector<Child> children(static_cast<size_t>(o.nproc));
  std::optional<int> exit_code;  // set by the first failure
  std::optional<Clock::time_point> kill_at;  // SIGKILL deadline once shutting down
  bool killed = false;

  auto shut_down = [&](int sig) {
    SignalGroups(children, sig);
    if (!kill_at) kill_at = Clock::now() + o.grace_period;
  };

  const std::string token = RendezvousToken(o);
  for (int i = 0; i < o.nproc; ++i) {
    Child& c = children[i];
    c.local_rank = i;
    c.rank = o.node_rank * o.nproc + i;
    std::string error;
    c.pid = SpawnRank(o, i, token, &error);
    if (c.pid < 0) {
      log << "meshwork-launch: rank " << c.rank << " could not be started: " << error << "\n";
      exit_code = 1;
      shut_down(SIGTERM);
      break;
    }
    c.running = true;
    if (!error.empty()) log << "meshwork-launch: rank " << c.rank << ": " << error << "\n";
  }

  while (true) {
    bool any_running = false;
    for (Child& c : children) {
      if (!c.running) continue;
      int status = 0;
      pid_t r = ::waitpid(c.pid, &status, WNOHANG);
      if (r == 0) {
        any_running = true;
        continue;
      }
      c.running = false;
      if (r < 0) {
        log << "meshwork-launch: lost track of rank " << c.rank << " (pid " << c.pid
            << "): " << std::strerror(errno) << "\n";
        if (!exit_code) exit_code = 1;
        shut_down(SIGTERM);
        continue;
      }
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
      int code;
      if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        code = 128 + sig;
        log << "meshwork-launch: rank " << c.rank << " (pid " << c.pid
            << ") was killed by signal " << sig << " (" << SignalName(sig) << ")\n";
      } else {
        code = WEXITSTATUS(status);
        log << "meshwork-launch: rank " << c.rank << " (pid " << c.pid << ") exited with code "
            << code << "\n";
      }
      if (!exit_code) {
        exit_code = code;
        log << "meshwork-launch: stopping the other ranks (SIGTERM, SIGKILL after "
            << std::chrono::duration_cast<std::chrono::seconds>(o.grace_period).count()
            << " s)\n";
        shut_down(SIGTERM);
      }
    }
    if (!any_running) break;

    if (int sig = g_pending_signal; sig != 0) {
      g_pending_signal = 0;
      log << "meshwork-launch: received " << SignalName(sig) << ", forwarding to all ranks\n";
      shut_down(sig);
    }
    if (kill_at && !killed && Clock::now() >= *kill_at) {
      log << "meshwork-launch: grace period over, sending SIGKILL to the remaining ranks\n";
      SignalGroups(children, SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  log.flush();
  return exit_code.value_or(0);
}

}  // namespace meshwork::launch
