#include "trainer/compiler/hardware_profile.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/file.h"

namespace meshwork::compiler {
namespace {

std::string Quote(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return "null";
  if (n.IsScalar()) return "'" + n.Scalar() + "'";
  return n.IsMap() ? "a mapping" : "a list";
}

// Reads one mapping: each known key once, unknown keys and missing required keys refused.
class KeyReader {
 public:
  // `section` is "" for the top level, else the key whose mapping this is ("intra_node").
  KeyReader(std::string source, std::string section)
      : source_(std::move(source)), section_(std::move(section)), prefix_(section_.empty() ? "" : section_ + ".") {}

  Status Bad(const std::string& key, const std::string& what) const {
    return InvalidInput(source_ + ": key '" + prefix_ + key + "': " + what);
  }

  // A number in (lo, hi] (or [lo, hi] when !lo_open); YAML's 989e12 and 25e-6 are accepted.
  std::function<Status(const YAML::Node&)> Number(const std::string& key, double* out, double lo, double hi,
                                                  bool lo_open) const {
    return [=](const YAML::Node& n) -> Status {
      double v = 0;
      if (!n.IsScalar() || !YAML::convert<double>::decode(n, v) || !std::isfinite(v)) {
        return Bad(key, "expected a number, got " + Quote(n));
      }
      if ((lo_open ? v <= lo : v < lo) || v > hi) {
        std::ostringstream os;
        os << "must be in " << (lo_open ? "(" : "[") << lo << ", " << hi << "], got " << n.Scalar();
        return Bad(key, os.str());
      }
      *out = v;
      return Status::Ok();
    };
  }

  // A positive whole number; written as 80e9 as well as 80000000000.
  std::function<Status(const YAML::Node&)> Count(const std::string& key, int64_t* out, int64_t hi) const {
    return [=](const YAML::Node& n) -> Status {
      double v = 0;
      if (!n.IsScalar() || !YAML::convert<double>::decode(n, v) || !std::isfinite(v) || v != std::floor(v)) {
        return Bad(key, "expected a whole number, got " + Quote(n));
      }
      if (v < 1 || v > static_cast<double>(hi)) {
        return Bad(key, "must be in [1, " + std::to_string(hi) + "], got " + n.Scalar());
      }
      *out = static_cast<int64_t>(v);
      return Status::Ok();
    };
  }

  std::function<Status(const YAML::Node&)> Text(const std::string& key, std::string* out) const {
    return [=](const YAML::Node& n) -> Status {
      if (!n.IsScalar() || n.Scalar().empty()) return Bad(key, "expected a non-empty string, got " + Quote(n));
      *out = n.Scalar();
      return Status::Ok();
    };
  }

  struct Key {
    std::string name;
    bool required;
    std::function<Status(const YAML::Node&)> apply;
  };

  // Applies `keys` to `node`; `present` (optional) reports which were given.
  Status Read(const YAML::Node& node, const std::vector<Key>& keys,
              std::map<std::string, bool>* present = nullptr) const {
    if (!node.IsMap()) return InvalidInput(source_ + ": " + Where() + " must be a mapping of keys, got " + Quote(node));
    std::map<std::string, const Key*> by_name;
    std::string known;
    for (const auto& k : keys) {
      by_name[k.name] = &k;
      known += (known.empty() ? "" : ", ") + k.name;
    }
    std::map<std::string, bool> seen;
    for (const auto& kv : node) {
      const std::string name = kv.first.IsScalar() ? kv.first.Scalar() : "?";
      auto it = by_name.find(name);
      if (it == by_name.end()) {
        return InvalidInput(source_ + ": unknown key '" + prefix_ + name + "' (known in " + Where() + ": " + known +
                            ")");
      }
      MW_RETURN_IF_ERROR(it->second->apply(kv.second));
      seen[name] = true;
    }
    for (const auto& k : keys) {
      if (k.required && !seen.count(k.name)) return Bad(k.name, "missing (required)");
    }
    if (present) *present = seen;
    return Status::Ok();
  }

 private:
  std::string Where() const { return section_.empty() ? "the top level" : "key '" + section_ + "'"; }

