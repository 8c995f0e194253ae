#include "trainer/train/mesh_auto.h"

#include <chrono>
#include <iomanip>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "trainer/compiler/mesh_choice.h"
#include "trainer/config/hardware.h"

namespace meshwork::train {

namespace {

std::string Describe(const compiler::MeshChoice& choice, const compiler::HardwareProfile& profile, int world) {
  std::ostringstream out;
  out << std::fixed << "mesh: auto (" << world << " ranks, " << profile.gpus_per_node << " per node, profile '"
      << profile.name << "'; simulated, each mesh by its quick plan):\n";
  for (const auto& c : choice.candidates) {
    out << "  " << c.dp_replicate << " x " << c.dp_shard << ": ";
    if (!c.rejected.empty()) {
      out << "cannot be built: " << c.rejected << "\n";
      continue;
    }
    out << std::setprecision(4) << "compiled step " << c.compiled.step_seconds << " s, peak " << std::setprecision(2)
        << static_cast<double>(c.compiled.peak_bytes + c.compiled.static_bytes) / (1 << 30) << " GiB"
        << (c.fits ? "" : " (exceeds device memory)") << "\n";
  }
  out << "mesh: auto chose " << choice.reason << "\n";
  return out.str();
}

}  // namespace

Result<dist::MeshShape> AgreeOnAutoMesh(c10d::Store& store, const dist::DistEnv& env, const config::TrainConfig& cfg,
                                        bool cuda, std::ostream& log) {
  const std::string key = "mesh_auto/" + std::to_string(env.restart_generation);
  auto to_bytes = [](const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); };
  if (env.rank == 0) {
    // "ok R S" or "error <message>", so that every rank fails alike when rank 0 cannot choose.
    std::string published;
    Result<dist::MeshShape> shape = [&]() -> Result<dist::MeshShape> {
      MW_ASSIGN_OR_RETURN(const compiler::HardwareProfile profile, config::MeshProfile(cfg, cuda, env.local_world_size));
      compiler::LlamaShape llama = config::TrainingShape(cfg, cuda);
      llama.flops_per_second = profile.AchievedFlopsPerSecond();
      const compiler::PlanOptions options = config::PlanOptionsOf(cfg.fsdp);
      MW_ASSIGN_OR_RETURN(const compiler::MeshChoice choice,
                          compiler::ChooseMesh(profile, llama, env.world_size, options, /*plan_chosen=*/false));
      log << Describe(choice, profile, env.world_size);
      return dist::MeshShape{choice.dp_replicate, choice.dp_shard, 1};
    }();
    published = shape.ok() ? "ok " + std::to_string(shape->dp_replicate) + " " + std::to_string(shape->dp_shard)
                           : "error " + std::to_string(static_cast<int>(shape.status().code())) + " " +
                                 shape.status().message();
    try {
      store.set(key, to_bytes(published));
      // Rank 0 hosts the store: on an error it would exit and take the store with it before the
      // others read why. It waits (bounded) until every rank has read the answer.
      if (!shape.ok() && env.world_size > 1) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(cfg.dist.timeout_seconds);
        while (store.add(key + "/read", 0) < env.world_size - 1 && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      }
    } catch (const std::exception& e) {
      return Unavailable(std::string("dist.mesh: auto: publishing the mesh to the other ranks: ") + e.what());
    }
    return shape;
  }
  std::string text;
  try {
    store.wait({key}, std::chrono::seconds(cfg.dist.timeout_seconds));
    const std::vector<uint8_t> bytes = store.get(key);
    text.assign(bytes.begin(), bytes.end());
    store.add(key + "/read", 1);
  } catch (const std::exception& e) {
    return Unavailable("dist.mesh: auto: waiting " + std::to_string(cfg.dist.timeout_seconds) +
                       " s for rank 0's mesh: " + std::string(e.what()).substr(0, std::string(e.what()).find('\n')));
  }
  dist::MeshShape shape;
  std::istringstream in(text);
  std::string word;
  in >> word;
  if (word == "error") {
    // "error <code> <message>": the same error, so every rank exits with the same code.
    int code = static_cast<int>(StatusCode::kInvalidConfig);
    in >> code;
    std::string message;
    std::getline(in, message);
    if (!message.empty() && message[0] == ' ') message.erase(0, 1);
    return Status(static_cast<StatusCode>(code), "dist.mesh: auto: rank 0 could not choose a mesh: " + message);
  }
  if (word != "ok" || !(in >> shape.dp_replicate >> shape.dp_shard) ||
      shape.dp_replicate * shape.dp_shard != env.world_size) {
    return Internal("dist.mesh: auto: rank 0 published '" + text + "', not a mesh of " +
                    std::to_string(env.world_size) + " ranks");
  }
  return shape;
}

}  // namespace meshwork::train
