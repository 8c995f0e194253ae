// meshwork-train: the trainer's command line. Subcommands train, eval, prepare-data and config;
// every failure is one line on stderr and a distinct exit code (docs/config.md, "Exit codes").
#include <signal.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "common/blas_kernel.h"
#include "trainer/config/config.h"
#include "trainer/data/prepare.h"
#include "trainer/data/token_file.h"
#include "trainer/launch/launcher.h"
#include "trainer/train/device.h"
#include "trainer/train/trainer.h"

#include <torch/cuda.h>
#include <torch/version.h>

namespace {

using meshwork::Status;
namespace exit_code = meshwork::exit_code;

constexpr const char* kUsage = R"(usage: meshwork-train <command> [options]

commands:
  train         train a model
                  --config FILE     YAML config (docs/config.md); defaults apply without one
                  --config-env VAR  read the YAML config from environment variable VAR instead
                                    (e.g. a Kubernetes ConfigMap key); not with --config
                  --set KEY=VALUE   override one key, e.g. --set optimizer.lr=3e-4 (repeatable)
                  --dump-plan       fsdp.mode compiled: print the schedule IR before and after
                                    each compiler pass and the plan's summary (rank 0)
                  --trace-out FILE  write a Chrome trace (Perfetto) of step 3: compute and
                                    communication lanes of every rank (fsdp.trace_out)
                  --profile-out FILE  profile steady steps with libtorch's profiler: its Chrome
                                    trace here, where the time went in the log
                                    (training.profile_out, training.profile_steps)
  eval          mean cross-entropy of given weights over a token file
                  --weights DIR     Hugging Face model directory (model.init_from)
                  --data FILE       token file (eval.data)
                  --windows N       windows of seq_len+1 tokens (eval.windows)
                  --config FILE, --config-env VAR, --set KEY=VALUE as for train
  prepare-data  turn text files into a token file with the byte-level vocabulary
                  --out FILE [--val-out FILE] [--val-fraction F] [--format llmc|raw_u16|raw_u32]
                  INPUT...          text files or directories
  config        print the resolved config (all keys, defaults included)
                  --config FILE, --config-env VAR, --set KEY=VALUE as for train
  devices       print the libtorch in use and the CUDA devices it sees (CUDA_VISIBLE_DEVICES
                applies); `devices --require-cuda` exits 5 when there is none
  launch        start N ranks on this machine (like torchrun --nproc-per-node)
                  --nproc N [--nnodes N --node-rank N --master-addr A --master-port P]
                  [--] COMMAND...   e.g. launch --nproc 4 train --config job.yaml
                                    (train/eval/config/prepare-data run this binary)

exit codes: 0 ok, 1 runtime failure, 2 bad config or usage, 3 bad input file,
            4 I/O error, 5 resource unavailable (device, port)
)";

int Fail(const Status& s) {
  std::cerr << "meshwork-train: error: " << s.message() << "\n";
  return meshwork::ExitCodeFor(s.code());
}

int Usage(const std::string& problem) {
  std::cerr << "meshwork-train: error: " << problem << "\n\n" << kUsage;
  return exit_code::kConfig;
}

// Options shared by train, eval and config.
struct ConfigArgs {
  std::string config_path;
  std::string config_env;  // --config-env: the name of the variable holding the YAML
  bool config_env_given = false;
  std::vector<std::string> overrides;
};

// Parses `--name VALUE` and `--name=VALUE`; returns false when `args[i]` is not `name`.
bool TakeValue(const std::vector<std::string>& args, size_t& i, const std::string& name,
               std::string* value, std::string* error) {
  const std::string& a = args[i];
  if (a == name) {
    if (i + 1 >= args.size()) {
      *error = name + " needs a value";
      return true;
    }
    *value = args[++i];
    return true;
  }
  if (a.rfind(name + "=", 0) == 0) {
    *value = a.substr(name.size() + 1);
    return true;
  }
  return false;
}

