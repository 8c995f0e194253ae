// What a registry exports and what docs/metrics.md says, for the tests that keep the two equal.
#pragma once

#include <prometheus/registry.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace meshwork::testing {

// Family names as the registry exposes them: histogram families carry no _bucket/_sum/_count.
inline std::set<std::string> ExposedNames(const prometheus::Registry& registry) {
  std::set<std::string> names;
  for (const auto& family : registry.Collect()) names.insert(family.name);
  return names;
}

inline std::string ReadMetricsDocs() {
  std::ifstream in(std::string(MESHWORK_SOURCE_DIR) + "/docs/metrics.md");
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace meshwork::testing
