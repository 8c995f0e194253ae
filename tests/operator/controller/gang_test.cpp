// FitGang, gang admission's decision: a gang fits only if all of its Pods fit at once, after
// what bound Pods and admitted-but-unbound Pods take; gated Pods and finished Pods take nothing;
// nodeSelector, unschedulable nodes and GPUs count; the reason names what is needed and free.
#include "operator/controller/gang.h"

#include <gtest/gtest.h>

#include <map>

namespace meshwork::op {
namespace {

using nlohmann::json;

json Node(const std::string& name, const std::string& cpu, int gpus = 0, json labels = json::object()) {
  json n = {{"metadata", {{"name", name}, {"labels", labels}}},
            {"status", {{"allocatable", {{"cpu", cpu}, {"memory", "16Gi"}}}}}};
  if (gpus > 0) n["status"]["allocatable"]["nvidia.com/gpu"] = std::to_string(gpus);
  return n;
}

json Pod(const std::string& name, const std::string& cpu, const std::string& node = "", bool gated = false,
         const std::string& phase = "", bool ours = true) {
  json p = {{"metadata", {{"name", name}, {"labels", json::object()}}},
            {"spec", {{"containers", {{{"name", "trainer"}, {"resources", {{"requests", {{"cpu", cpu}}}}}}}}}}};
  if (ours) p["metadata"]["labels"]["meshwork.dev/job"] = "j";
  if (!node.empty()) p["spec"]["nodeName"] = node;
  if (gated) p["spec"]["schedulingGates"] = json::array({{{"name", kGangGate}}});
  if (!phase.empty()) p["status"]["phase"] = phase;
  return p;
}

json List(std::vector<json> items) { return {{"items", items}}; }

TEST(FitGang, FitsOnlyWhenEveryPodFitsAtOnce) {
  const json nodes = List({Node("a", "2")});
  EXPECT_TRUE(FitGang(nodes, List({}), {Pod("x-0", "1", "", true), Pod("x-1", "1", "", true)}).fits);
  const GangFit three = FitGang(nodes, List({}), {Pod("x-0", "1"), Pod("x-1", "1"), Pod("x-2", "1")});
  EXPECT_FALSE(three.fits);
  EXPECT_NE(three.why.find("3 Pods need 3 cpu"), std::string::npos) << three.why;
  EXPECT_NE(three.why.find("free on 1 schedulable node(s): 0 cpu"), std::string::npos) << three.why;
}

TEST(FitGang, BoundAndReleasedPodsTakeRoomGatedAndFinishedOnesDoNot) {
  const json nodes = List({Node("a", "2")});
  const std::vector<json> gang = {Pod("y-0", "1", "", true), Pod("y-1", "1", "", true)};
  EXPECT_FALSE(FitGang(nodes, List({Pod("b-0", "1", "a")}), gang).fits) << "a bound Pod";
  EXPECT_FALSE(FitGang(nodes, List({Pod("r-0", "1")}), gang).fits) << "released, not bound yet";
  EXPECT_TRUE(FitGang(nodes, List({Pod("g-0", "1", "", true), Pod("g-1", "1", "", true)}), gang).fits) << "gated";
  EXPECT_TRUE(FitGang(nodes, List({Pod("d-0", "2", "a", false, "Succeeded")}), gang).fits) << "finished";
  // Released by the operator but still held by Kueue's topology gate: its room is promised.
  json held = Pod("k-0", "2");
  held["spec"]["schedulingGates"] = json::array({{{"name", "kueue.x-k8s.io/topology"}}});
  EXPECT_FALSE(FitGang(nodes, List({held}), gang).fits) << "released, another gate left";
  // Someone else's Pod waiting for the scheduler is not ours to count; bound, it is.
  EXPECT_TRUE(FitGang(nodes, List({Pod("o-0", "2", "", false, "", false)}), gang).fits);
  EXPECT_FALSE(FitGang(nodes, List({Pod("o-0", "1", "a", false, "Running", false)}), gang).fits);
}

TEST(FitGang, SpreadsOverNodesAndHonoursSelectorsGpusAndUnschedulable) {
  json cordoned = Node("c", "8");
  cordoned["spec"]["unschedulable"] = true;
  const json nodes = List({Node("a", "1"), Node("b", "1"), cordoned});
  EXPECT_TRUE(FitGang(nodes, List({}), {Pod("x-0", "1"), Pod("x-1", "1")}).fits);  // one per node
  EXPECT_FALSE(FitGang(nodes, List({}), {Pod("x-0", "1"), Pod("x-1", "1"), Pod("x-2", "1")}).fits);
  json picky = Pod("p-0", "1");
  picky["spec"]["nodeSelector"] = {{"pool", "gpu"}};
  EXPECT_FALSE(FitGang(nodes, List({}), {picky}).fits);
  const json gpu_nodes = List({Node("g", "8", 2, {{"pool", "gpu"}})});
  EXPECT_TRUE(FitGang(gpu_nodes, List({}), {picky}).fits);
  json gpu_pod = Pod("q-0", "1");
  gpu_pod["spec"]["containers"][0]["resources"]["limits"] = {{"nvidia.com/gpu", 3}};
  EXPECT_FALSE(FitGang(gpu_nodes, List({}), {gpu_pod}).fits);  // limits stand in for requests
}

// After a node loss the gang restarts on the nodes left: a node whose Ready is False or Unknown
// (its kubelet stopped reporting) has no room to offer.
TEST(FitGang, ANodeThatIsNotReadyOffersNoRoom) {
  const std::vector<json> gang = {Pod("z-0", "1", "", true), Pod("z-1", "1", "", true)};
  for (const char* ready : {"Unknown", "False"}) {
    json lost = Node("lost", "8");
    lost["status"]["conditions"] = json::array({{{"type", "Ready"}, {"status", ready}}});
    EXPECT_FALSE(FitGang(List({lost, Node("a", "1")}), List({}), gang).fits) << ready;
  }
  json healthy = Node("healthy", "8");
  healthy["status"]["conditions"] = json::array({{{"type", "Ready"}, {"status", "True"}}});
  EXPECT_TRUE(FitGang(List({healthy, Node("a", "1")}), List({}), gang).fits);
}

// The ledger, fed one Pod event at a time, answers as FitGang over the Pods it was fed (less the
// gang's own job's): over a long run of adds, binds, finishes and deletes, both agree on whether
// a gang fits and on what they say is free.
TEST(RoomLedger, AgreesWithFitGangOverThePodsItWasFed) {
  const json nodes = List({Node("a", "4"), Node("b", "2"), Node("g", "8", 1, {{"pool", "gpu"}})});
  const std::vector<json> gang = {Pod("gang-0", "2", "", true), Pod("gang-1", "2", "", true)};
  const std::string gang_owner = "job-uid-0";
  RoomLedger ledger;
  std::map<std::string, json> live;  // what an informer's store would hold
  uint64_t seed = 12345;
  auto next = [&seed](uint64_t n) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return (seed >> 33) % n;
  };
  int fits = 0;
  for (int event = 0; event < 600; ++event) {
    const std::string name = "p" + std::to_string(next(12));
    const std::string key = "ns/" + name;
    const uint64_t what = next(6);
    if (what == 0) {
      ledger.Remove(key);
      live.erase(key);
    } else {
      const char* node = what == 1 ? "" : (what == 2 ? "a" : (what == 3 ? "b" : "g"));
      const char* phase = next(5) == 0 ? "Succeeded" : "Running";
      json pod = Pod(name, std::to_string(1 + next(2)), node, next(3) == 0, phase, next(4) != 0);
      pod["metadata"]["ownerReferences"] = json::array({{{"uid", "job-uid-" + std::to_string(next(3))}}});
      pod["metadata"]["resourceVersion"] = std::to_string(event + 1);
      ledger.Set(key, pod);
      live[key] = pod;
      EXPECT_EQ(ledger.VersionOf(key), phase == std::string("Succeeded") ? "" : std::to_string(event + 1));
    }
    json others = {{"items", json::array()}};
    for (const auto& [k, pod] : live) {
      if (pod["metadata"]["ownerReferences"][0]["uid"] != gang_owner) others["items"].push_back(pod);
    }
    const GangFit listed = FitGang(nodes, others, gang);
    const GangFit kept = FitGang(nodes, ledger.Taken(gang_owner), gang);
    ASSERT_EQ(kept.fits, listed.fits) << "event " << event;
    ASSERT_EQ(kept.why, listed.why) << "event " << event;
    fits += listed.fits ? 1 : 0;
  }
  // Both answers occur, or the comparison proves little.
  EXPECT_GT(fits, 30);
  EXPECT_LT(fits, 570);
}

TEST(FitGang, GateIsRecognisedAmongOthers) {
  json p = Pod("x", "1");
  EXPECT_FALSE(HasGangGate(p));
  p["spec"]["schedulingGates"] = json::array({{{"name", "other"}}, {{"name", kGangGate}}});
  EXPECT_TRUE(HasGangGate(p));
}

}  // namespace
}  // namespace meshwork::op
