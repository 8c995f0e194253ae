// meshwork-train: the trainer's command line. Subcommands train, eval, prepare-data, tokenize,
// config, devices and launch;
// every failure is one line on stderr and a distinct exit code (docs/config.md, "Exit codes").
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "common/blas_kernel.h"
#include "trainer/config/config.h"
#include "trainer/data/prepare.h"
#include "trainer/data/token_file.h"
#include "trainer/data/tokenizer.h"
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
                                    each compiler pass and the plan's summary (rank 0);
                                    with mesh.pp, the pipeline program with FSDP's ops
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
  prepare-data  turn text files into a token file (docs/data.md)
                  --out FILE [--val-out FILE] [--val-fraction F] [--format llmc|raw_u16|raw_u32]
                  --tokenizer T     tokenizer.json, SentencePiece .model, a model directory
                                    holding one, or bytes (the default: byte-level vocabulary)
                  --bos-token S --eos-token S  document separators (default: the tokenizer's)
                  --field F         documents are records: a row's string column F in Parquet
                                    inputs, field F of each line in the others (JSON Lines);
                                    without it each input file is one document of text
                                    (--jsonl-field F is the same flag)
                  --threads N       encoding threads (default: one per core)
                  --progress-every S  a progress line on stderr every S seconds (default 5;
                                    0: none)
                  INPUT...          files or directories (every file below, in path order)
  train-tokenizer  train a byte-level BPE (Llama 3's pre-tokenizer) on text files (docs/data.md)
                  --vocab-size N    ids, the 256 bytes and <|begin_of_text|>, <|end_of_text|> included
                  --out DIR         writes DIR/tokenizer.json and DIR/tokenizer_config.json
                  INPUT...          text files or directories, as for prepare-data
  tokenize      print each file's token ids, one line per file (--tokenizer, --bos-token,
                --eos-token as for prepare-data; --document adds the separators, --info prints
                the vocabulary size and the separators instead, --time N encodes the files as
                one batch N times and prints each pass's time as a JSON line)
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
  // Stopped by SIGTERM after saving (checkpoint.save_on_terminate): the code of a process it
  // killed, so that nothing takes the run for finished.
  if (r->stopped_at > 0) return 128 + SIGTERM;
  return exit_code::kOk;
}

// --tokenizer, --bos-token and --eos-token, shared by prepare-data and tokenize; true if args[i] was one.
bool TakeTokenizerFlag(const std::vector<std::string>& args, size_t& i, std::string* spec,
                       meshwork::data::TokenizerOptions* options, std::string* error) {
  std::string value;
  if (TakeValue(args, i, "--tokenizer", &value, error)) {
    *spec = value;
  } else if (TakeValue(args, i, "--bos-token", &value, error)) {
    options->bos_token = value;
  } else if (TakeValue(args, i, "--eos-token", &value, error)) {
    options->eos_token = value;
  } else {
    return false;
  }
  return true;
}

int RunPrepareData(const std::vector<std::string>& args) {
  meshwork::data::PrepareOptions o;
  std::string error, value, tokenizer_spec = "bytes";
  meshwork::data::TokenizerOptions tokenizer_options;
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
    } else if (TakeValue(args, i, "--field", &value, &error) || TakeValue(args, i, "--jsonl-field", &value, &error)) {
      if (value.empty()) return Usage("--field needs the name of the field (or Parquet column) holding each document's text");
      o.field = value;
    } else if (TakeValue(args, i, "--threads", &value, &error)) {
      char* end = nullptr;
      const long n = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || n < 1 || n > 1024) {
        return Usage("--threads: expected a whole number from 1 to 1024, got '" + value + "'");
      }
      o.threads = static_cast<int>(n);
    } else if (TakeValue(args, i, "--progress-every", &value, &error)) {
      char* end = nullptr;
      o.progress_seconds = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(o.progress_seconds >= 0)) {
        return Usage("--progress-every: expected seconds >= 0, got '" + value + "'");
      }
    } else if (TakeTokenizerFlag(args, i, &tokenizer_spec, &tokenizer_options, &error)) {
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
  auto tokenizer = meshwork::data::LoadTokenizer(tokenizer_spec, tokenizer_options);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  o.tokenizer = tokenizer->get();
  o.progress = &std::cerr;
  auto r = meshwork::data::PrepareTokens(o);
  if (!r.ok()) return Fail(r.status());
  const auto& t = **tokenizer;
  std::cout << "prepared " << r->documents << " documents with " << t.description() << ": " << r->train_tokens
            << " tokens -> " << o.train_out;
  if (!o.val_out.empty()) std::cout << ", " << r->val_tokens << " tokens -> " << o.val_out;
  if (r->skipped_binary_files > 0) std::cout << " (skipped " << r->skipped_binary_files << " binary files)";
  std::cout << "\n";
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);  // ru_maxrss is in KiB on Linux
  std::ostringstream rate;
  rate << std::fixed << std::setprecision(1) << static_cast<double>(r->input_bytes) / 1e6 << " MB of input in "
       << std::setprecision(2) << r->seconds << " s ("
       << std::setprecision(1) << (r->seconds > 0 ? static_cast<double>(r->input_bytes) / 1e6 / r->seconds : 0.0)
       << " MB/s), peak memory " << usage.ru_maxrss / 1024 << " MiB";
  std::cout << "read " << rate.str() << "\n";
  if (t.kind() != meshwork::data::TokenizerKind::kBytes) {
    std::cout << "documents are " << (t.bos() ? "bos " + std::to_string(*t.bos()) + " + " : std::string("")) << "text + eos "
              << t.eos() << " (from " << t.specials_source() << ")\n";
  }
  return exit_code::kOk;
}