int RunConfigCommand(const std::string& command, const std::vector<std::string>& args) {
  ConfigArgs c;
  std::string error, value;
  for (size_t i = 0; i < args.size(); ++i) {
    if (TakeValue(args, i, "--config", &value, &error)) {
      // `--config "$CFG"` with CFG unset would otherwise run the defaults as if asked to.
      if (error.empty() && value.empty()) error = "--config needs a file name (got an empty one)";
      c.config_path = value;
    } else if (TakeValue(args, i, "--config-env", &value, &error)) {
      c.config_env = value;
      c.config_env_given = true;
    } else if (TakeValue(args, i, "--set", &value, &error)) {
      c.overrides.push_back(value);
    } else if (command == "train" && args[i] == "--dump-plan") {
      c.overrides.push_back("fsdp.dump_plan=true");
    } else if (command == "train" && TakeValue(args, i, "--trace-out", &value, &error)) {
      c.overrides.push_back("fsdp.trace_out=" + value);
    } else if (command == "train" && TakeValue(args, i, "--profile-out", &value, &error)) {
      c.overrides.push_back("training.profile_out=" + value);
    } else if (command == "eval" && TakeValue(args, i, "--weights", &value, &error)) {
      c.overrides.push_back("model.init_from=" + value);
    } else if (command == "eval" && TakeValue(args, i, "--data", &value, &error)) {
      c.overrides.push_back("eval.data=" + value);
    } else if (command == "eval" && TakeValue(args, i, "--windows", &value, &error)) {
      c.overrides.push_back("eval.windows=" + value);
    } else {
      return Usage("unknown option '" + args[i] + "' for '" + command + "'");
    }
    if (!error.empty()) return Usage(error);
  }
  // In eval, the dims come from the checkpoint, so the default preset must not count as a
  // user choice; LoadConfig only marks dims explicit when a key names them.
  if (c.config_env_given && !c.config_path.empty()) {
    return Usage("--config " + c.config_path + " and --config-env " + c.config_env +
                 " both name the config; give one");
  }
  if (c.config_env_given && c.config_env.empty()) return Usage("--config-env needs the name of a variable");
  auto cfg = c.config_env_given ? meshwork::config::LoadConfigFromEnv(c.config_env, c.overrides)
                                : meshwork::config::LoadConfig(c.config_path, c.overrides);
  if (!cfg.ok()) return Fail(cfg.status());

  if (command == "config") {
    std::cout << meshwork::config::ToYaml(*cfg) << "\n";
    return exit_code::kOk;
  }
  if (command == "eval") {
    auto r = meshwork::train::Evaluate(*cfg, std::cerr);
    if (!r.ok()) return Fail(r.status());
    std::cout << "eval: loss " << meshwork::train::SixDigits(r->loss) << " over " << r->windows
              << " windows of " << cfg->data.seq_len << " tokens (" << r->tokens << " predictions)\n";
    return exit_code::kOk;
  }
  auto r = meshwork::train::Train(*cfg, std::cout);
  if (!r.ok()) return Fail(r.status());
  return exit_code::kOk;
}

