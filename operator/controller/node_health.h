// The nodes a job's ranks are on, judged from the Node informer's cache (policy/node_loss.cpp
// decides on them).
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/controller/decide.h"
#include "operator/k8s/informer.h"

namespace meshwork::op {

// The nodes of `pods`, and `lost_nodes` (an elastic job's status.elastic.lostNodes), that are not
// Ready or no longer exist in `nodes` (empty where `nodes` is null). A lost node counts as back
// once Ready for `back_after`, schedulable and untainted; until then its entry says why not.
std::map<std::string, NodeHealth> UnhealthyNodes(const k8s::Store* nodes, const std::vector<nlohmann::json>& pods,
                                                 const nlohmann::json& lost_nodes, std::chrono::seconds back_after);

}  // namespace meshwork::op