int RunTrainTokenizer(const std::vector<std::string>& args) {
  std::string error, value, out;
  int64_t vocab = 0;
  std::vector<std::string> inputs;
  for (size_t i = 0; i < args.size(); ++i) {
    if (TakeValue(args, i, "--out", &value, &error)) {
      out = value;
    } else if (TakeValue(args, i, "--vocab-size", &value, &error)) {
      char* end = nullptr;
      vocab = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0') return Usage("--vocab-size: expected a whole number, got '" + value + "'");
    } else if (args[i].rfind("--", 0) == 0) {
      return Usage("unknown option '" + args[i] + "' for 'train-tokenizer'");
    } else {
      inputs.push_back(args[i]);
    }
    if (!error.empty()) return Usage(error);
  }
  if (out.empty()) return Usage("train-tokenizer needs --out DIR (where tokenizer.json goes)");
  if (vocab == 0) return Usage("train-tokenizer needs --vocab-size N");
  if (inputs.empty()) return Usage("train-tokenizer needs at least one INPUT file or directory");
  auto texts = meshwork::data::ReadTextDocuments(inputs);
  if (!texts.ok()) return Fail(texts.status());
  if (Status s = meshwork::data::TrainBpeTokenizer(*texts, vocab, out); !s.ok()) return Fail(s);
  auto tok = meshwork::data::LoadTokenizer(out);
  if (!tok.ok()) return Fail(tok.status());
  size_t bytes = 0;
  for (const auto& t : *texts) bytes += t.size();
  std::cout << "trained " << (*tok)->description() << " on " << texts->size() << " documents (" << bytes
            << " bytes), with " << out << "/tokenizer_config.json (bos <|begin_of_text|>, eos <|end_of_text|>)\n";
  return exit_code::kOk;
}

