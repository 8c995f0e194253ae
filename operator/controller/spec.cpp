#include "operator/controller/spec.h"

#include <regex.h>

#include <cctype>
#include <cmath>
#include <limits>
#include <sstream>

#include "common/enum_names.h"
#include "common/quantity.h"
#include "trainer/compiler/pipeline/simulate.h"
#include "trainer/compiler/hardware_profile.h"
#include "trainer/config/config.h"
#include "trainer/config/hardware.h"

namespace meshwork::op {
namespace {

using nlohmann::json;

Status Bad(const std::string& field, const std::string& why) { return InvalidConfig(field + ": " + why); }

std::string Quote(const json& v) { return v.dump(); }

// The value at `key` of `obj` when present and not null.
const json* Field(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

Status ReadInt(const json& obj, const char* key, const std::string& path, int64_t lo, int64_t hi,
               int64_t* out) {
  const json* v = Field(obj, key);
  if (!v) return Status::Ok();
  if (!v->is_number_integer() && !v->is_number_unsigned()) {
    return Bad(path, "must be an integer, got " + Quote(*v));
  }
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) {
    return Bad(path, Quote(*v) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  *out = x;
  return Status::Ok();
}

template <typename T>
Status ReadIntAs(const json& obj, const char* key, const std::string& path, int64_t lo, int64_t hi, T* out) {
  int64_t x = static_cast<int64_t>(*out);
  MW_RETURN_IF_ERROR(ReadInt(obj, key, path, lo, hi, &x));
  *out = static_cast<T>(x);
  return Status::Ok();
}

Status ReadOptionalInt(const json& obj, const char* key, const std::string& path, int64_t lo, int64_t hi,
                       std::optional<int64_t>* out) {
  if (!Field(obj, key)) return Status::Ok();
  int64_t x = 0;
  MW_RETURN_IF_ERROR(ReadInt(obj, key, path, lo, hi, &x));
  *out = x;
  return Status::Ok();
}

Status ReadString(const json& obj, const char* key, const std::string& path, std::string* out) {
  const json* v = Field(obj, key);
  if (!v) return Status::Ok();
  if (!v->is_string()) return Bad(path, "must be a string, got " + Quote(*v));
  *out = v->get<std::string>();
  return Status::Ok();
}

Status ReadBool(const json& obj, const char* key, const std::string& path, bool* out) {
  const json* v = Field(obj, key);
  if (!v) return Status::Ok();
  if (!v->is_boolean()) return Bad(path, "must be a boolean, got " + Quote(*v));
  *out = v->get<bool>();
  return Status::Ok();
}

Status ReadStrings(const json& obj, const char* key, const std::string& path, std::vector<std::string>* out) {
  const json* v = Field(obj, key);
  if (!v) return Status::Ok();
  if (!v->is_array()) return Bad(path, "must be a list of strings, got " + Quote(*v));
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_string()) {
      return Bad(path + "[" + std::to_string(i) + "]", "must be a string, got " + Quote((*v)[i]));
    }
    out->push_back((*v)[i].get<std::string>());
  }
  return Status::Ok();
}

Status ReadObject(const json& obj, const char* key, const std::string& path, json* out) {
  const json* v = Field(obj, key);
  if (!v) return Status::Ok();
  if (!v->is_object()) return Bad(path, "must be an object, got " + Quote(*v));
  *out = *v;
  return Status::Ok();
}

template <typename E>
Status ReadEnum(const json& obj, const char* key, const std::string& path,
                const std::vector<std::pair<const char*, E>>& values, E* out) {
  std::string s;
  MW_RETURN_IF_ERROR(ReadString(obj, key, path, &s));
  if (s.empty() && !Field(obj, key)) return Status::Ok();
  std::string known;
  for (const auto& [name, value] : values) {
    if (s == name) {
      *out = value;
      return Status::Ok();
    }
    known += std::string(known.empty() ? "" : ", ") + name;
  }
  return Bad(path, "unsupported value " + Quote(s) + " (supported: " + known + ")");
}

// spec.runPolicy.failurePolicy: at most kMaxFailureRules rules, each with at least one matcher.
constexpr size_t kMaxFailureRules = 16;
constexpr size_t kMaxPatternLength = 256;

Status ReadFailureRule(const json& r, const std::string& path, FailureRule* rule) {
  if (!r.is_object()) return Bad(path, "must be an object, got " + Quote(r));
  MW_RETURN_IF_ERROR(ReadString(r, "name", path + ".name", &rule->name));
  if (!Field(r, "action")) return Bad(path + ".action", "is required");
  MW_RETURN_IF_ERROR(ReadEnum<FailureAction>(r, "action", path + ".action",
                                             {{"FailJob", FailureAction::kFailJob},
                                              {"RestartGang", FailureAction::kRestartGang},
                                              {"RestartGangAndIgnoreBackoff",
                                               FailureAction::kRestartGangAndIgnoreBackoff}},
                                             &rule->action));
  bool matcher = false;
  if (const json* codes = Field(r, "onExitCodes")) {
    const std::string cpath = path + ".onExitCodes";
    if (!codes->is_object()) return Bad(cpath, "must be an object {operator, values}, got " + Quote(*codes));
    std::string op = "In";
    MW_RETURN_IF_ERROR(ReadString(*codes, "operator", cpath + ".operator", &op));
    if (op != "In" && op != "NotIn") {
      return Bad(cpath + ".operator", "unsupported value " + Quote(op) + " (supported: In, NotIn)");
    }
    rule->exit_code_in = op == "In";
    const json* values = Field(*codes, "values");
    if (!values || !values->is_array() || values->empty()) {
      return Bad(cpath + ".values", "must be a non-empty list of exit codes, got " + (values ? Quote(*values) : "nothing"));
    }
    for (size_t i = 0; i < values->size(); ++i) {
      const json& c = (*values)[i];
      if (!c.is_number_integer() || c.get<int64_t>() < 0 || c.get<int64_t>() > 255 ||
          (op == "In" && c.get<int64_t>() == 0)) {
        return Bad(cpath + ".values[" + std::to_string(i) + "]",
                   Quote(c) + (op == "In" ? " must be an exit code in [1, 255] (0 is success)"
                                          : " must be an exit code in [0, 255]"));
      }
      rule->exit_codes.insert(c.get<int>());
    }
    matcher = true;
  }
  if (const json* conds = Field(r, "onPodConditions")) {
    const std::string cpath = path + ".onPodConditions";
    if (!conds->is_array() || conds->empty()) return Bad(cpath, "must be a non-empty list, got " + Quote(*conds));
    for (size_t i = 0; i < conds->size(); ++i) {
      const std::string ipath = cpath + "[" + std::to_string(i) + "]";
      const json& c = (*conds)[i];
      if (!c.is_object()) return Bad(ipath, "must be an object {type, reason}, got " + Quote(c));
      std::string type, reason;
      MW_RETURN_IF_ERROR(ReadString(c, "type", ipath + ".type", &type));
      MW_RETURN_IF_ERROR(ReadString(c, "reason", ipath + ".reason", &reason));
      if (type.empty()) return Bad(ipath + ".type", "is required (a Pod condition type such as DisruptionTarget)");
      rule->pod_conditions.emplace_back(type, reason);
    }
    matcher = true;
  }
  if (Field(r, "onMessagePattern")) {
    const std::string ppath = path + ".onMessagePattern";
    MW_RETURN_IF_ERROR(ReadString(r, "onMessagePattern", ppath, &rule->message_pattern));
    if (rule->message_pattern.empty() || rule->message_pattern.size() > kMaxPatternLength) {
      return Bad(ppath, Quote(rule->message_pattern) + " must be 1-" + std::to_string(kMaxPatternLength) +
                            " characters");
    }
    // glibc's matcher backtracks on back-references, and expands bounded repetitions when it
    // compiles ("((a{1,255}){1,255}){1,255}"): one job's pattern could stall every reconcile.
    for (size_t i = 0; i + 1 < rule->message_pattern.size(); ++i) {
      if (rule->message_pattern[i] == '\\' && rule->message_pattern[i + 1] >= '1' && rule->message_pattern[i + 1] <= '9') {
        return Bad(ppath, Quote(rule->message_pattern) + " has a back-reference (\\" +
                              std::string(1, rule->message_pattern[i + 1]) + "), which is not supported");
      }
      if (rule->message_pattern[i] == '\\') ++i;  // an escaped character, such as \{
    }
    for (size_t i = 0; i < rule->message_pattern.size(); ++i) {
      if (rule->message_pattern[i] == '\\') {
        ++i;
      } else if (rule->message_pattern[i] == '{') {
        return Bad(ppath, Quote(rule->message_pattern) +
                              " has a bounded repetition ({m,n}), which is not supported; use *, + or ?, or \\{ for a brace");
      }
    }
    if (const auto compiled = FindPattern(rule->message_pattern, ""); !compiled.ok()) {
      return Bad(ppath, Quote(rule->message_pattern) + " is " + compiled.status().message());
    }
    matcher = true;
  }
  if (!matcher) return Bad(path, "needs at least one of onExitCodes, onPodConditions and onMessagePattern");
  return Status::Ok();
}

// Pod names are <job>-<index> and double as hostnames (DNS-1123 labels, 63 at most), and the
// headless Service is named after the job (a DNS-1035 label: starts with a letter).
Status CheckJobName(const std::string& name) {
  const std::string path = "metadata.name";
  if (name.empty()) return Bad(path, "must not be empty");
  if (name.size() > 52) {
    return Bad(path, Quote(name) + " is " + std::to_string(name.size()) +
                         " characters; at most 52, so that Pod hostnames <name>-<index> stay within 63");
  }
  if (!std::islower(static_cast<unsigned char>(name[0]))) {
    return Bad(path, Quote(name) + " must start with a lower-case letter (it names the job's headless Service)");
  }
  for (char c : name) {
    if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '-')) {
      return Bad(path, Quote(name) + " may contain only lower-case letters, digits and '-'");
    }
  }
  if (name.back() == '-') return Bad(path, Quote(name) + " must not end with '-'");
  return Status::Ok();
}

}  // namespace

