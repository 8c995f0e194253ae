// Node loss (node_loss.cpp, and failure.cpp's disruption): a rank on a node NotReady past
// runPolicy.nodeLossGraceSeconds, or on a deleted node, restarts the gang without counting, and
// its Pod is deleted at once; within the grace the job waits and looks again when it ends.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/operator/controller/builders.h"

namespace meshwork::op::policy {
namespace {

using namespace meshwork::op::testing;
using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

json OnNode(json pod, const std::string& node) {
  pod["spec"]["nodeName"] = node;
  return pod;
}

// Gang 0 of a job with `run_policy`, launched, its two ranks on node-a and node-b.
Observed Gang(const json& run_policy, std::vector<json> pods, SystemTime now = kT0) {
  Observed in;
  in.job = Job({{"runPolicy", run_policy}},
               {{"restartGeneration", 0}, {"launchedGeneration", 0}, {"phase", "Running"}, {"startTime", FormatTime(kT0)}});
  in.pods = std::move(pods);
  in.service_exists = true;
  in.now = now;
  return in;
}

std::vector<json> Running() { return {OnNode(Pod(0, 0, "Running"), "node-a"), OnNode(Pod(1, 0, "Running"), "node-b")}; }

NodeHealth NotReadySince(SystemTime since, const std::string& ready = "Unknown") {
  NodeHealth h;
  h.ready = ready;
  h.since = since;
  h.reason = "NodeStatusUnknown";
  return h;
}

// The message of the plan's Event `reason` ("" when there is none).
std::string EventMessage(const Plan& p, const std::string& reason) {
  for (const auto& e : p.events) {
    if (e.reason == reason) return e.message;
  }
  return "";
}

const PodView* Find(const std::vector<PodView>& pods, const std::string& name) {
  for (const auto& p : pods) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

TEST(NodeLossTest, ARankOnADeletedNodeRestartsTheGangAsADisruptionAndItsPodGoesAtOnce) {
  // backoffLimit 0 and restartPolicy Never: neither applies to a disruption.
  for (const json& policy : {json{{"backoffLimit", 0}}, json{{"restartPolicy", "Never"}}}) {
    Observed in = Gang(policy, Running());
    in.unhealthy_nodes["node-a"].deleted = true;
    const Plan p = Decide(in);
    EXPECT_EQ(p.phase, "Restarting") << policy;
    EXPECT_EQ(p.status.value("disruptionRestarts", 0), 1);
    EXPECT_EQ(p.status.value("restarts", 0), 0) << "not counted";
    EXPECT_EQ(p.status["restartGeneration"], 1);
    EXPECT_TRUE(p.status_first);
    EXPECT_THAT(EventMessage(p, "GangRestartAfterDisruption"),
                HasSubstr("pod tiny-0 is lost with its node (node node-a was deleted)"));
    EXPECT_THAT(Names(p.remove), UnorderedElementsAre("tiny-0", "tiny-1"));
    ASSERT_NE(Find(p.remove, "tiny-0"), nullptr);
    EXPECT_TRUE(Find(p.remove, "tiny-0")->node_lost) << "deleted with grace 0";
    EXPECT_FALSE(Find(p.remove, "tiny-1")->node_lost) << "a graceful delete on a live node";
    bool restarting = false;
    for (const auto& c : p.status["conditions"]) {
      if (c["type"] == "Restarting") restarting = c["status"] == "True" && c["reason"] == "NodeLost";
    }
    EXPECT_TRUE(restarting) << p.status.dump();
  }
}

// A Node missing from the cache may be one too new for it: a rank bound to it within the grace
// waits for the rest of the grace; one bound longer ago is lost at once.
TEST(NodeLossTest, AMissingNodeLosesOnlyRanksBoundLongerAgoThanTheGrace) {
  const SystemTime bound = kT0 + 100s;
  Observed in = Gang({}, Running(), bound + 2s);
  in.report_interval = 60s;
  in.unhealthy_nodes["node-a"] = NodeHealth{true, "", bound, ""};
  Plan p = Decide(in);
  EXPECT_EQ(p.phase, "Running");
  ASSERT_TRUE(p.requeue_after.has_value());
  EXPECT_EQ(*p.requeue_after, 28s);
  in.now = bound + 3600s;  // deleted an hour after the binding
  p = Decide(in);
  EXPECT_EQ(p.phase, "Restarting");
  EXPECT_THAT(EventMessage(p, "GangRestartAfterDisruption"),
              HasSubstr("(node node-a was deleted (the Pod was bound to it at " + FormatTime(bound) + "))"));
}

TEST(NodeLossTest, ANotReadyNodeLosesItsRanksOnlyOnceTheGraceHasPassed) {
  const SystemTime since = kT0 + 100s;
  // 10 s into the default 30 s grace: nothing changes, the job looks again in 20 s.
  Observed in = Gang({}, Running(), since + 10s);
  in.report_interval = 60s;  // else a running job looks again every 10 s anyway
  in.unhealthy_nodes["node-b"] = NotReadySince(since);
  Plan p = Decide(in);
  EXPECT_EQ(p.phase, "Running");
  EXPECT_TRUE(p.remove.empty());
  ASSERT_TRUE(p.requeue_after.has_value());
  EXPECT_EQ(*p.requeue_after, 20s);
  // At the grace: lost.
  in.now = since + 30s;
  p = Decide(in);
  EXPECT_EQ(p.phase, "Restarting");
  EXPECT_THAT(EventMessage(p, "GangRestartAfterDisruption"),
              HasSubstr("node node-b is NotReady (Ready Unknown, NodeStatusUnknown) since " + FormatTime(since) +
                        ", 30 s, past runPolicy.nodeLossGraceSeconds 30"));
  // A grace of its own; Ready False counts as Unknown does.
  in = Gang({{"nodeLossGraceSeconds", 5}}, Running(), since + 5s);
  in.unhealthy_nodes["node-a"] = NotReadySince(since, "False");
  EXPECT_EQ(Decide(in).phase, "Restarting");
  // A node without a readable transition time is not judged (and no look again is asked for).
  in = Gang({}, Running(), since + 1000s);
  in.unhealthy_nodes["node-a"] = NodeHealth{false, "Unknown", std::nullopt, ""};
  p = Decide(in);
  EXPECT_EQ(p.phase, "Running");
  EXPECT_TRUE(p.remove.empty());
}

TEST(NodeLossTest, ARankThatEndedBeforeItsNodeWasLostIsJudgedByHowItEnded) {
  // Rank 1 finished (exit 0) and its node went: nothing is lost, rank 0 still runs.
  Observed in = Gang({}, {OnNode(Pod(0, 0, "Running"), "node-a"), OnNode(Pod(1, 0, "Succeeded", 0), "node-b")});
  in.unhealthy_nodes["node-b"].deleted = true;
  EXPECT_EQ(Decide(in).phase, "Running");
  // Rank 1 failed by itself (exit 1) there: a counted restart, as anywhere.
  in = Gang({}, {OnNode(Pod(0, 0, "Running"), "node-a"), OnNode(Pod(1, 0, "Failed", 1), "node-b")});
  in.unhealthy_nodes["node-b"].deleted = true;
  const Plan p = Decide(in);
  EXPECT_EQ(p.phase, "Restarting");
  EXPECT_EQ(p.status.value("restarts", 0), 1);
  EXPECT_EQ(p.status.value("disruptionRestarts", 0), 0);
}

TEST(NodeLossTest, PodsBeingDeletedOnALostNodeAreDeletedAgainAtOnce) {
  // The taint manager evicted rank 0 (NoExecute on the unreachable node): its Pod is Terminating
  // for good, since no kubelet confirms it, and its name stays taken.
  json evicted = Terminating(OnNode(Pod(0, 0, "Running"), "node-a"));
  Observed in = Gang({}, {evicted, OnNode(Pod(1, 0, "Running"), "node-b")}, kT0 + 400s);
  in.unhealthy_nodes["node-a"] = NotReadySince(kT0);
  Plan p = Decide(in);
  EXPECT_EQ(p.phase, "Restarting");
  EXPECT_THAT(Names(p.remove), UnorderedElementsAre("tiny-0", "tiny-1"));
  // A rank of an older gang stuck there goes too, before the next gang starts.
  in = Gang({}, {Terminating(OnNode(Pod(0, 0, "Running"), "node-a"))});
  in.job["status"]["restartGeneration"] = 1;
  in.unhealthy_nodes["node-a"].deleted = true;
  p = Decide(in);
  ASSERT_EQ(p.remove.size(), 1u);
  EXPECT_TRUE(p.remove[0].node_lost);
  EXPECT_TRUE(p.create.empty()) << "the next gang waits for the name";
  // Terminating on a live node: left to its kubelet, as before.
  in = Gang({}, {Terminating(OnNode(Pod(0, 0, "Running"), "node-a"))});
  in.job["status"]["restartGeneration"] = 1;
  EXPECT_TRUE(Decide(in).remove.empty());
}

}  // namespace
}  // namespace meshwork::op::policy