int RunPrepareData(const std::vector<std::string>& args) {
  meshwork::data::PrepareOptions o;
  std::string error, value;
  bool fraction_given = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (TakeValue(args, i, "--out", &value, &error)) {
      o.train_out = value;
    } else if (TakeValue(args, i, "--val-out", &value, &error)) {
      o.val_out = value;
    } else if (TakeValue(args, i, "--val-fraction", &value, &error)) {
      char* end = nullptr;
      o.val_fraction = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0') return Usage("--val-fraction: expected a number, got '" + value + "'");
      fraction_given = true;
    } else if (TakeValue(args, i, "--format", &value, &error)) {
      auto f = meshwork::data::ParseTokenFormat(value);
      // The parser names the config key; here the value came from the flag.
      if (!f.ok()) return Usage("--format: '" + value + "' is not a token format (auto, llmc, raw_u16, raw_u32)");
      o.format = *f;
    } else if (args[i].rfind("--", 0) == 0) {
      return Usage("unknown option '" + args[i] + "' for 'prepare-data'");
    } else {
      o.inputs.push_back(args[i]);
    }
    if (!error.empty()) return Usage(error);
  }
  if (o.train_out.empty()) return Usage("prepare-data needs --out FILE");
  if (o.inputs.empty()) return Usage("prepare-data needs at least one INPUT file or directory");
  // Without a val output every token goes to --out: a fraction asked for would silently do nothing.
  if (fraction_given && o.val_out.empty()) return Usage("--val-fraction needs --val-out FILE (where the split goes)");
  auto r = meshwork::data::PrepareTokens(o);
  if (!r.ok()) return Fail(r.status());
  std::cout << "prepared " << r->documents << " documents: " << r->train_tokens << " tokens -> "
            << o.train_out;
  if (!o.val_out.empty()) std::cout << ", " << r->val_tokens << " tokens -> " << o.val_out;
  if (r->skipped_binary_files > 0) std::cout << " (skipped " << r->skipped_binary_files << " binary files)";
  std::cout << "\n";
  return exit_code::kOk;
}

// `launch`: the ranks run COMMAND; one of this binary's own subcommands runs this binary.
int RunLaunch(const std::vector<std::string>& args) {
  auto options = meshwork::launch::ParseLaunchArgs(args);
  if (!options.ok()) return Fail(options.status());
  auto& command = options->command;
  const std::string first = command.empty() ? "" : command.front();
  if (first == "train" || first == "eval" || first == "config" || first == "prepare-data") {
    char self[PATH_MAX];
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) return Fail(meshwork::Internal("cannot find this executable (/proc/self/exe)"));
    command.insert(command.begin(), std::string(self, static_cast<size_t>(n)));
  }
  return meshwork::launch::RunLauncher(*options, std::cerr);
}

}  // namespace

// `devices [--require-cuda]`: what a GPU test, or a user checking a node, asks first.
int RunDevices(const std::vector<std::string>& args) {
  bool require_cuda = false;
  for (const auto& a : args) {
    if (a != "--require-cuda") return Usage("devices: unknown argument '" + a + "'");
    require_cuda = true;
  }
  const int64_t n = static_cast<int64_t>(torch::cuda::device_count());
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  std::cout << "libtorch " << TORCH_VERSION << "\n"
            << "cuda devices: " << n << " (CUDA_VISIBLE_DEVICES=" << (visible ? std::string("'") + visible + "'" : "unset")
            << ")\n";
  if (n == 0 && require_cuda) {
    std::cerr << "meshwork-train: error: no CUDA device visible to this libtorch\n";
    return exit_code::kUnavailable;
  }
  return exit_code::kOk;
}

int main(int argc, char** argv) {
  meshwork::UseBestBlasKernel(argv);  // may run this program again, with OPENBLAS_CORETYPE set
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) return Usage("missing command");
  const std::string command = args.front();
  args.erase(args.begin());
  if (command == "-h" || command == "--help" || command == "help") {
    std::cout << kUsage;
    return exit_code::kOk;
  }
  // A peer that dies mid-collective closes its sockets; Gloo's next write to one must fail as an
  // error naming the collective (exit 5), not kill this rank with SIGPIPE (exit 141), as Python
  // trainers already behave (the interpreter ignores SIGPIPE).
  ::signal(SIGPIPE, SIG_IGN);
  // Before anything touches CUDA (a no-op where PYTORCH_CUDA_ALLOC_CONF is already set).
  meshwork::train::ConfigureCudaAllocator();
  try {
    if (command == "train" || command == "eval" || command == "config") return RunConfigCommand(command, args);
    if (command == "prepare-data") return RunPrepareData(args);
    if (command == "launch") return RunLaunch(args);
    if (command == "devices") return RunDevices(args);
  } catch (const std::exception& e) {
    // Modules return Status; anything thrown this far is a bug, reported rather than aborting.
    std::cerr << "meshwork-train: internal error: " << e.what() << "\n";
    return exit_code::kRuntime;
  }
  return Usage("unknown command '" + command + "'");
}