std::string Mesh::ToString() const {
  if (chosen_by_trainer) return "auto";
  const std::string dims = std::to_string(dp_replicate) + "x" + std::to_string(dp_shard) + "x" + std::to_string(tp);
  return pp > 1 ? "pp" + std::to_string(pp) + "x" + dims : dims;
}

const char* Mesh::Dims() const {
  return pp > 1 ? "pp x dpReplicate x dpShard x tp" : "dpReplicate x dpShard x tp";
}

const char* FailureActionName(FailureAction a) {
  switch (a) {
    case FailureAction::kFailJob: return "FailJob";
    case FailureAction::kRestartGang: return "RestartGang";
    case FailureAction::kRestartGangAndIgnoreBackoff: return "RestartGangAndIgnoreBackoff";
  }
  return "?";
}

Result<bool> FindPattern(const std::string& pattern, const std::string& text) {
  regex_t re;
  if (const int rc = regcomp(&re, pattern.c_str(), REG_EXTENDED | REG_NOSUB | REG_NEWLINE); rc != 0) {
    char why[256];
    regerror(rc, &re, why, sizeof(why));
    return InvalidConfig(std::string("not a POSIX extended regular expression: ") + why);
  }
  const bool found = regexec(&re, text.c_str(), 0, nullptr, 0) == 0;
  regfree(&re);
  return found;
}

