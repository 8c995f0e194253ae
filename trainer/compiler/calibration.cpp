#include "trainer/compiler/calibration.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <vector>

namespace meshwork::compiler {
namespace {

constexpr const char* kHeader = "meshwork-calibration 1";

std::string Num(double v) { return ShortestText(v); }

bool ParseNumber(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  return *end == '\0' && std::isfinite(*out);
}

std::string Link(const LinkCost& l) { return Num(l.latency_seconds) + " " + Num(l.bus_bytes_per_second); }

}  // namespace

std::string PrintCalibration(const Calibration& c) {
  std::ostringstream out;
  out << kHeader << "\n";
  out << "mesh " << c.cost.dp_shard << " " << c.cost.dp_replicate << "\n";
  out << "shard_link " << Link(c.cost.shard_link) << "\n";
  if (c.cost.shard_reduce_scatter_link) out << "shard_reduce_scatter_link " << Link(*c.cost.shard_reduce_scatter_link) << "\n";
  out << "replicate_link " << Link(c.cost.replicate_link) << "\n";
  if (c.skeleton.CarriesTpExchanges()) out << "tp_link " << Link(c.cost.tp_link) << "\n";
  out << "shard_lanes_share " << Num(c.cost.shard_lanes_share) << "\n";
  out << "interference " << Num(c.cost.interference) << "\n";
  out << "comm_interference " << Num(c.cost.comm_interference) << "\n";
  out << "host_copy_bytes_per_second " << Num(c.cost.host_copy_bytes_per_second) << "\n";
  out << "step_overhead_seconds " << Num(c.cost.step_overhead_seconds) << "\n";
  out << "compute_scale " << Num(c.compute_scale) << "\n";
  out << "eager_step_seconds " << Num(c.eager_step_seconds) << "\n";
  Graph skeleton = c.skeleton;
  skeleton.ops.clear();
  out << "skeleton\n" << Print(skeleton);
  return out.str();
}

Result<Calibration> ParseCalibration(std::string_view text) {
  std::istringstream in{std::string(text)};
  std::string line;
  int number = 0;
  auto error = [&](const std::string& what) {
    return InvalidInput("calibration line " + std::to_string(number) + ": " + what + ": '" + line + "'");
  };
  if (!std::getline(in, line) || (++number, line != kHeader))
    return InvalidInput("not a calibration file: the first line is not '" + std::string(kHeader) + "'");
  Calibration c;
  std::map<std::string, bool> seen;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    std::istringstream words(line);
    std::string key;
    words >> key;
    if (key == "skeleton") {
      std::ostringstream rest;
      rest << in.rdbuf();
      MW_ASSIGN_OR_RETURN(c.skeleton, Parse(rest.str()));
      seen[key] = true;
      break;
    }
    std::vector<double> values;
    for (std::string w; words >> w;) {
      double v = 0;
      if (!ParseNumber(w, &v)) return error("'" + w + "' is not a number");
      values.push_back(v);
    }
    auto want = [&](size_t n) { return values.size() == n ? Status::Ok() : error("expected " + std::to_string(n) + " values"); };
    if (seen[key]) return error("'" + key + "' given twice");
    seen[key] = true;
    if (key == "mesh") {
      MW_RETURN_IF_ERROR(want(2));
      if (values[0] < 1 || values[1] < 1 || values[0] != std::floor(values[0]) || values[1] != std::floor(values[1]))
        return error("dp_shard and dp_replicate must be positive integers");
      c.cost.dp_shard = static_cast<int>(values[0]);
      c.cost.dp_replicate = static_cast<int>(values[1]);
    } else if (key == "shard_link" || key == "shard_reduce_scatter_link" || key == "replicate_link" ||
               key == "tp_link") {
      MW_RETURN_IF_ERROR(want(2));
      if (values[0] < 0 || values[1] <= 0) return error("a link is latency >= 0 and bandwidth > 0");
      const LinkCost link{values[0], values[1]};
      if (key == "shard_link") c.cost.shard_link = link;
      if (key == "shard_reduce_scatter_link") c.cost.shard_reduce_scatter_link = link;
      if (key == "replicate_link") c.cost.replicate_link = link;
      if (key == "tp_link") c.cost.tp_link = link;
    } else {
      MW_RETURN_IF_ERROR(want(1));
      const double v = values[0];
      if (key == "shard_lanes_share") c.cost.shard_lanes_share = v;
      else if (key == "interference") c.cost.interference = v;
      else if (key == "comm_interference") c.cost.comm_interference = v;
      else if (key == "host_copy_bytes_per_second") c.cost.host_copy_bytes_per_second = v;
      else if (key == "step_overhead_seconds") c.cost.step_overhead_seconds = v;
      else if (key == "compute_scale") c.compute_scale = v;
      else if (key == "eager_step_seconds") c.eager_step_seconds = v;
      else return error("unknown key '" + key + "'");
    }
  }
  for (const char* key : {"mesh", "shard_link", "replicate_link", "compute_scale", "skeleton"})
    if (!seen[key]) return InvalidInput(std::string("calibration file has no '") + key + "' line");
  if (c.compute_scale <= 0) return InvalidInput("calibration: compute_scale must be positive");
  if (c.skeleton.dp_shard != c.cost.dp_shard || c.skeleton.dp_replicate != c.cost.dp_replicate)
    return InvalidInput("calibration: the skeleton's mesh is not the mesh line's");
  // Tensor parallelism's exchanges are priced on the tp link: a skeleton whose modules carry
  // them (tp= on a module line) comes with one, and only such a skeleton.
  const bool exchanges = c.skeleton.CarriesTpExchanges();
  if (seen["tp_link"] != exchanges) {
    return InvalidInput(seen["tp_link"] ? "calibration: a 'tp_link' line, but no module of the skeleton exchanges over tp"
                                        : "calibration: the skeleton's modules exchange over tp, but there is no 'tp_link' line");
  }
  if (exchanges) c.cost.tp = c.skeleton.tp;
  return c;
}

CostModel ScaleLinks(CostModel cost, double factor) {
  cost.shard_link.bus_bytes_per_second *= factor;
  if (cost.shard_reduce_scatter_link) cost.shard_reduce_scatter_link->bus_bytes_per_second *= factor;
  cost.replicate_link.bus_bytes_per_second *= factor;
  cost.tp_link.bus_bytes_per_second *= factor;
  return cost;
}

}  // namespace meshwork::compiler
