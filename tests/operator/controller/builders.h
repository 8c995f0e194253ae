// Builders for the controller's tests, on plain JSON: a TrainingJob "tiny" in namespace "ml" (2
// replicas, inline config), its Pods, and the JobState the policies decide from.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/controller/decide.h"
#include "operator/controller/policy/policy.h"
#include "operator/controller/spec.h"

namespace meshwork::op::testing {

using nlohmann::json;

inline const SystemTime kT0 = std::chrono::system_clock::from_time_t(1800000000);

// The job, with `spec` merged into the defaults (RFC 7386; `{}` and null merge nothing) and
// `status` when not null.
inline json Job(const json& spec = json::object(), const json& status = json()) {
  json base = {{"image", "meshwork/trainer:test"},
               {"replicas", 2},
               {"device", "cpu"},
               {"config", {{"inline", "model:\n  preset: tiny\n"}}}};
  if (!spec.is_null()) base.merge_patch(spec);
  json job = {{"apiVersion", kApiVersion},
              {"kind", kKind},
              {"metadata",
               {{"name", "tiny"}, {"namespace", "ml"}, {"uid", "uid-1"}, {"generation", 1}, {"resourceVersion", "7"}}},
              {"spec", base}};
  if (!status.is_null()) job["status"] = status;
  return job;
}

// Replica `index` of gang `gen`, owned by the job, started with world size 2.
inline json Pod(int index, int64_t gen, const std::string& phase, std::optional<int> exit_code = std::nullopt) {
  json pod = {{"metadata",
               {{"name", "tiny-" + std::to_string(index)},
                {"namespace", "ml"},
                {"uid", "pod-uid-" + std::to_string(index) + "-" + std::to_string(gen)},
                {"labels",
                 {{kJobLabel, "tiny"},
                  {kIndexLabel, std::to_string(index)},
                  {kGenerationLabel, std::to_string(gen)},
                  {kWorldSizeLabel, "2"}}},
                {"ownerReferences", json::array({{{"uid", "uid-1"}, {"kind", kKind}, {"name", "tiny"}}})}}},
              {"status", {{"phase", phase}}}};
  if (phase == "Running") pod["status"]["conditions"] = json::array({{{"type", "Ready"}, {"status", "True"}}});
  if (exit_code) {
    pod["status"]["containerStatuses"] = json::array(
        {{{"name", "trainer"}, {"state", {{"terminated", {{"exitCode", *exit_code}, {"reason", "Error"}}}}}}});
  }
  return pod;
}

inline json Terminating(json pod) {
  pod["metadata"]["deletionTimestamp"] = FormatTime(kT0);
  return pod;
}

// A condition as SetCondition writes it.
inline json Condition(const std::string& type, const std::string& value, const std::string& reason = "Test") {
  return {{"type", type}, {"status", value}, {"reason", reason}, {"message", ""}, {"lastTransitionTime", FormatTime(kT0)}};
}

inline std::vector<std::string> Names(const std::vector<PodView>& pods) {
  std::vector<std::string> out;
  for (const auto& p : pods) out.push_back(p.name);
  return out;
}

inline std::vector<std::string> Reasons(const std::vector<EventToRecord>& events) {
  std::vector<std::string> out;
  for (const auto& e : events) out.push_back(e.reason);
  return out;
}

// The reason of condition `type` in a decision ("" when it does not set it).
inline std::string ReasonOf(const policy::Decision& d, const std::string& type) {
  for (const auto& c : d.conditions) {
    if (c.type == type) return c.reason;
  }
  return "";
}

// What a policy decides from, owning what its JobState refers to.
class State {
 public:
  State(const json& job, std::vector<json> pods = {}, SystemTime now = kT0) {
    in_.job = job;
    in_.pods = std::move(pods);
    in_.service_exists = true;
    in_.now = now;
    auto spec = ParseSpec(job);
    EXPECT_TRUE(spec.ok()) << spec.status().message();
    if (spec.ok()) spec_ = *spec;
    status_ = job.value("status", json::object());
  }
  Observed& in() { return in_; }
  json& status() { return status_; }
  policy::JobState Get() const {
    std::vector<PodView> views;
    for (const auto& pod : in_.pods) views.push_back(ViewPod(pod));
    return policy::JobState{in_, spec_, status_, views};
  }

 private:
  Observed in_;
  JobSpec spec_;
  json status_;
};

}  // namespace meshwork::op::testing