int DefaultMasterPort(const std::string& uid) {
  uint32_t h = 2166136261u;  // FNV-1a
  for (unsigned char c : uid) h = (h ^ c) * 16777619u;
  return 20000 + static_cast<int>(h % 9000);
}

std::set<int> DefaultPermanentExitCodes() { return {exit_code::kConfig, exit_code::kInput}; }

namespace {

// Whether `replicas` Pods make whole data parallel groups of an explicit mesh whose dpShard is what
// the world leaves (an elastic job's): the world must divide by pp x dpReplicate x tp.
Status MeshFits(const Mesh& m, int replicas, int processes_per_replica, const std::string& field) {
  const int64_t world = int64_t{replicas} * processes_per_replica;
  const int64_t fixed = int64_t{m.pp} * m.dp_replicate * m.tp;
  if (world % fixed == 0) return Status::Ok();
  return Bad(field, "at " + std::to_string(replicas) + " replicas the world of " + std::to_string(world) +
                        " ranks (x processesPerReplica " + std::to_string(processes_per_replica) +
                        ") does not divide by spec.mesh's pp x dpReplicate x tp = " + std::to_string(fixed) +
                        ", so dpShard would not be whole: choose elasticPolicy's range, or the mesh, so that every "
                        "size divides");
}

}  // namespace

Mesh MeshAt(const JobSpec& spec, int replicas) {
  if (spec.mesh.chosen_by_trainer) return spec.mesh;
  if (!spec.explicit_mesh) return AutoMesh(replicas, spec.processes_per_replica);
  Mesh m = *spec.explicit_mesh;
  if (m.dp_shard == 0) {
    const int64_t world = int64_t{replicas} * spec.processes_per_replica;
    m.dp_shard = static_cast<int>(world / (int64_t{m.pp} * m.dp_replicate * m.tp));
  }
  return m;
}

Mesh AutoMesh(int replicas, int processes_per_replica) {
  Mesh m;
  if (replicas > 1 && processes_per_replica > 1) {
    m.dp_replicate = replicas;
    m.dp_shard = processes_per_replica;
  } else {
    m.dp_replicate = 1;
    m.dp_shard = replicas * processes_per_replica;
  }
  return m;
}

// Requests and limits are maps of quantities, as in a Pod: the CRD refuses others at admission,
// and this catches them where an older CRD is installed (the Pod would be refused, and the job
// would wait for ever).
Status CheckResources(const json& resources) {
  for (const char* kind : {"requests", "limits"}) {
    const json* values = Field(resources, kind);
    if (values == nullptr) continue;
    const std::string path = std::string("spec.resources.") + kind;
    if (!values->is_object()) return Bad(path, "must be a map of resource name to quantity, got " + Quote(*values));
    for (const auto& [name, value] : values->items()) {
      if (!value.is_string() && !value.is_number()) {
        return Bad(path + "." + name, "must be a quantity, got " + Quote(value));
      }
      const bool bytes = name == "memory" || name == "ephemeral-storage" || name.rfind("hugepages-", 0) == 0;
      const Status parsed = bytes ? ParseBytes(value).status() : ParseCpu(value).status();
      if (!parsed.ok()) return Bad(path + "." + name, parsed.message());
    }
  }
  return Status::Ok();
}

