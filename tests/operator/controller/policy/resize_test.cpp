// A gang started with another shape than the spec's (resize.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/operator/controller/builders.h"

namespace meshwork::op::policy {
namespace {

using namespace meshwork::op::testing;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

json WithMesh(json pod, const std::string& mesh) {
  pod["metadata"]["labels"][kMeshLabel] = mesh;
  return pod;
}

TEST(ResizeTest, NoOpinionWhileTheGangHasTheSpecsShape) {
  struct Case {
    std::string name;
    json spec;
    std::vector<json> pods;
  };
  json no_label = Pod(0, 0, "Running");
  no_label["metadata"]["labels"].erase(kWorldSizeLabel);
  const std::vector<Case> cases = {
      {"same world size, no mesh label", json::object(), {Pod(0, 0, "Running"), Pod(1, 0, "Running")}},
      {"same mesh label", json::object(), {WithMesh(Pod(0, 0, "Running"), "1x2x1")}},
      {"an older gang's shape", {{"replicas", 1}}, {Pod(0, 7, "Running")}},
      {"no world-size label", {{"replicas", 1}}, {no_label}},
  };
  for (const auto& c : cases) {
    State s(Job(c.spec), c.pods);
    EXPECT_FALSE(Resize(s.Get()).has_value()) << c.name;
    EXPECT_FALSE(ResizeWithCheckpoints(s.Get()).has_value()) << c.name;
  }
}

TEST(ResizeTest, ANewShapeStartsANewGangThatIsNoFailure) {
  for (const auto& [spec, pod] : std::vector<std::pair<json, json>>{
           {{{"replicas", 1}}, Pod(0, 0, "Running")},
           {{{"mesh", {{"dpReplicate", 2}, {"dpShard", 1}}}}, WithMesh(Pod(0, 0, "Running"), "1x2x1")},
           // The same 2 ranks, now one tensor parallel group.
           {{{"replicas", 1}, {"processesPerReplica", 2}, {"mesh", {{"dpShard", 1}, {"tp", 2}}}},
            WithMesh(Pod(0, 0, "Running"), "1x2x1")},
           // The same 2 ranks as 2 pipeline stages, and back.
           {{{"mesh", {{"dpShard", 1}, {"pp", 2}}}}, WithMesh(Pod(0, 0, "Running"), "1x2x1")},
           {{{"mesh", {{"dpShard", 2}}}}, WithMesh(Pod(0, 0, "Running"), "pp2x1x1x1")}}) {
    State s(Job(spec, {{"restartGeneration", 0}, {"restarts", 0}}), {pod});
    EXPECT_FALSE(ResizeWithCheckpoints(s.Get()).has_value());
    const auto d = Resize(s.Get());
    ASSERT_TRUE(d.has_value()) << spec;
    EXPECT_EQ(d->phase, "");  // the old gang is stale now: the stale-gang policy removes it
    EXPECT_EQ(d->status, json({{"restartGeneration", 1}}));
    EXPECT_EQ(ReasonOf(*d, "Restarting"), "Resized");
    EXPECT_EQ(ReasonOf(*d, "Running"), "Resized");
    EXPECT_THAT(d->events.at(0).message, HasSubstr("starting a new gang (generation 1)"));
    EXPECT_TRUE(d->status_first);
  }
}

TEST(ResizeTest, TheMessageNamesBothShapes) {
  State s(Job({{"replicas", 1}}), {WithMesh(Pod(0, 0, "Running"), "1x2x1")});
  EXPECT_THAT(Resize(s.Get())->events.at(0).message,
              HasSubstr("the gang changed from 2 ranks, mesh 1x2x1 to 1 ranks, mesh 1x1x1"));
}

TEST(ResizeWithCheckpointsTest, FailsTheJobInsteadOfCrashLooping) {
  State s(Job({{"replicas", 1}, {"checkpoint", {{"path", "/ckpt"}}}}),
          {Pod(0, 0, "Running"), Pod(1, 0, "Running"), Pod(2, 0, "Succeeded", 0)});
  EXPECT_FALSE(Resize(s.Get()).has_value());
  const auto d = ResizeWithCheckpoints(s.Get());
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->phase, "Failed");
  EXPECT_EQ(ReasonOf(*d, "Failed"), "InvalidSpec");
  EXPECT_THAT(d->events.at(0).message,
              HasSubstr("spec.replicas/spec.mesh: the gang changed from 2 ranks, mesh ? to 1 ranks, mesh 1x1x1 "
                        "while checkpoints are on, and without spec.elasticPolicy the global batch would change"));
  EXPECT_THAT(Names(d->remove), UnorderedElementsAre("tiny-0", "tiny-1"));  // running ones
}

// An elastic job with checkpoints resizes: a new gang, which resumes from the checkpoint, and
// status.elastic records the sizes and the gang the resize started.
TEST(ResizeTest, AnElasticJobWithCheckpointsStartsANewGangAndRecordsTheResize) {
  const json spec = {{"replicas", 1},
                     {"checkpoint", {{"path", "/ckpt"}}},
                     {"elasticPolicy", {{"minReplicas", 1}, {"maxReplicas", 4}}}};
  json status = {{"restartGeneration", 2}, {"restarts", 0}, {"elastic", {{"resizes", 1}, {"globalBatchSize", 16}}}};
  State s(Job(spec, status), {Pod(0, 2, "Running"), Pod(1, 2, "Running")});
  EXPECT_FALSE(ResizeWithCheckpoints(s.Get()).has_value());
  const auto d = Resize(s.Get());
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->status["restartGeneration"], 3);
  const json& elastic = d->status["elastic"];
  EXPECT_EQ(elastic["resizes"], 2);
  EXPECT_EQ(elastic["globalBatchSize"], 16);  // kept
  EXPECT_EQ(elastic["lastResize"]["fromReplicas"], 2);
  EXPECT_EQ(elastic["lastResize"]["toReplicas"], 1);
  EXPECT_EQ(elastic["lastResize"]["generation"], 3);
  EXPECT_FALSE(elastic["lastResize"].contains("resumedFromStep"));  // the new gang reports it
  EXPECT_THAT(d->events.at(0).message,
              HasSubstr("to 1 ranks, mesh 1x1x1; starting a new gang (generation 3), which resumes from the latest "
                        "checkpoint, resharded"));
}

TEST(RecordElasticTest, ShowsTheRangeAndSizeAndGoesWithThePolicy) {
  auto spec = ParseSpec(Job({{"replicas", 2}, {"elasticPolicy", {{"maxReplicas", 3}}}}));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  json status = {{"elastic", {{"resizes", 4}}}};
  RecordElastic(*spec, std::nullopt, status);
  EXPECT_EQ(status["elastic"], json({{"minReplicas", 1}, {"maxReplicas", 3}, {"replicas", 2}, {"resizes", 4}}));
  RecordElastic(*spec, 1, status);
  EXPECT_EQ(status["elastic"]["admittedReplicas"], 1);
  spec->elastic.reset();
  RecordElastic(*spec, std::nullopt, status);
  EXPECT_FALSE(status.contains("elastic"));
}

}  // namespace
}  // namespace meshwork::op::policy
