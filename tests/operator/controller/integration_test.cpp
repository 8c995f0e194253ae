// The integrations (operator/controller/integration.h) as a table: every gang backend's name is
// the spec's value, its marks on a Pod and its PodGroup; and every RBAC rule an integration
// declares is one the Helm chart grants, in the right scope.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "operator/controller/integration.h"
#include "operator/controller/integrations/backends.h"
#include "tests/operator/controller/builders.h"

namespace meshwork::op {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;
using testing::Job;

struct BackendCase {
  const char* spec_value;  // spec.runPolicy.schedulingPolicy.gangAdmission
  GangAdmission admission;
  const char* mark;        // what MarkPod sets, as it appears in the Pod's JSON
  const char* pod_group;   // the PodGroup's apiVersion and size, or "" for none
};

const BackendCase kBackends[] = {
    {"Operator", GangAdmission::kOperator, R"("schedulingGates":[{"name":"meshwork.dev/gang"}])", ""},
    {"PodGroup", GangAdmission::kPodGroup, R"("schedulingGroup":{"podGroupName":"tiny"})",
     R"("apiVersion":"scheduling.k8s.io/v1beta1")"},
    {"Volcano", GangAdmission::kVolcano, R"("scheduling.k8s.io/group-name":"tiny")",
     R"("apiVersion":"scheduling.volcano.sh/v1beta1")"},
    {"Coscheduling", GangAdmission::kCoscheduling, R"("scheduling.x-k8s.io/pod-group":"tiny")",
     R"("apiVersion":"scheduling.x-k8s.io/v1alpha1")"},
    {"None", GangAdmission::kNone, "", ""},
};

TEST(Integrations, EachGangBackendIsTheSpecsValueAndMarksItsPods) {
  for (const BackendCase& c : kBackends) {
    SCOPED_TRACE(c.spec_value);
    const json job = Job({{"replicas", 3}, {"runPolicy", {{"schedulingPolicy", {{"gangAdmission", c.spec_value}}}}}});
    auto spec = ParseSpec(job);
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    ASSERT_EQ(spec->gang_admission, c.admission);
    const GangBackend& backend = GangBackendFor(c.admission);
    EXPECT_EQ(backend.Name(), c.spec_value);
    json pod = {{"metadata", {{"name", "tiny-0"}}}, {"spec", json::object()}};
    backend.MarkPod(*spec, "tiny", &pod);
    if (*c.mark) {
      EXPECT_THAT(pod.dump(), HasSubstr(c.mark));
    } else {
      EXPECT_EQ(pod, json({{"metadata", {{"name", "tiny-0"}}}, {"spec", json::object()}}));
    }
    const auto* groups = dynamic_cast<const PodGroupBackend*>(&backend);
    EXPECT_EQ(groups != nullptr, *c.pod_group != '\0');
    if (groups == nullptr) continue;
    const json want = groups->Want(job, *spec);
    EXPECT_THAT(want.dump(), HasSubstr(c.pod_group));
    EXPECT_EQ(want["metadata"]["name"], "tiny");
    EXPECT_EQ(want["metadata"]["ownerReferences"][0]["uid"], "uid-1");
    // The gang's size, whichever field the API keeps it in.
    EXPECT_THAT(want["spec"].dump(), ::testing::AnyOf(HasSubstr(R"("minCount":3)"), HasSubstr(R"("minMember":3)")));
    EXPECT_EQ(groups->Api().ApiVersion() + "", want["apiVersion"].get<std::string>());
    EXPECT_THAT(groups->ApiMissing(), HasSubstr(c.spec_value));
  }
}

TEST(Integrations, AJobUsesKueueWhenQueuedAndItsGangBackendWhenItsSpecParses) {
  json job = Job({{"runPolicy", {{"schedulingPolicy", {{"gangAdmission", "Volcano"}}}}}});
  auto names = [](const std::vector<const Integration*>& is) {
    std::vector<std::string> out;
    for (const Integration* i : is) out.push_back(i->Name());
    return out;
  };
  EXPECT_THAT(names(IntegrationsOf(job, ParseSpec(job))), ::testing::ElementsAre("Volcano"));
  job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "team";
  EXPECT_THAT(names(IntegrationsOf(job, ParseSpec(job))), ::testing::ElementsAre("Volcano", "Kueue"));
  // A spec that does not parse has no backend; Kueue still marks its Workload Finished.
  job["spec"]["replicas"] = -1;
  EXPECT_THAT(names(IntegrationsOf(job, ParseSpec(job))), ::testing::ElementsAre("Kueue"));
}

// A rule of the chart's: (api group, resource) -> verbs, from one `define` of _helpers.tpl.
std::map<std::pair<std::string, std::string>, std::set<std::string>> ChartRules(const std::string& tpl,
                                                                                 const std::string& define) {
  std::map<std::pair<std::string, std::string>, std::set<std::string>> rules;
  const size_t start = tpl.find("{{- define \"" + define + "\" -}}");
  EXPECT_NE(start, std::string::npos) << define;
  const std::string block = tpl.substr(start, tpl.find("{{- end }}", start) - start);
  auto list = [](const std::string& text) {
    std::vector<std::string> items;
    std::stringstream in(text);
    for (std::string item; std::getline(in, item, ',');) {
      item.erase(0, item.find_first_not_of(" \""));
      item.erase(item.find_last_not_of(" \"") + 1);
      items.push_back(item);
    }
    return items;
  };
  const std::regex rule(R"(- apiGroups: \[([^\]]*)\]\s*\n\s*resources: \[([^\]]*)\]\s*\n\s*verbs: \[([^\]]*)\])");
  for (std::sregex_iterator it(block.begin(), block.end(), rule), end; it != end; ++it) {
    for (const std::string& group : list((*it)[1])) {
      for (const std::string& resource : list((*it)[2])) {
        for (const std::string& verb : list((*it)[3])) rules[{group, resource}].insert(verb);
      }
    }
  }
  return rules;
}

TEST(Integrations, TheChartGrantsEveryRuleAnIntegrationDeclares) {
  std::ifstream in(std::string(MESHWORK_SOURCE_DIR) + "/charts/meshwork-operator/templates/_helpers.tpl");
  ASSERT_TRUE(in) << "charts/meshwork-operator/templates/_helpers.tpl";
  const std::string tpl((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto namespaced = ChartRules(tpl, "meshwork-operator.rules");
  const auto cluster = ChartRules(tpl, "meshwork-operator.clusterScopedRules");
  ASSERT_FALSE(namespaced.empty());
  ASSERT_FALSE(cluster.empty());
  int checked = 0;
  for (const Integration* integration : AllIntegrations()) {
    for (const RbacRule& r : integration->Rbac()) {
      const std::string group = r.api_group.empty() ? "" : r.api_group;
      // A namespaced resource's rule is the Role's (with operator.watchNamespace) or the
      // ClusterRole's; a cluster-scoped one only the ClusterRole's.
      for (const std::string& verb : r.verbs) {
        bool granted = false;
        for (const auto* rules : {&cluster, r.cluster_scoped ? nullptr : &namespaced}) {
          if (rules == nullptr) continue;
          auto it = rules->find({group, r.resource});
          granted = granted || (it != rules->end() && it->second.count(verb));
        }
        EXPECT_TRUE(granted) << integration->Name() << " needs " << verb << " on " << r.resource << " ("
                             << (group.empty() ? "core" : group) << (r.cluster_scoped ? ", cluster-wide" : "")
                             << "), which the chart's rules do not grant";
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 10);
}

}  // namespace
}  // namespace meshwork::op