Result<JobSpec> ParseSpec(const json& job) {
  JobSpec s;
  const json& meta = job.contains("metadata") ? job["metadata"] : json::object();
  MW_RETURN_IF_ERROR(CheckJobName(meta.value("name", "")));

  const json* spec_ptr = Field(job, "spec");
  if (!spec_ptr || !spec_ptr->is_object()) return Bad("spec", "is required");
  const json& spec = *spec_ptr;

  if (const json* ref = Field(spec, "runtimeRef")) {
    if (!ref->is_object()) return Bad("spec.runtimeRef", "must be an object {name}, got " + Quote(*ref));
    MW_RETURN_IF_ERROR(ReadString(*ref, "name", "spec.runtimeRef.name", &s.runtime_name));
    if (s.runtime_name.empty()) return Bad("spec.runtimeRef.name", "is required (a TrainingRuntime's name)");
  }
  MW_RETURN_IF_ERROR(ReadString(spec, "image", "spec.image", &s.image));
  if (s.image.empty()) {
    return Bad("spec.image", "is required: the container image that has meshwork-train on its PATH");
  }
  MW_RETURN_IF_ERROR(ReadString(spec, "imagePullPolicy", "spec.imagePullPolicy", &s.image_pull_policy));
  MW_RETURN_IF_ERROR(ReadStrings(spec, "command", "spec.command", &s.command));
  MW_RETURN_IF_ERROR(ReadStrings(spec, "args", "spec.args", &s.args));
  MW_RETURN_IF_ERROR(ReadIntAs(spec, "replicas", "spec.replicas", 1, 4096, &s.replicas));
  MW_RETURN_IF_ERROR(ReadIntAs(spec, "processesPerReplica", "spec.processesPerReplica", 1, 64,
                               &s.processes_per_replica));
  std::string device = "gpu";
  MW_RETURN_IF_ERROR(ReadString(spec, "device", "spec.device", &device));
  if (device != "gpu" && device != "cpu") {
    return Bad("spec.device", "unsupported value " + Quote(device) + " (supported: gpu, cpu)");
  }
  s.gpu = device == "gpu";
  MW_RETURN_IF_ERROR(ReadObject(spec, "resources", "spec.resources", &s.resources));
  MW_RETURN_IF_ERROR(CheckResources(s.resources));
  MW_RETURN_IF_ERROR(ReadObject(spec, "template", "spec.template", &s.pod_template));
  if (s.pod_template.contains("spec") && !s.pod_template["spec"].is_object()) {
    return Bad("spec.template.spec", "must be an object, got " + Quote(s.pod_template["spec"]));
  }

  // Config: exactly one of inline and configMapRef.
  const json* config = Field(spec, "config");
  if (!config) return Bad("spec.config", "is required: set config.inline or config.configMapRef");
  const bool has_inline = Field(*config, "inline") != nullptr;
  const bool has_ref = Field(*config, "configMapRef") != nullptr;
  if (has_inline == has_ref) {
    return Bad("spec.config", "set exactly one of inline and configMapRef");
  }
  if (has_inline) {
    MW_RETURN_IF_ERROR(ReadString(*config, "inline", "spec.config.inline", &s.config_inline));
    if (s.config_inline.empty()) return Bad("spec.config.inline", "must not be empty");
  } else {
    const json& ref = (*config)["configMapRef"];
    MW_RETURN_IF_ERROR(ReadString(ref, "name", "spec.config.configMapRef.name", &s.config_map_name));
    if (s.config_map_name.empty()) return Bad("spec.config.configMapRef.name", "must not be empty");
    MW_RETURN_IF_ERROR(ReadString(ref, "key", "spec.config.configMapRef.key", &s.config_map_key));
  }

  // Mesh: explicit, or auto from the gang's shape.
  bool mesh_auto = false;
  if (const json* mesh = Field(spec, "mesh")) MW_RETURN_IF_ERROR(ReadBool(*mesh, "auto", "spec.mesh.auto", &mesh_auto));
  if (mesh_auto) {
    const json& mesh = *Field(spec, "mesh");
    for (const char* dim : {"dpReplicate", "dpShard", "tp", "pp"}) {
      if (Field(mesh, dim)) {
        return Bad(std::string("spec.mesh.") + dim,
                   "must not be set with spec.mesh.auto: true (the trainer chooses dpReplicate x dpShard)");
      }
    }
    s.mesh.chosen_by_trainer = true;
  } else if (const json* mesh = Field(spec, "mesh")) {
    Mesh m;
    m.dp_shard = 0;
    MW_RETURN_IF_ERROR(ReadIntAs(*mesh, "dpReplicate", "spec.mesh.dpReplicate", 1, 1 << 20, &m.dp_replicate));
    MW_RETURN_IF_ERROR(ReadIntAs(*mesh, "dpShard", "spec.mesh.dpShard", 1, 1 << 20, &m.dp_shard));
    // A tp group lives in one Pod (below), so tp is at most processesPerReplica's 64.
    MW_RETURN_IF_ERROR(ReadIntAs(*mesh, "tp", "spec.mesh.tp", 1, 64, &m.tp));
    MW_RETURN_IF_ERROR(ReadIntAs(*mesh, "pp", "spec.mesh.pp", 1, 1024, &m.pp));
    // An elastic job's world changes with its replicas: pp, dpReplicate and tp stay, and dpShard
    // is what the world leaves (MeshAt), so it is left out; any other explicit mesh sets it.
    const bool elastic = Field(spec, "elasticPolicy") != nullptr;
    if (m.dp_shard == 0 && !elastic) {
      return Bad("spec.mesh.dpShard", "is required when spec.mesh is set (an elastic job leaves it out: it follows "
                                      "spec.replicas)");
    }
    if (m.dp_shard != 0 && elastic) {
      return Bad("spec.mesh.dpShard", Quote(m.dp_shard) + " is fixed, but spec.elasticPolicy changes the world with "
                                      "spec.replicas: leave dpShard out, and each gang shards over what its world "
                                      "leaves (replicas x processesPerReplica / (pp x dpReplicate x tp))");
    }
    // tp is the innermost mesh dim, so a tp group is tp consecutive ranks; a Pod holds
    // processesPerReplica consecutive ranks. tp dividing processesPerReplica keeps every group
    // inside one Pod: its collectives run in every layer and need the node's links.
    if (s.processes_per_replica % m.tp != 0) {
      return Bad("spec.mesh.tp", Quote(m.tp) + " does not divide processesPerReplica " +
                                     Quote(s.processes_per_replica) +
                                     " (a tensor parallel group must be inside one Pod: its ranks are consecutive, "
                                     "processesPerReplica of them per Pod)");
    }
    if (m.dp_shard == 0) {
      if (Status fits = MeshFits(m, s.replicas, s.processes_per_replica, "spec.mesh"); !fits.ok()) return fits;
    } else {
      const int64_t product = int64_t{m.pp} * m.dp_replicate * m.dp_shard * m.tp;
      if (product != s.WorldSize()) {
        return Bad("spec.mesh", std::string(m.Dims()) + " = " + m.ToString() + " = " + std::to_string(product) +
                                    " does not equal replicas x processesPerReplica = " +
                                    std::to_string(s.replicas) + "x" + std::to_string(s.processes_per_replica) +
                                    " = " + std::to_string(s.WorldSize()));
      }
    }
    if (m.pp > 1 && s.gpu) {
      return Bad("spec.mesh.pp", Quote(m.pp) + " pipeline stages need point-to-point transfers between GPUs, which "
                                 "Meshwork's NCCL communicator does not have yet: pipelines run with device: cpu");
    }
    s.explicit_mesh = m;
    s.mesh = MeshAt(s, s.replicas);
  } else {
    s.mesh = AutoMesh(s.replicas, s.processes_per_replica);
  }

  if (const json* elastic = Field(spec, "elasticPolicy")) {
    if (!elastic->is_object()) return Bad("spec.elasticPolicy", "must be an object, got " + Quote(*elastic));
    ElasticPolicy e;
    if (!Field(*elastic, "maxReplicas")) return Bad("spec.elasticPolicy.maxReplicas", "is required");
    MW_RETURN_IF_ERROR(ReadIntAs(*elastic, "minReplicas", "spec.elasticPolicy.minReplicas", 1, 4096, &e.min_replicas));
    MW_RETURN_IF_ERROR(ReadIntAs(*elastic, "maxReplicas", "spec.elasticPolicy.maxReplicas", 1, 4096, &e.max_replicas));
    if (e.min_replicas > e.max_replicas) {
      return Bad("spec.elasticPolicy", "minReplicas " + Quote(e.min_replicas) + " exceeds maxReplicas " +
                                           Quote(e.max_replicas));
    }
    if (s.replicas < e.min_replicas || s.replicas > e.max_replicas) {
      return Bad("spec.replicas", Quote(s.replicas) + " is outside spec.elasticPolicy's " +
                                      std::to_string(e.min_replicas) + " to " + std::to_string(e.max_replicas));
    }
    if (s.explicit_mesh) {
      // Every size the job may take must make whole data parallel groups: a resize must not be
      // the first to find it does not.
      for (int replicas = e.min_replicas; replicas <= e.max_replicas; ++replicas) {
        MW_RETURN_IF_ERROR(MeshFits(*s.explicit_mesh, replicas, s.processes_per_replica, "spec.elasticPolicy"));
      }
    }
    e.spec_replicas = s.replicas;
    s.elastic = e;
  }

  if (const json* ckpt = Field(spec, "checkpoint")) {
    std::string path = "/checkpoints";
    MW_RETURN_IF_ERROR(ReadString(*ckpt, "path", "spec.checkpoint.path", &path));
    if (path.empty() || path[0] != '/') return Bad("spec.checkpoint.path", Quote(path) + " must be absolute");
    s.checkpoint_path = path;
    MW_RETURN_IF_ERROR(ReadOptionalInt(*ckpt, "every", "spec.checkpoint.every", 0,
                                       std::numeric_limits<int32_t>::max(), &s.checkpoint_every));
    if (const json* vol = Field(*ckpt, "volume")) {
      if (!vol->is_object() || vol->empty()) {
        return Bad("spec.checkpoint.volume", "must be a volume source object, got " + Quote(*vol));
      }
      s.checkpoint_volume = *vol;
    }
  }

  const json empty = json::object();
  const json* run = Field(spec, "runPolicy");
  const json& rp = run ? *run : empty;
  if (run && !run->is_object()) return Bad("spec.runPolicy", "must be an object, got " + Quote(*run));
  MW_RETURN_IF_ERROR(ReadEnum<RestartPolicy>(rp, "restartPolicy", "spec.runPolicy.restartPolicy",
                                             {{"OnFailure", RestartPolicy::kOnFailure},
                                              {"ExitCode", RestartPolicy::kExitCode},
                                              {"Never", RestartPolicy::kNever}},
                                             &s.restart_policy));
  if (const json* codes = Field(rp, "permanentExitCodes")) {
    if (!codes->is_array()) return Bad("spec.runPolicy.permanentExitCodes", "must be a list, got " + Quote(*codes));
    if (!codes->empty() && s.restart_policy != RestartPolicy::kExitCode) {
      return Bad("spec.runPolicy.permanentExitCodes", "needs restartPolicy ExitCode");
    }
    for (size_t i = 0; i < codes->size(); ++i) {
      const json& c = (*codes)[i];
      const std::string path = "spec.runPolicy.permanentExitCodes[" + std::to_string(i) + "]";
      if (!c.is_number_integer() || c.get<int64_t>() < 1 || c.get<int64_t>() > 255) {
        return Bad(path, Quote(c) + " must be an exit code in [1, 255]");
      }
      s.permanent_exit_codes.insert(c.get<int>());
    }
  }
  if (s.restart_policy == RestartPolicy::kExitCode && s.permanent_exit_codes.empty()) {
    s.permanent_exit_codes = DefaultPermanentExitCodes();
  }
  MW_RETURN_IF_ERROR(ReadIntAs(rp, "backoffLimit", "spec.runPolicy.backoffLimit", 0, 1 << 20, &s.backoff_limit));
  MW_RETURN_IF_ERROR(ReadOptionalInt(rp, "activeDeadlineSeconds", "spec.runPolicy.activeDeadlineSeconds", 1,
                                     std::numeric_limits<int32_t>::max(), &s.active_deadline_seconds));
  MW_RETURN_IF_ERROR(ReadOptionalInt(rp, "ttlSecondsAfterFinished", "spec.runPolicy.ttlSecondsAfterFinished", 0,
                                     std::numeric_limits<int32_t>::max(), &s.ttl_seconds_after_finished));
  MW_RETURN_IF_ERROR(ReadIntAs(rp, "nodeLossGraceSeconds", "spec.runPolicy.nodeLossGraceSeconds", 0, 86400,
                               &s.node_loss_grace_seconds));
  MW_RETURN_IF_ERROR(ReadBool(rp, "suspend", "spec.runPolicy.suspend", &s.suspend));
  MW_RETURN_IF_ERROR(ReadEnum<CleanPodPolicy>(rp, "cleanPodPolicy", "spec.runPolicy.cleanPodPolicy",
                                              {{"None", CleanPodPolicy::kNone},
                                               {"Running", CleanPodPolicy::kRunning},
                                               {"All", CleanPodPolicy::kAll}},
                                              &s.clean_pod_policy));
  const json* scheduling = Field(rp, "schedulingPolicy");
  if (scheduling && !scheduling->is_object()) {
    return Bad("spec.runPolicy.schedulingPolicy", "must be an object, got " + Quote(*scheduling));
  }
  MW_RETURN_IF_ERROR(ReadEnum<GangAdmission>(scheduling ? *scheduling : empty, "gangAdmission",
                                             "spec.runPolicy.schedulingPolicy.gangAdmission",
                                             {{"Operator", GangAdmission::kOperator},
                                              {"PodGroup", GangAdmission::kPodGroup},
                                              {"Volcano", GangAdmission::kVolcano},
                                              {"Coscheduling", GangAdmission::kCoscheduling},
                                              {"None", GangAdmission::kNone}},
                                             &s.gang_admission));
  {
    const json& sp = scheduling ? *scheduling : empty;
    const std::string base = "spec.runPolicy.schedulingPolicy.";
    MW_RETURN_IF_ERROR(ReadString(sp, "queue", base + "queue", &s.scheduling_queue));
    MW_RETURN_IF_ERROR(ReadString(sp, "priorityClass", base + "priorityClass", &s.scheduling_priority_class));
    MW_RETURN_IF_ERROR(ReadOptionalInt(sp, "scheduleTimeoutSeconds", base + "scheduleTimeoutSeconds", 1,
                                       std::numeric_limits<int32_t>::max(), &s.schedule_timeout_seconds));
    // Each belongs to one scheduler's PodGroup: set for another, it would be silently ignored.
    if (!s.scheduling_queue.empty() && s.gang_admission != GangAdmission::kVolcano) {
      return Bad(base + "queue", Quote(s.scheduling_queue) + " is Volcano's queue: set it with gangAdmission Volcano");
    }
    if (!s.scheduling_priority_class.empty() && s.gang_admission != GangAdmission::kVolcano) {
      return Bad(base + "priorityClass", Quote(s.scheduling_priority_class) +
                                             " goes on Volcano's PodGroup: set it with gangAdmission Volcano (for "
                                             "other schedulers, set spec.template.spec.priorityClassName)");
    }
    if (s.schedule_timeout_seconds && s.gang_admission != GangAdmission::kCoscheduling) {
      return Bad(base + "scheduleTimeoutSeconds", std::to_string(*s.schedule_timeout_seconds) +
                                                      " is the coscheduling plugin's: set it with gangAdmission Coscheduling");
    }
  }
  MW_RETURN_IF_ERROR(ReadEnum<SuccessPolicy>(rp, "successPolicy", "spec.runPolicy.successPolicy",
                                             {{"AllRanks", SuccessPolicy::kAllRanks}, {"Rank0", SuccessPolicy::kRank0}},
                                             &s.success_policy));
  if (const json* fp = Field(rp, "failurePolicy")) {
    if (!fp->is_object()) return Bad("spec.runPolicy.failurePolicy", "must be an object, got " + Quote(*fp));
    if (const json* rules = Field(*fp, "rules")) {
      const std::string path = "spec.runPolicy.failurePolicy.rules";
      if (!rules->is_array()) return Bad(path, "must be a list, got " + Quote(*rules));
      if (rules->size() > kMaxFailureRules) {
        return Bad(path, std::to_string(rules->size()) + " rules; at most " + std::to_string(kMaxFailureRules));
      }
      for (size_t i = 0; i < rules->size(); ++i) {
        FailureRule rule;
        MW_RETURN_IF_ERROR(ReadFailureRule((*rules)[i], path + "[" + std::to_string(i) + "]", &rule));
        s.failure_rules.push_back(std::move(rule));
      }
    }
  }

  MW_RETURN_IF_ERROR(ReadIntAs(spec, "metricsPort", "spec.metricsPort", 0, 65535, &s.metrics_port));
  if (Field(spec, "masterPort")) {
    MW_RETURN_IF_ERROR(ReadIntAs(spec, "masterPort", "spec.masterPort", 1, 65535, &s.master_port));
  } else {
    s.master_port = DefaultMasterPort(meta.value("uid", ""));
    // A derived port must not land on the metrics ports: step past them (still stable).
    if (s.metrics_port > 0 && s.master_port >= s.metrics_port &&
        s.master_port < s.metrics_port + s.processes_per_replica) {
      s.master_port = s.metrics_port + s.processes_per_replica;
    }
  }
  if (s.metrics_port > 0 && s.metrics_port + s.processes_per_replica - 1 > 65535) {
    return Bad("spec.metricsPort", std::to_string(s.metrics_port) + " + processesPerReplica - 1 exceeds 65535");
  }
  if (s.metrics_port > 0 && s.master_port >= s.metrics_port &&
      s.master_port < s.metrics_port + s.processes_per_replica) {
    return Bad("spec.masterPort", std::to_string(s.master_port) +
                                      " collides with the metrics ports starting at spec.metricsPort " +
                                      std::to_string(s.metrics_port));
  }
  return s;
}

