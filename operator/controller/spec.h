// A TrainingJob's spec, read from its JSON and checked for what the CRD schema cannot say
// (docs/trainingjob.md). The schema (and its CEL rules, where the API server evaluates them)
// refuses most bad input at apply time; ParseSpec repeats the cross-field rules, because not
// every cluster evaluates CEL, and adds what only the operator knows: the trainer config must
// load with the settings the operator will add to it, and names must make valid Pod hostnames.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace meshwork::config {
struct TrainConfig;
}  // namespace meshwork::config

namespace meshwork::op {

inline constexpr const char* kGroup = "meshwork.dev";
inline constexpr const char* kVersion = "v1alpha1";
inline constexpr const char* kApiVersion = "meshwork.dev/v1alpha1";
inline constexpr const char* kKind = "TrainingJob";
inline constexpr const char* kPlural = "trainingjobs";

// Labels on every child; the Pods' also say which replica and which gang generation.
inline constexpr const char* kJobLabel = "meshwork.dev/job";
inline constexpr const char* kIndexLabel = "meshwork.dev/replica-index";
inline constexpr const char* kGenerationLabel = "meshwork.dev/restart-generation";
inline constexpr const char* kWorldSizeLabel = "meshwork.dev/world-size";
inline constexpr const char* kMeshLabel = "meshwork.dev/mesh";  // "1x2x1"

// The trainer container's name, and where its config arrives: the ConfigMap's key mounted as
// kConfigFile (a configMap volume), named by kConfigFileEnv too.
inline constexpr const char* kTrainerContainer = "trainer";
inline constexpr const char* kConfigVolume = "meshwork-config";
inline constexpr const char* kConfigDir = "/etc/meshwork/config";
inline constexpr const char* kConfigFile = "/etc/meshwork/config/config.yaml";
inline constexpr const char* kConfigFileEnv = "MESHWORK_CONFIG_FILE";
inline constexpr const char* kDefaultConfigKey = "config.yaml";
// The most data a ConfigMap holds (the API server refuses a larger one).
inline constexpr size_t kMaxConfigMapBytes = 1024 * 1024;

enum class RestartPolicy { kOnFailure, kExitCode, kNever };
enum class CleanPodPolicy { kNone, kRunning, kAll };
// spec.runPolicy.schedulingPolicy.gangAdmission: Operator = the gang's Pods wait behind a
// scheduling gate until all of them fit (gang.h); PodGroup = Kubernetes' own gang scheduling:
// a PodGroup (scheduling.k8s.io/v1beta1, minCount = replicas) that every Pod names in
// spec.schedulingGroup, placed all or nothing by kube-scheduler's GangScheduling plugin
// (GenericWorkload feature gate; PodGroup is scheduling.k8s.io/v1beta1 from 1.37); Volcano = a
// Volcano PodGroup (scheduling.volcano.sh/v1beta1, minMember = replicas) named by every Pod's
// annotation scheduling.k8s.io/group-name, schedulerName volcano; Coscheduling = the
// scheduler-plugins PodGroup (scheduling.x-k8s.io/v1alpha1, minMember = replicas) named by every
// Pod's label scheduling.x-k8s.io/pod-group; None = straight to the scheduler (for a cluster
// where Kueue places gangs).
// spec.managedBy: unset or this value means the Meshwork operator runs the job; any other
// controller's name (kueue.x-k8s.io/multikueue, for one) means the operator leaves it alone.
inline constexpr const char* kManagedByOperator = "meshwork.dev/trainingjob-controller";
// The job's spec.managedBy when it names another controller, else "".
std::string OtherManager(const nlohmann::json& job);

enum class GangAdmission { kOperator, kPodGroup, kVolcano, kCoscheduling, kNone };
// spec.runPolicy.successPolicy: AllRanks = every rank exits 0; Rank0 = the Pod of replica 0 (which
// holds rank 0) exits 0, and the others are then stopped as cleanPodPolicy says.
enum class SuccessPolicy { kAllRanks, kRank0 };

// spec.runPolicy.failurePolicy.rules: what a failed rank means, by its exit code, a condition on
// its Pod, or its termination message. The first rule that matches a rank decides for it.
enum class FailureAction { kFailJob, kRestartGang, kRestartGangAndIgnoreBackoff };
const char* FailureActionName(FailureAction a);
struct FailureRule {
  std::string name;              // optional, for messages
  FailureAction action = FailureAction::kRestartGang;
  // onExitCodes: the trainer container's exit code is In (or NotIn) `exit_codes`. Unset = any.
  std::optional<bool> exit_code_in;
  std::set<int> exit_codes;
  // onPodConditions: any of these is True on the Pod (reason "" = any reason). Empty = any.
  std::vector<std::pair<std::string, std::string>> pod_conditions;
  // onMessagePattern: a POSIX extended regular expression found in the rank's failure text (its
  // reasons and messages: the Pod's, and the container's termination message). "" = any.
  std::string message_pattern;
};

struct Mesh {
  int dp_replicate = 1;
  int dp_shard = 1;
  int tp = 1;
  // Pipeline stages, the outermost dim: stage s is the world's s-th block of consecutive ranks
  // (whole Pods when processesPerReplica divides the block), so stages cross Pods, not tp groups.
  int pp = 1;
  // spec.mesh.auto: the trainer's rank 0 chooses the dims (dist.mesh: auto); the ones above are
  // unknown until it reports them (TrainerReport::mesh).
  bool chosen_by_trainer = false;
  // "1x2x1" (dpReplicate x dpShard x tp), "pp2x1x2x1" with pipeline stages, "auto" when chosen
  // by the trainer. A label value: letters, digits and x only.
  std::string ToString() const;
  // What ToString's numbers are: "dpReplicate x dpShard x tp" or "pp x dpReplicate x dpShard x tp".
  const char* Dims() const;
};

// spec.elasticPolicy: the replica counts the job may run at. A resize within them starts a new
// gang at the new size that resumes from the latest checkpoint (the trainer reshards it) with the
// same global batch: the config's rows a step at max_replicas (training.global_batch_size).
struct ElasticPolicy {
  int min_replicas = 1;
  int max_replicas = 1;
  // spec.replicas as written. Decide may run the job smaller than that after a node loss
  // (JobSpec::replicas is then the smaller size; status.elastic.shrunkFrom says so).
  int spec_replicas = 1;
};

struct JobSpec {
  std::string runtime_name;  // spec.runtimeRef.name: the TrainingRuntime merged under this spec
  std::string image;
  std::string image_pull_policy;
  std::vector<std::string> command;  // replaces the launcher + trainer when not empty
  std::vector<std::string> args;
  int replicas = 1;
  int processes_per_replica = 1;
  bool gpu = true;
  nlohmann::json resources = nlohmann::json::object();
  nlohmann::json pod_template = nlohmann::json::object();

