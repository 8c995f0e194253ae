// The kubelet API's log endpoint over PodRuntime's log files (see kubelet_server.h).
#include "controlplane/agent/kubelet_server.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>
#include <vector>

#include "controlplane/agent/internal.h"

namespace meshwork::controlplane::agent {
namespace {

using nlohmann::json;

HttpResponse Error(int code, const std::string& reason, const std::string& message) {
  HttpResponse r;
  r.status = code;
  r.headers.push_back({"Content-Type", "application/json"});
  r.body = StatusJson(code, reason, message);
  return r;
}

bool Truthy(const HttpRequest& req, const std::string& name) {
  const std::string v = req.Query(name);
  return req.HasQuery(name) && (v.empty() || v == "true" || v == "1");
}

std::vector<std::string> Split(const std::string& path) {
  std::vector<std::string> parts;
  std::stringstream in(path);
  std::string part;
  while (std::getline(in, part, '/')) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

// Whether the container's current run has ended (its state is terminated), or the pod is gone.
bool ContainerEnded(PodRuntime* runtime, const std::string& uid, const std::string& container) {
  const json status = runtime->StatusOf(uid);
  if (status.is_null()) return true;
  for (const json& cs : internal::ArrayAt(status, "containerStatuses")) {
    if (cs.value("name", "") != container) continue;
    return internal::ObjectAt(cs, "state").contains("terminated");
  }
  return false;
}

}  // namespace

std::string TailLines(const std::string& text, int64_t lines) {
  if (lines < 0) return text;
  if (lines == 0) return "";
  size_t pos = text.size();
  if (pos > 0 && text[pos - 1] == '\n') --pos;
  int64_t seen = 0;
  while (pos > 0) {
    if (text[pos - 1] == '\n' && ++seen == lines) break;
    --pos;
  }
  return text.substr(pos);
}

HttpHandler KubeletApiHandler(PodRuntime* runtime, PodLookup lookup, const std::atomic<bool>* stopping) {
  return [runtime, lookup = std::move(lookup), stopping](const HttpRequest& req) -> HttpResponse {
    const std::vector<std::string> parts = Split(req.path);
    if (req.method == "GET" && parts.size() == 1 && parts[0] == "healthz") {
      HttpResponse ok;
      ok.headers.push_back({"Content-Type", "text/plain"});
      ok.body = "ok";
      return ok;
    }
    if (req.method != "GET" || parts.size() != 4 || parts[0] != "containerLogs") {
      return Error(404, "NotFound", "the node agent serves GET /containerLogs/{namespace}/{pod}/{container} and "
                                    "/healthz, not " + req.method + " " + req.path);
    }
    const std::string &ns = parts[1], &name = parts[2], &container = parts[3];
    const std::optional<json> pod = lookup(ns, name);
    if (!pod) return Error(404, "NotFound", "pod \"" + name + "\" in namespace \"" + ns + "\" is not on this node");
    bool known = false;
    for (const json& c : internal::ArrayAt(internal::ObjectAt(*pod, "spec"), "containers")) {
      if (c.value("name", "") == container) known = true;
    }
    if (!known) return Error(400, "BadRequest", "container " + container + " is not valid for pod " + name);
    int64_t tail = -1;
    if (req.HasQuery("tailLines")) {
      const std::string t = req.Query("tailLines");
      char* end = nullptr;
      tail = std::strtoll(t.c_str(), &end, 10);
      if (t.empty() || *end != '\0' || tail < 0) {
        return Error(400, "BadRequest", "tailLines: Invalid value: \"" + t + "\": must be a non-negative integer");
      }
    }
    const bool previous = Truthy(req, "previous");
    const std::string uid = internal::StringAt(internal::ObjectAt(*pod, "metadata"), "uid");
    const std::string path = previous ? runtime->PreviousLogPath(uid, container) : runtime->LogPath(uid, container);
    if (path.empty()) {
      if (previous) {
        return Error(400, "BadRequest",
                     "previous terminated container \"" + container + "\" in pod \"" + name + "\" not found");
      }
      return Error(400, "BadRequest",
                   "container \"" + container + "\" in pod \"" + name + "\" is waiting to start: ContainerCreating");
    }
    std::ifstream in(path, std::ios::binary);
    const std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    HttpResponse resp;
    resp.headers.push_back({"Content-Type", "text/plain"});
    if (!Truthy(req, "follow") || previous) {
      resp.body = TailLines(content, tail);
      return resp;
    }
    resp.stream = [runtime, stopping, path, uid, container, first = TailLines(content, tail),
                   offset = content.size()](ResponseStream& out) {
      if (!first.empty() && !out.Write(first)) return;
      size_t pos = offset;
      int quiet_after_end = 0;
      while (!stopping->load() && out.Open()) {
        std::ifstream f(path, std::ios::binary);
        f.seekg(0, std::ios::end);
        const std::streamoff size = f.tellg();
        if (size > static_cast<std::streamoff>(pos)) {
          f.seekg(static_cast<std::streamoff>(pos));
          std::string chunk(static_cast<size_t>(size) - pos, '\0');
          f.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
          chunk.resize(static_cast<size_t>(f.gcount()));
          pos += chunk.size();
          if (!out.Write(chunk)) return;
          continue;
        }
        // Ends once the container's run has ended and its file stopped growing.
        if (ContainerEnded(runtime, uid, container) && ++quiet_after_end >= 3) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    };
    return resp;
  };
}

}  // namespace meshwork::controlplane::agent