std::vector<std::string> TrainerOverrides(const JobSpec& spec, const std::string& ns, const std::string& name,
                                          const std::string& uid) {
  std::vector<std::string> out;
  if (spec.mesh.chosen_by_trainer) {
    // The plan chosen at admission; before it is (ValidateTrainerConfig's own load), any mesh.
    if (spec.plan_overrides.empty()) out.push_back("dist.mesh=auto");
    out.insert(out.end(), spec.plan_overrides.begin(), spec.plan_overrides.end());
  } else {
    out.push_back("mesh.dp_replicate=" + std::to_string(spec.mesh.dp_replicate));
    out.push_back("mesh.dp_shard=" + std::to_string(spec.mesh.dp_shard));
    // Always, 1 included: the spec's mesh replaces any mesh.tp in the config text, as it does
    // the other dims.
    out.push_back("mesh.tp=" + std::to_string(spec.mesh.tp));
    out.push_back("mesh.pp=" + std::to_string(spec.mesh.pp));
  }
  out.push_back("metrics.job=" + name);
  if (spec.metrics_port > 0) {
    // Bind the Pod's own address: on the local control plane every Pod shares the host's
    // network, and its loopback address is its own.
    out.push_back("metrics.host=$(POD_IP)");
    out.push_back("metrics.port=" + std::to_string(spec.metrics_port));
  } else {
    out.push_back("metrics.port=-1");
  }
  if (spec.checkpoint_path) {
    out.push_back("checkpoint.dir=" + *spec.checkpoint_path + "/" + ns + "/" + name + "/" + uid);
    if (spec.checkpoint_every) out.push_back("checkpoint.every=" + std::to_string(*spec.checkpoint_every));
  }
  if (!spec.gpu) out.push_back("training.device=cpu");
  if (spec.global_batch_size > 0) out.push_back("training.global_batch_size=" + std::to_string(spec.global_batch_size));
  return out;
}

