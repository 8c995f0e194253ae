// The node agent's kubelet API (the part the API server calls): GET /containerLogs/{namespace}/
// {pod}/{container} with previous, follow and tailLines, which `kubectl logs` reaches through the
// API server, and GET /healthz. Served over TLS by meshwork-node-agent (controlplane/net/tls_front.h).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "controlplane/agent/node_agent.h"
#include "controlplane/net/http_server.h"

namespace meshwork::controlplane::agent {

// The Pod named `name` in `ns` as the agent knows it, if any.
using PodLookup = std::function<std::optional<nlohmann::json>(const std::string& ns, const std::string& name)>;

// The handler; `runtime` must outlive it, and `stopping` is polled by follow streams so that they
// end when the agent stops.
HttpHandler KubeletApiHandler(PodRuntime* runtime, PodLookup lookup, const std::atomic<bool>* stopping);

// The last `lines` lines of `text` (all of it when lines < 0), as `kubectl logs --tail` prints.
std::string TailLines(const std::string& text, int64_t lines);

}  // namespace meshwork::controlplane::agent
