// ReadDistEnv: torchrun's and Meshwork's variables, checked against each other and validated.
#include "trainer/dist/env.h"

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <optional>

namespace meshwork::dist {
namespace {

// One field's value and the variable it came from (for error messages).
struct Setting {
  std::string name;
  std::string value;
};

// The value of `meshwork_name` or `torchrun_name`; both set and different is an error.
Result<std::optional<Setting>> Lookup(const std::function<const char*(const char*)>& getenv,
                                      const char* meshwork_name, const char* torchrun_name) {
  auto get = [&](const char* name) -> std::optional<Setting> {
    const char* v = getenv(name);
    if (v == nullptr || *v == '\0') return std::nullopt;
    return Setting{name, v};
  };
  std::optional<Setting> ours = get(meshwork_name);
  std::optional<Setting> theirs = get(torchrun_name);
  if (ours && theirs && ours->value != theirs->value) {
    return InvalidConfig(std::string(meshwork_name) + "='" + ours->value + "' and " +
                         torchrun_name + "='" + theirs->value +
                         "' are both set and disagree; set one, or both to the same value");
  }
  return ours ? ours : theirs;
}

Status ParseInt(const Setting& s, int min, int max, int* out) {
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(s.value.c_str(), &end, 10);
  bool starts_like_number =
      std::isdigit(static_cast<unsigned char>(s.value[0])) || s.value[0] == '-';
  if (!starts_like_number || end == s.value.c_str() || *end != '\0' || errno == ERANGE) {
    return InvalidConfig(s.name + "='" + s.value + "' is not an integer");
  }
  if (v < min || v > max) {
    return InvalidConfig(s.name + "='" + s.value + "' is out of range [" + std::to_string(min) +
                         ", " + std::to_string(max) + "]");
  }
  *out = static_cast<int>(v);
  return Status::Ok();
}

// "RANK=5" for a field that came from a variable, "world size 1 (the default)" otherwise.
std::string Describe(const std::optional<Setting>& s, const char* what, int value) {
  if (s) return s->name + "=" + s->value;
  return std::string(what) + " " + std::to_string(value) + " (the default; no variable set)";
}

}  // namespace

Result<DistEnv> ReadDistEnv(const std::function<const char*(const char*)>& getenv) {
  DistEnv env;
  MW_ASSIGN_OR_RETURN(auto rank, Lookup(getenv, "MESHWORK_RANK", "RANK"));
  MW_ASSIGN_OR_RETURN(auto world, Lookup(getenv, "MESHWORK_WORLD_SIZE", "WORLD_SIZE"));
  MW_ASSIGN_OR_RETURN(auto local_rank, Lookup(getenv, "MESHWORK_LOCAL_RANK", "LOCAL_RANK"));
  MW_ASSIGN_OR_RETURN(auto local_world,
                      Lookup(getenv, "MESHWORK_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE"));
  MW_ASSIGN_OR_RETURN(auto addr, Lookup(getenv, "MESHWORK_MASTER_ADDR", "MASTER_ADDR"));
  MW_ASSIGN_OR_RETURN(auto port, Lookup(getenv, "MESHWORK_MASTER_PORT", "MASTER_PORT"));
  MW_ASSIGN_OR_RETURN(auto generation, Lookup(getenv, "MESHWORK_RESTART_GENERATION",
                                              "TORCHELASTIC_RESTART_COUNT"));

  if (rank) MW_RETURN_IF_ERROR(ParseInt(*rank, 0, INT_MAX, &env.rank));
  if (world) MW_RETURN_IF_ERROR(ParseInt(*world, 1, INT_MAX, &env.world_size));
  if (local_rank) MW_RETURN_IF_ERROR(ParseInt(*local_rank, 0, INT_MAX, &env.local_rank));
  if (local_world) MW_RETURN_IF_ERROR(ParseInt(*local_world, 1, INT_MAX, &env.local_world_size));
  if (port) MW_RETURN_IF_ERROR(ParseInt(*port, 1, 65535, &env.master_port));
  if (generation) MW_RETURN_IF_ERROR(ParseInt(*generation, 0, INT_MAX, &env.restart_generation));
  if (addr) env.master_addr = addr->value;
  auto text = [&getenv](const char* name) {
    const char* v = getenv(name);
    return v != nullptr ? std::string(v) : std::string();
  };
  env.store_bind_addr = text("MESHWORK_RENDEZVOUS_BIND_ADDR");
  if (env.store_bind_addr.empty()) env.store_bind_addr = text("POD_IP");
  env.rendezvous_token = text("MESHWORK_RENDEZVOUS_TOKEN");

  if (env.rank >= env.world_size) {
    return InvalidConfig(Describe(rank, "rank", env.rank) + " must be less than " +
                         Describe(world, "world size", env.world_size));
  }
  if (env.local_rank >= env.local_world_size) {
    return InvalidConfig(Describe(local_rank, "local rank", env.local_rank) +
                         " must be less than " +
                         Describe(local_world, "local world size", env.local_world_size));
  }
  if (env.local_world_size > env.world_size) {
    return InvalidConfig(Describe(local_world, "local world size", env.local_world_size) +
                         " must not exceed " + Describe(world, "world size", env.world_size));
  }
  return env;
}

}  // namespace meshwork::dist