namespace {

// status.pipeline: what the trainer will run, and the share of its ranks' time the schedule
// itself leaves idle with stages alike (compiler::pipeline::ScheduleBubble: PipeMare's steady
// step), which the trainer's measured bubble is read against.
Result<json> PipelineStatus(const config::TrainConfig& cfg, const compiler::pipeline::Program& program) {
  MW_ASSIGN_OR_RETURN(const double bubble, compiler::pipeline::ScheduleBubble(program));
  return json{{"schedule", NameOf(config::kPipelineScheduleNames, cfg.pipeline.schedule)},
              {"microBatches", cfg.training.grad_accum},
              {"virtualStages", cfg.pipeline.virtual_stages},
              {"stages", program.shape.stages()},
              {"scheduleBubble", std::round(bubble * 1000) / 1000}};
}

// An elastic job's global batch: the config's training.global_batch_size, else its rows a step at
// maxReplicas (data.batch_size x training.grad_accum x the data parallel ranks there: the world
// over tp x pp, which an elastic job keeps). It must split at every size the job may take, and a
// pipeline's schedule must run the micro-batches each split makes: a resize must not be the
// first to find it does not.
Result<int64_t> ElasticGlobalBatch(const config::TrainConfig& cfg, const JobSpec& spec) {
  const ElasticPolicy& e = *spec.elastic;
  const int64_t ranks = spec.processes_per_replica;
  const int64_t model_ranks = cfg.mesh.tp * cfg.mesh.pp;
  const int64_t dp_at_max = e.max_replicas * ranks / model_ranks;
  const bool given = cfg.training.global_batch_size > 0;
  const int64_t global = given ? cfg.training.global_batch_size : cfg.data.batch_size * cfg.training.grad_accum * dp_at_max;
  const std::string what =
      given ? "training.global_batch_size " + std::to_string(global)
            : "the global batch of " + std::to_string(global) + " rows (data.batch_size " +
                  std::to_string(cfg.data.batch_size) + " x training.grad_accum " + std::to_string(cfg.training.grad_accum) +
                  " x " + std::to_string(dp_at_max) + " data parallel ranks at maxReplicas)";
  constexpr int64_t kMaxGlobalBatch = int64_t{1} << 40;  // training.global_batch_size's bound
  if (global > kMaxGlobalBatch) {
    return Bad("spec.elasticPolicy", what + " exceeds training.global_batch_size's bound of 2^40 rows");
  }
  for (int replicas = e.min_replicas; replicas <= e.max_replicas; ++replicas) {
    config::TrainConfig at = cfg;
    at.training.global_batch_size = global;
    if (!spec.mesh.chosen_by_trainer) at.mesh.dp_shard = MeshAt(spec, replicas).dp_shard;
    const std::string size = std::to_string(replicas) + " replicas (" + std::to_string(replicas * ranks) + " ranks)";
    auto split = config::ResolveGlobalBatch(at, replicas * ranks);
    if (!split.ok()) return Bad("spec.elasticPolicy", what + " does not split at " + size + ": " + split.status().message());
    if (at.mesh.pp > 1) {
      auto schedule = config::PipelineProgram(at);
      if (!schedule.ok()) {
        return Bad("spec.elasticPolicy", what + " at " + size + " makes " + std::to_string(at.training.grad_accum) +
                                             " micro-batches, which the pipeline cannot run: " +
                                             schedule.status().message());
      }
    }
  }
  return global;
}

}  // namespace