  std::string config_inline;          // set when the config is inline ...
  std::string config_map_name;        // ... or from this ConfigMap's key
  std::string config_map_key = kDefaultConfigKey;

  // nullopt = auto; dp_shard 0 in an elastic job: what each gang's world leaves (MeshAt).
  std::optional<Mesh> explicit_mesh;
  Mesh mesh;                          // the one in use (explicit or auto)

  std::optional<ElasticPolicy> elastic;
  // An elastic job's global batch (rows a step), passed as training.global_batch_size; found
  // from the trainer config when a gang starts (ValidateTrainerConfig), 0 until then.
  int64_t global_batch_size = 0;
  // spec.mesh.auto: the plan the operator chose for the gang about to start, as the trainer's
  // --set pairs (ChoosePlan, plan_choice.h); empty until then.
  std::vector<std::string> plan_overrides;
  std::optional<Mesh> planned_mesh;  // that plan's dims

  std::optional<std::string> checkpoint_path;  // the container path, when checkpoints are on
  std::optional<int64_t> checkpoint_every;
  nlohmann::json checkpoint_volume;            // null when none

  RestartPolicy restart_policy = RestartPolicy::kExitCode;
  std::set<int> permanent_exit_codes;
  int backoff_limit = 3;
  std::optional<int64_t> active_deadline_seconds;
  std::optional<int64_t> ttl_seconds_after_finished;
  // runPolicy.nodeLossGraceSeconds: how long a node a rank runs on may be NotReady (Ready False
  // or Unknown) before the rank counts as lost and the gang restarts elsewhere as a disruption.
  // A deleted node loses its ranks once they have been bound to it for as long (so at once, but
  // for a node too new for the operator's cache to show).
  int64_t node_loss_grace_seconds = 30;
  bool suspend = false;
  CleanPodPolicy clean_pod_policy = CleanPodPolicy::kRunning;
  GangAdmission gang_admission = GangAdmission::kOperator;
  std::string scheduling_queue;           // schedulingPolicy.queue (Volcano's queue)
  std::string scheduling_priority_class;  // schedulingPolicy.priorityClass (Volcano's PodGroup)
  std::optional<int64_t> schedule_timeout_seconds;  // schedulingPolicy.scheduleTimeoutSeconds (Coscheduling)
  SuccessPolicy success_policy = SuccessPolicy::kAllRanks;
  std::vector<FailureRule> failure_rules;