int RunTokenize(const std::vector<std::string>& args) {
  std::string error, tokenizer_spec = "bytes";
  meshwork::data::TokenizerOptions tokenizer_options;
  bool document = false, info = false;
  int64_t passes = 0;
  std::string value;
  std::vector<std::string> files;
  for (size_t i = 0; i < args.size(); ++i) {
    if (TakeTokenizerFlag(args, i, &tokenizer_spec, &tokenizer_options, &error)) {
    } else if (TakeValue(args, i, "--time", &value, &error)) {
      char* end = nullptr;
      passes = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || passes < 1) return Usage("--time: expected a positive pass count, got '" + value + "'");
    } else if (args[i] == "--document") {
      document = true;
    } else if (args[i] == "--info") {
      info = true;
    } else if (args[i].rfind("--", 0) == 0) {
      return Usage("unknown option '" + args[i] + "' for 'tokenize'");
    } else {
      files.push_back(args[i]);
    }
    if (!error.empty()) return Usage(error);
  }
  if (files.empty() && !info) return Usage("tokenize needs at least one FILE (or --info)");
  auto tokenizer = meshwork::data::LoadTokenizer(tokenizer_spec, tokenizer_options);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  const auto& t = **tokenizer;
  if (info) {
    std::cout << "tokenizer " << t.description() << "\nvocab_size " << t.VocabSize() << "\nbos "
              << (t.bos() ? std::to_string(*t.bos()) : std::string("none")) << "\neos " << t.eos()
              << "\nseparators_from " << t.specials_source() << "\n";
    return exit_code::kOk;
  }
  std::vector<std::string> texts;
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return Fail(meshwork::NotFound("cannot open '" + file + "' for reading"));
    texts.emplace_back((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  if (passes > 0) {
    // bench/tokenizer_throughput.sh: every file one text of a batch, encoded `passes` times; one JSON
    // line a pass, in the bench protocol's step records (reading the files is not timed).
    const std::vector<std::string_view> views(texts.begin(), texts.end());
    int64_t bytes = 0;
    for (const auto& text : texts) bytes += static_cast<int64_t>(text.size());
    for (int64_t pass = 1; pass <= passes; ++pass) {
      const auto start = std::chrono::steady_clock::now();
      auto batch = t.EncodeBatch(views);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!batch.ok()) return Fail(batch.status());
      int64_t tokens = 0;
      for (const auto& ids : *batch) tokens += static_cast<int64_t>(ids.size());
      std::cout << "{\"step\": " << pass << ", \"step_seconds\": " << seconds << ", \"tokens\": " << tokens
                << ", \"bytes\": " << bytes << ", \"texts\": " << texts.size() << "}" << std::endl;
    }
    return exit_code::kOk;
  }
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string& file = files[f];
    const std::string& text = texts[f];
    auto ids = t.Encode(text);
    if (!ids.ok()) return Fail(meshwork::InvalidInput("'" + file + "': " + ids.status().message()));
    std::string line;
    if (document && t.bos()) line = std::to_string(*t.bos());
    for (uint32_t id : *ids) line += (line.empty() ? "" : " ") + std::to_string(id);
    if (document) line += (line.empty() ? "" : " ") + std::to_string(t.eos());
    std::cout << line << "\n";
  }
  return exit_code::kOk;
}

// `launch`: the ranks run COMMAND; one of this binary's own subcommands runs this binary.
int RunLaunch(const std::vector<std::string>& args) {
  auto options = meshwork::launch::ParseLaunchArgs(args);
  if (!options.ok()) return Fail(options.status());
  auto& command = options->command;
  const std::string first = command.empty() ? "" : command.front();
  if (first == "train" || first == "eval" || first == "config" || first == "prepare-data" || first == "tokenize") {
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
    if (command == "tokenize") return RunTokenize(args);
    if (command == "train-tokenizer") return RunTrainTokenizer(args);
    if (command == "launch") return RunLaunch(args);
    if (command == "devices") return RunDevices(args);
  } catch (const std::exception& e) {
    // Modules return Status; anything thrown this far is a bug, reported rather than aborting.
    std::cerr << "meshwork-train: internal error: " << e.what() << "\n";
    return exit_code::kRuntime;
  }
  return Usage("unknown command '" + command + "'");
}