std::vector<std::string> ValidationOverrides(const JobSpec& spec, const std::string& ns, const std::string& name) {
  std::vector<std::string> overrides = TrainerOverrides(spec, ns, name, "uid");
  for (auto& o : overrides) {
    // The Pod's address is only known once it runs; any local address validates the same.
    if (o == "metrics.host=$(POD_IP)") o = "metrics.host=127.0.0.1";
  }
  // spec.args may carry `--set KEY=VALUE` pairs; check those keys too.
  for (size_t i = 0; i + 1 < spec.args.size(); ++i) {
    if (spec.args[i] == "--set") overrides.push_back(spec.args[i + 1]);
  }
  return overrides;
}

Status CheckPipeline(const config::TrainConfig& cfg, const std::string& field, json* pipeline) {
  if (pipeline != nullptr) *pipeline = json();
  if (cfg.mesh.pp <= 1) return Status::Ok();
  auto schedule = config::PipelineProgram(cfg);
  if (!schedule.ok()) return Bad(field, "the trainer refuses this config: " + schedule.status().message());
  if (pipeline != nullptr) {
    auto status = PipelineStatus(cfg, *schedule);
    // A program the generator made that does not simulate is the generator's bug, not the job's.
    if (!status.ok()) return Internal(field + ": " + status.status().message());
    *pipeline = *status;
  }
  return Status::Ok();
}