  std::string source_;
  std::string section_;
  std::string prefix_;
};

std::function<Status(const YAML::Node&)> ReadLink(const std::string& source, const std::string& key, LinkCost* out) {
  return [=](const YAML::Node& n) -> Status {
    KeyReader r(source, key);
    return r.Read(n, {
        {"latency_seconds", true, r.Number("latency_seconds", &out->latency_seconds, 0.0, 1.0, false)},
        // Bounded above only to catch unit slips (GB/s written as bytes/s times 1e9, say).
        {"bus_bytes_per_second", true, r.Number("bus_bytes_per_second", &out->bus_bytes_per_second, 0.0, 1e15, true)},
    });
  };
}

}  // namespace

Result<HardwareProfile> ParseHardwareProfile(const std::string& yaml_text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::ParserException& e) {
    return InvalidInput(source + ": YAML syntax error at line " + std::to_string(e.mark.line + 1) + ", column " +
                        std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
  HardwareProfile p;
  int64_t gpus_per_node = 0;
  KeyReader r(source, "");
  std::map<std::string, bool> present;
  MW_RETURN_IF_ERROR(r.Read(root,
                            {
                                {"name", true, r.Text("name", &p.name)},
                                {"peak_flops_per_second", true,
                                 r.Number("peak_flops_per_second", &p.peak_flops_per_second, 0.0, 1e18, true)},
                                {"achieved_mfu", true, r.Number("achieved_mfu", &p.achieved_mfu, 0.0, 1.0, true)},
                                {"memory_bytes", true,
                                 r.Count("memory_bytes", &p.memory_bytes, std::numeric_limits<int64_t>::max() / 2)},
                                {"gpus_per_node", true, r.Count("gpus_per_node", &gpus_per_node, 1 << 16)},
                                {"intra_node", true, ReadLink(source, "intra_node", &p.intra_node)},
                                {"inter_node", false, ReadLink(source, "inter_node", &p.inter_node)},
                                {"interference", false, r.Number("interference", &p.interference, 0.0, 100.0, false)},
                                {"host_copy_bytes_per_second", false,
                                 r.Number("host_copy_bytes_per_second", &p.host_copy_bytes_per_second, 0.0, 1e15, false)},
                            },
                            &present));
  p.gpus_per_node = static_cast<int>(gpus_per_node);
  p.has_inter_node = present.count("inter_node") > 0;
  return p;
}

Result<HardwareProfile> LoadHardwareProfile(const std::string& path) {
  auto text = ReadTextFile(path);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) {
      return NotFound("hardware profile '" + path + "' does not exist (shipped profiles: bench/profiles/*.yaml)");
    }
    return text.status();
  }
  return ParseHardwareProfile(*text, path);
}

bool GroupsWithinNode(int group_size, int stride, int world, int gpus_per_node) {
  if (group_size <= 1) return true;
  // Ranks grow with node index, so a group is within one node iff its first and last are.
  const int groups = world / group_size;
  for (int g = 0; g < groups; ++g) {
    // The g-th group: consecutive (stride 1) blocks, or every stride-th rank from an offset.
    const int first = stride == 1 ? g * group_size : (g % stride) + (g / stride) * stride * group_size;
    const int last = first + (group_size - 1) * stride;
    if (first / gpus_per_node != last / gpus_per_node) return false;
  }
  return true;
}

Result<HardwareProfile> FindHardwareProfile(const std::string& name_or_path) {
  const bool path = name_or_path.find('/') != std::string::npos ||
                    (name_or_path.size() > 5 && name_or_path.compare(name_or_path.size() - 5, 5, ".yaml") == 0);
  return path ? LoadHardwareProfile(name_or_path) : BuiltinProfile(name_or_path);
}

Result<CostModel> MakeCostModel(const HardwareProfile& profile, int dp_replicate, int dp_shard, int tp) {
  if (dp_shard < 1) return InvalidConfig("dp_shard must be >= 1, got " + std::to_string(dp_shard));
  if (dp_replicate < 1) return InvalidConfig("dp_replicate must be >= 1, got " + std::to_string(dp_replicate));
  if (tp < 1) return InvalidConfig("tp must be >= 1, got " + std::to_string(tp));
  const int world = dp_replicate * dp_shard * tp;
  CostModel cost;
  cost.dp_shard = dp_shard;
  cost.dp_replicate = dp_replicate;
  cost.tp = tp;
  cost.interference = profile.interference;
  cost.host_copy_bytes_per_second = profile.host_copy_bytes_per_second;
  auto pick = [&](const char* dim, int size, int stride, LinkCost* out) -> Status {
    if (GroupsWithinNode(size, stride, world, profile.gpus_per_node)) {
      *out = profile.intra_node;
      return Status::Ok();
    }
    if (!profile.has_inter_node) {
      return InvalidConfig("hardware profile '" + profile.name + "' describes one node of " +
                           std::to_string(profile.gpus_per_node) + " devices and has no inter_node link, but the " +
                           dim + " groups of a " + std::to_string(dp_replicate) + " x " + std::to_string(dp_shard) +
                           " x " + std::to_string(tp) + " mesh cross nodes");
    }
    *out = profile.inter_node;
    return Status::Ok();
  };
  // tp is the innermost mesh dimension (tp groups are consecutive ranks), then dp_shard (a shard
  // group takes every tp-th rank), then dp_replicate (every (dp_shard x tp)-th).
  MW_RETURN_IF_ERROR(pick("tp", tp, 1, &cost.tp_link));
  MW_RETURN_IF_ERROR(pick("dp_shard", dp_shard, tp, &cost.shard_link));
  MW_RETURN_IF_ERROR(pick("dp_replicate", dp_replicate, dp_shard * tp, &cost.replicate_link));
  return cost;
}

}  // namespace meshwork::compiler