  int master_port = 0;  // spec.masterPort, else DefaultMasterPort(uid)
  int metrics_port = 9400;

  int WorldSize() const { return replicas * processes_per_replica; }
};

// Permanent exit codes when restartPolicy is ExitCode and none are listed: meshwork-train's
// "bad config" (2) and "bad or missing input file" (3), which no restart can fix.
std::set<int> DefaultPermanentExitCodes();

// The rendezvous port when spec.masterPort is unset: 20000-28999, from the job's uid. Stable for
// the job's life (every gang of it), and different for most pairs of jobs: on the local control
// plane all Pods share the host's network, and rank 0's TCP store listens on every address.
int DefaultMasterPort(const std::string& uid);

// Whether the POSIX extended regular expression `pattern` occurs in `text`, ^ and $ matching at
// each line. An invalid pattern is kInvalidConfig naming why. (ParseSpec refuses back-references
// and bounded repetitions in failurePolicy patterns: with those glibc's matcher can take
// exponential time or memory.)
Result<bool> FindPattern(const std::string& pattern, const std::string& text);

// The auto mesh: FSDP over every rank with one process per Pod (or one Pod); otherwise HSDP,
// sharded over the processes of a Pod and replicated across Pods.
Mesh AutoMesh(int replicas, int processes_per_replica);

// The mesh a gang of `replicas` Pods of this job runs: an explicit mesh (its dpShard, when left
// out in an elastic job, what that world leaves: replicas x processesPerReplica / (pp x
// dpReplicate x tp)), else AutoMesh; spec.mesh.auto's is the trainer's to choose.
Mesh MeshAt(const JobSpec& spec, int replicas);

// Reads `job` (the whole object: metadata.name is checked too). An error is kInvalidConfig with
// a message that starts with the field path and quotes the value, e.g.
//   spec.mesh: dpReplicate x dpShard x tp = 1x3x1 = 3 does not equal replicas x processesPerReplica = 2
// Defaults are applied for absent fields, as the schema would.
Result<JobSpec> ParseSpec(const nlohmann::json& job);

// The `--set KEY=VALUE` overrides the operator adds after `meshwork-train train --config-env VAR`:
// mesh, metrics address and job label, and the checkpoint directory PATH/<ns>/<name>/<uid> (the
// uid makes a re-created job with the same name start afresh, while a gang restart of this
// one resumes).
std::vector<std::string> TrainerOverrides(const JobSpec& spec, const std::string& ns, const std::string& name,
                                          const std::string& uid);

// Loads `config_yaml` with the trainer's own config code and the operator's overrides, so a
// job the trainer would refuse (unknown preset, bad key) fails here with InvalidSpec instead of
// crash-looping its Pods. `field` names where the text came from ("spec.config.inline").
// `pipeline`, when given, is set to status.pipeline of a config with pipeline stages (the
// schedule, its micro-batches and stages, and its own bubble: PipelineStatus), else null.
// An elastic job's config must split its global batch (training.global_batch_size, else the
// config's rows a step at maxReplicas) at every size of spec.elasticPolicy; `global_batch_size`,
// when given, is set to it (0 for a job that is not elastic). spec.mesh.auto's plan is chosen
// and checked apart (PlanGang, plan_choice.h).
Status ValidateTrainerConfig(const std::string& config_yaml, const JobSpec& spec, const std::string& ns,
                             const std::string& name, const std::string& field,
                             nlohmann::json* pipeline = nullptr, int64_t* global_batch_size = nullptr);

// The --set pairs a gang of `spec` loads its config with, as ValidateTrainerConfig checks them:
// TrainerOverrides (any local address for the Pod's) and the `--set` pairs of spec.args.
std::vector<std::string> ValidationOverrides(const JobSpec& spec, const std::string& ns, const std::string& name);

// A config with pipeline stages: its schedule must run (else InvalidConfig naming `field`), and
// `pipeline`, when given, is set to its status.pipeline (null for a config without stages).
Status CheckPipeline(const config::TrainConfig& cfg, const std::string& field, nlohmann::json* pipeline);

}  // namespace meshwork::op