Status ValidateTrainerConfig(const std::string& config_yaml, const JobSpec& spec, const std::string& ns,
                             const std::string& name, const std::string& field, json* pipeline,
                             int64_t* global_batch_size) {
  if (pipeline != nullptr) *pipeline = json();
  if (global_batch_size != nullptr) *global_batch_size = 0;
  // The config reaches the trainer as a file of a ConfigMap volume; an inline config is first
  // written to the job's ConfigMap, which the API server refuses over 1 MiB (the job would wait
  // for ever). A configMapRef's ConfigMap exists, so it is within the limit.
  if (config_yaml.size() > kMaxConfigMapBytes) {
    return Bad(field, std::to_string(config_yaml.size()) + " bytes of config; it reaches the trainer through a "
                      "ConfigMap, which holds at most " + std::to_string(kMaxConfigMapBytes) +
                      " bytes: keep long lists (data files, overrides) out of the config");
  }
  auto loaded = config::LoadConfigFromString(config_yaml, ValidationOverrides(spec, ns, name));
  if (!loaded.ok()) return Bad(field, "the trainer refuses this config: " + loaded.status().message());
  MW_RETURN_IF_ERROR(CheckPipeline(*loaded, field, pipeline));
  if (spec.elastic) {
    auto global = ElasticGlobalBatch(*loaded, spec);
    if (!global.ok()) return global.status();
    if (global_batch_size != nullptr) *global_batch_size = *global;
  }
  // spec.mesh.auto: the plan is chosen and checked when a gang starts (PlanGang, plan_choice.h).
  return Status::Ok();
}

std::string OtherManager(const json& job) {
  const json* spec = job.contains("spec") && job["spec"].is_object() ? &job["spec"] : nullptr;
  if (spec == nullptr || !spec->contains("managedBy") || !(*spec)["managedBy"].is_string()) return "";
  const std::string manager = (*spec)["managedBy"].get<std::string>();
  return manager == kManagedByOperator ? "" : manager;
}

}  // namespace meshwork::op
