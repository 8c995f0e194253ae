// Load on the local control plane through Meshwork's own client: `watches` watches on
// ConfigMaps stay open while `objects` ConfigMaps are created one after another. Prints create
// latency percentiles (request sent to answer parsed) and watch event delay (create answered to
// the ADDED event parsed by each watcher) as one JSON object. The server's memory is read by
// bench/controlplane_load.sh from /proc.
//
// usage: meshwork-controlplane-load --kubeconfig FILE [--objects N] [--watches N] [--namespace NS]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/k8s/client.h"
#include "operator/k8s/config.h"

namespace {

using Clock = std::chrono::steady_clock;
using meshwork::k8s::Client;

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  return v[i];
}

nlohmann::json Summary(const std::vector<double>& ms) {
  return {{"count", ms.size()},       {"p50_ms", Percentile(ms, 0.50)}, {"p90_ms", Percentile(ms, 0.90)},
          {"p99_ms", Percentile(ms, 0.99)}, {"max_ms", Percentile(ms, 1.0)}};
}

int Usage(const std::string& why) {
  std::cerr << "meshwork-controlplane-load: " << why
            << "\nusage: meshwork-controlplane-load --kubeconfig FILE [--objects N] [--watches N] [--namespace NS]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string kubeconfig, ns = "default";
  int objects = 1000, watches = 100;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return Usage("flag " + a + " needs a value");
    const std::string v = argv[++i];
    try {
      if (a == "--kubeconfig") kubeconfig = v;
      else if (a == "--namespace") ns = v;
      else if (a == "--objects") objects = std::stoi(v);
      else if (a == "--watches") watches = std::stoi(v);
      else return Usage("unknown flag " + a);
    } catch (const std::exception&) {
      return Usage("flag " + a + ": '" + v + "' is not a number");
    }
  }
  if (kubeconfig.empty()) return Usage("--kubeconfig is required");
  if (objects < 1 || watches < 0) return Usage("--objects must be >= 1 and --watches >= 0");

  auto config = meshwork::k8s::LoadKubeconfig(kubeconfig);
  if (!config.ok()) {
    std::cerr << "meshwork-controlplane-load: " << config.error().message() << "\n";
    return 2;
  }
  meshwork::k8s::ClientOptions options;
  options.max_retries = 0;  // a failed create is a failure of the run, not something to hide
  auto client = Client::FromConfig(*config, options);
  if (!client.ok()) {
    std::cerr << "meshwork-controlplane-load: " << client.error().message() << "\n";
    return 2;
  }
  const auto ref = meshwork::k8s::resources::ConfigMaps();
  auto start_list = (*client)->ListPage(ref, ns);
  if (!start_list.ok()) {
    std::cerr << "meshwork-controlplane-load: list: " << start_list.error().message() << "\n";
    return 5;
  }
  const std::string from = (*start_list)["metadata"].value("resourceVersion", "");
  const std::string prefix = "load-" + std::to_string(::getpid()) + "-";

  // Per watcher: when each object's ADDED event arrived.
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::map<std::string, Clock::time_point>> seen(watches);
  std::vector<meshwork::k8s::CancelToken> cancels(watches);
  std::vector<std::thread> threads;
  std::atomic<int> watch_errors{0};
  for (int w = 0; w < watches; ++w) {
    threads.emplace_back([&, w] {
      meshwork::k8s::WatchOptions wo;
      wo.allow_bookmarks = true;
      wo.timeout_seconds = 600;
      auto err = (*client)->Watch(ref, ns, from, wo, [&, w](const meshwork::k8s::WatchEvent& e) {
        if (e.type != meshwork::k8s::WatchEvent::Type::kAdded) return true;
        const std::string name = e.object["metadata"].value("name", "");
        if (name.rfind(prefix, 0) != 0) return true;
        std::lock_guard<std::mutex> lock(mu);
        seen[w].emplace(name, Clock::now());
        cv.notify_all();
        return true;
      }, cancels[w]);
      if (!err.ok() && !cancels[w].cancelled()) ++watch_errors;
    });
  }
  // Let the watches connect before the first create.
  std::this_thread::sleep_for(std::chrono::seconds(1));

  std::vector<double> create_ms;
  std::map<std::string, Clock::time_point> acked;
  int failures = 0;
  const auto t0 = Clock::now();
  for (int i = 0; i < objects; ++i) {
    const std::string name = prefix + std::to_string(i);
    const nlohmann::json cm = {{"apiVersion", "v1"},
                               {"kind", "ConfigMap"},
                               {"metadata", {{"name", name}, {"labels", {{"bench", "load"}}}}},
                               {"data", {{"index", std::to_string(i)}}}};
    const auto sent = Clock::now();
    auto r = (*client)->Create(ref, ns, cm);
    const auto done = Clock::now();
    if (!r.ok()) {
      if (++failures <= 3) std::cerr << "create " << name << ": " << r.error().message() << "\n";
      continue;
    }
    create_ms.push_back(std::chrono::duration<double, std::milli>(done - sent).count());
    std::lock_guard<std::mutex> lock(mu);
    acked[name] = done;
  }
  const double create_seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  // Every watcher must see every acknowledged create (bounded wait).
  bool complete = true;
  {
    std::unique_lock<std::mutex> lock(mu);
    complete = cv.wait_for(lock, std::chrono::seconds(60), [&] {
      for (const auto& s : seen)
        if (s.size() < acked.size()) return false;
      return true;
    });
  }
  for (auto& c : cancels) c.Cancel();
  for (auto& t : threads) t.join();

  std::vector<double> delay_ms;
  int missing = 0;
  for (const auto& s : seen) {
    for (const auto& [name, at] : acked) {
      auto it = s.find(name);
      if (it == s.end()) {
        ++missing;
        continue;
      }
      delay_ms.push_back(std::max(0.0, std::chrono::duration<double, std::milli>(it->second - at).count()));
    }
  }
  nlohmann::json out = {{"objects", objects},
                        {"watches", watches},
                        {"create_failures", failures},
                        {"creates_per_second", static_cast<double>(create_ms.size()) / create_seconds},
                        {"create_latency", Summary(create_ms)},
                        {"watch_event_delay", Summary(delay_ms)},
                        {"watch_events_missing", missing},
                        {"watch_errors", watch_errors.load()}};
  std::cout << out.dump() << "\n";
  return failures == 0 && complete && missing == 0 && watch_errors == 0 ? 0 : 1;
}
