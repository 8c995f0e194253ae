#!/usr/bin/env bash
# TrainingJobs queued by the real Kueue (sigs.k8s.io/kueue v0.17.0, built by scripts/kube-build.sh
# with its CRDs) on meshwork-cluster, with the operator as Kueue's integration for TrainingJob
# (Kueue's externalFrameworks; docs/trainingjob.md, "Kueue"):
#   - a ClusterQueue with 2 CPUs of quota, three jobs of 2 x 1 CPU labelled with its LocalQueue:
#     each gets a Workload (count 2, the Pod's requests), at most one runs at a time, the others
#     wait Suspended (reason Queued, the quota Kueue reports), all three Succeed, every Workload
#     ends Finished;
#   - a job without the label is not Kueue's: no Workload, it runs at once;
#   - partial admission: an elastic job's Workload has minCount = minReplicas; with half the
#     quota taken Kueue admits it with 1 of its 2 Pods, and the gang runs at that size;
#   - preemption of part of an elastic job: preempted for a smaller high-priority job, it is
#     admitted again at once with the Pods left and runs beside it;
#   - eviction: a running job's Workload deactivated (spec.active false) stops the gang, the job
#     goes Suspended saying why, the Workload's quota is given back; reactivated, it runs again
#     and succeeds.
# Kueue with its internal certificate management off reads a metrics certificate from the fixed
# path /etc/kueue/metrics/certs: the test writes a self-signed one there when none exists (as
# root, which CI is) and removes what it made (tests/common/e2e_lib.sh, e2e_kueue_certs).
# usage: kueue_e2e.sh CONTROLPLANE OPERATOR TRAIN SOURCE_DIR
set -uo pipefail

cp_bin="$1"
op_bin="$2"
src="$4"
source "$src/tests/common/e2e_lib.sh"
e2e_require_kube_bin
e2e_require_kueue
e2e_init
k() { timeout 60 kubectl --request-timeout=30s -n kq "$@"; }
jp() { k get tj "$1" -o jsonpath="$2" 2>/dev/null; }
finish() {
  if [ "$failed" -gt 0 ]; then
    echo "---- kubectl get tj,workloads,pods"; k get tj,workloads.kueue.x-k8s.io,pods -o wide 2>&1
    echo "---- operator log"; tail -n 30 "$work/op.log"
    echo "---- kueue errors"; grep '"level":"error"' "$work/kueue.log" | tail -n 10 | cut -c1-400
  fi
  e2e_kueue_cleanup
  e2e_summary kueue_e2e
  exit $?
}

e2e_kueue_certs || exit 0

cat >"$work/nodes.yaml" <<'EOF'
nodes:
- {name: node-a, cpu: "4", memory: 16Gi}
EOF
e2e_start_controlplane "$cp_bin" --nodes "$work/nodes.yaml" || exit 1
e2e_apply_crd "$src" || { fail "the Meshwork CRDs did not apply"; finish; }
e2e_kueue_apis "$KUBECONFIG" || { fail "Kueue's CRDs are not served: $(kubectl get crd 2>&1 | grep kueue)"; finish; }
kubectl create namespace kueue-system >/dev/null
kubectl create namespace kq >/dev/null
e2e_start_kueue "$KUBECONFIG" "$work/kueue" ||
  { fail "Kueue did not start: $(grep '"level":"error"' "$work/kueue.log" | tail -3)"; finish; }
port="$(free_port)"
"$op_bin" --kubeconfig "$KUBECONFIG" --metrics-bind-address "127.0.0.1:$port" --leader-elect false \
  --report-interval-s 2 --pod-delete-grace-s 2 >>"$work/op.log" 2>&1 &
e2e_track $!

out="$(kubectl apply -f - 2>&1 <<'EOF'
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: default-flavor}
spec:
  # The gang goes where the flavor says: the node is linux; the toleration is carried to the Pods.
  nodeLabels: {kubernetes.io/os: linux}
  tolerations: [{key: meshwork.dev/e2e-pool, operator: Exists, effect: NoSchedule}]
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: cq}
spec:
  namespaceSelector: {}
  preemption: {withinClusterQueue: LowerPriority}
  resourceGroups:
  - coveredResources: [cpu]
    flavors:
    - name: default-flavor
      resources:
      - {name: cpu, nominalQuota: 2}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: WorkloadPriorityClass
metadata: {name: low}
value: 10
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: WorkloadPriorityClass
metadata: {name: high}
value: 1000
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: lq, namespace: kq}
spec: {clusterQueue: cq}
---
# Topology-aware scheduling: one level, the node; a flavor on it; its own queue.
apiVersion: kueue.x-k8s.io/v1beta2
kind: Topology
metadata: {name: hosts}
spec:
  levels: [{nodeLabel: kubernetes.io/hostname}]
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: tas-flavor}
spec:
  nodeLabels: {kubernetes.io/os: linux}
  topologyName: hosts
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: cq-tas}
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [cpu]
    flavors:
    - name: tas-flavor
      resources:
      - {name: cpu, nominalQuota: 2}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: lq-tas, namespace: kq}
spec: {clusterQueue: cq-tas}
EOF
)" || { fail "queues: $out"; finish; }

# job NAME SECONDS QUEUE [PRIORITY]: 2 Pods x 1 CPU that sleep; QUEUE "" = no Kueue label;
# PRIORITY a WorkloadPriorityClass (label kueue.x-k8s.io/priority-class).
job() {
  local labels="{}"
  [ -n "$3" ] && labels="{kueue.x-k8s.io/queue-name: $3${4:+, kueue.x-k8s.io/priority-class: $4}}"
  cat <<EOF
---
apiVersion: meshwork.dev/v1alpha1
kind: TrainingJob
metadata: {name: $1, namespace: kq, labels: $labels}
spec:
  image: busybox
  device: cpu
  replicas: 2
  resources: {requests: {cpu: "1"}}
  command: ["sh", "-c", "sleep $2"]
  config: {inline: "model: {preset: tiny}"}
EOF
}
{ job q1 6 lq; job q2 6 lq; job q3 6 lq; } | k apply -f - >/dev/null || { fail "apply of the queued jobs"; finish; }

# Until all three finish: never more than one running (2 CPUs of quota), and the waiting ones
# Suspended with reason Queued.
most=0
queued_seen=""
end=$((SECONDS + 180))
while ((SECONDS < end)); do
  running="$(k get pods -o jsonpath='{range .items[?(@.status.phase=="Running")]}{.metadata.labels.meshwork\.dev/job}{"\n"}{end}' 2>/dev/null | sort -u | grep -c .)"
  ((running > most)) && most=$running
  reasons="$(k get tj -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Suspended")].reason}{"\n"}{end}' 2>/dev/null)"
  grep -q '^Queued$' <<<"$reasons" && queued_seen=1
  done_count="$(k get tj q1 q2 q3 -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' 2>/dev/null | grep -c '^Succeeded$')"
  [ "$done_count" = 3 ] && break
  sleep 1
done
[ "$done_count" = 3 ] && pass "three queued jobs all Succeeded" || fail "queued jobs: $(k get tj 2>&1)"
[ "$most" = 1 ] && pass "Kueue's quota (2 CPUs) ran one 2 x 1-CPU job at a time" || fail "at most $most jobs ran at once"
[ -n "$queued_seen" ] && pass "the jobs Kueue had not admitted waited Suspended (reason Queued)" || fail "no job was seen Queued"
msg="$(grep -h 'reconcile kq/q[123]: Queued: .*insufficient unused quota' "$work/op.log" | head -1)"
[ -n "$msg" ] && pass "the job says why it waits, from Kueue: ${msg#*Queued: }" || fail "no Queued message with Kueue's reason in the operator log"
placed="$(k get pod q1-0 -o jsonpath='{.spec.nodeSelector.kubernetes\.io/os} {.spec.tolerations[?(@.key=="meshwork.dev/e2e-pool")].effect}' 2>&1)"
[ "$placed" = "linux NoSchedule" ] && pass "the admitted gang's Pods carry their ResourceFlavor's nodeLabels and tolerations" ||
  fail "q1-0 placement: '$placed'"
wl="$(k get workloads.kueue.x-k8s.io trainingjob-q1 -o jsonpath='{.spec.queueName} {.spec.podSets[0].count} {.spec.podSets[0].template.spec.containers[0].resources.requests.cpu} {.metadata.ownerReferences[0].kind} {.status.conditions[?(@.type=="Finished")].status} {.status.conditions[?(@.type=="Finished")].reason}' 2>&1)"
[ "$wl" = "lq 2 1 TrainingJob True Succeeded" ] && pass "Workload trainingjob-q1: LocalQueue lq, 2 Pods of 1 CPU, owned by the job, Finished (Succeeded)" ||
  fail "Workload trainingjob-q1: '$wl'"

# Not Kueue's: no label, no Workload, runs at once.
job free 2 "" | k apply -f - >/dev/null
e2e_wait_for 60 "free succeeds" bash -c "[ \"\$(kubectl -n kq get tj free -o jsonpath='{.status.phase}')\" = Succeeded ]" &&
  ! k get workloads.kueue.x-k8s.io trainingjob-free >/dev/null 2>&1 &&
  pass "a job without the queue-name label is not Kueue's: no Workload, it ran" || fail "free: $(jp free '{.status}')"

# Eviction: deactivate a running job's Workload, then reactivate it.
job ev 15 lq | k apply -f - >/dev/null
if e2e_wait_for 60 "ev runs" bash -c "[ \"\$(kubectl -n kq get tj ev -o jsonpath='{.status.phase}')\" = Running ]"; then
  k patch workloads.kueue.x-k8s.io trainingjob-ev --type=merge -p '{"spec":{"active":false}}' >/dev/null
  if e2e_wait_for 30 "ev suspended" bash -c "[ \"\$(kubectl -n kq get tj ev -o jsonpath='{.status.phase}')\" = Suspended ] && [ -z \"\$(kubectl -n kq get pods -l meshwork.dev/job=ev -o name)\" ]"; then
    msg="$(jp ev '{.status.conditions[?(@.type=="Suspended")].message}')"
    e2e_wait_for 30 "ev's quota given back" bash -c "[ -z \"\$(kubectl -n kq get workloads.kueue.x-k8s.io trainingjob-ev -o jsonpath='{.status.admission}')\" ]"
    [[ "$msg" == "evicted by Kueue (Deactivated)"* ]] &&
      [ -z "$(k get workloads.kueue.x-k8s.io trainingjob-ev -o jsonpath='{.status.admission}')" ] &&
      pass "an evicted Workload stops the gang, the job says why ($msg), the quota is given back" ||
      fail "eviction: message '$msg', admission '$(k get workloads.kueue.x-k8s.io trainingjob-ev -o jsonpath='{.status.admission}')'"
  else fail "ev was not stopped: $(jp ev '{.status.phase}') $(k get pods -l meshwork.dev/job=ev -o name)"; fi
  k patch workloads.kueue.x-k8s.io trainingjob-ev --type=merge -p '{"spec":{"active":true}}' >/dev/null
  e2e_wait_for 90 "ev succeeds" bash -c "[ \"\$(kubectl -n kq get tj ev -o jsonpath='{.status.phase}')\" = Succeeded ]" &&
    [ "$(jp ev '{.status.restarts}')" = 0 ] &&
    pass "reactivated, Kueue admits it again and it succeeds, no restart counted" || fail "ev: $(jp ev '{.status}')"
else fail "ev did not run: $(jp ev '{.status}')"; fi

# Priority: a high-priority job preempts a running low-priority one through Kueue; both succeed.
job lo 25 lq low | k apply -f - >/dev/null
if e2e_wait_for 60 "lo runs" bash -c "[ \"\$(kubectl -n kq get tj lo -o jsonpath='{.status.phase}')\" = Running ]"; then
  job hi 4 lq high | k apply -f - >/dev/null
  prio="$(k get workloads.kueue.x-k8s.io trainingjob-hi trainingjob-lo -o jsonpath='{range .items[*]}{.spec.priorityClassRef.kind}/{.spec.priorityClassRef.name}={.spec.priority} {end}' 2>&1)"
  [ "$prio" = "WorkloadPriorityClass/high=1000 WorkloadPriorityClass/low=10 " ] &&
    pass "the priority-class label gives each Workload its WorkloadPriorityClass and value ($prio)" || fail "priorities: '$prio'"
  if e2e_wait_for 60 "lo preempted" bash -c "kubectl -n kq get tj lo -o jsonpath='{.status.conditions[?(@.type==\"Suspended\")].message}' | grep -q Preempted"; then
    pass "Kueue preempted the running low-priority gang for the high one: $(jp lo '{.status.conditions[?(@.type=="Suspended")].message}' | cut -c1-90)"
  else fail "lo was not preempted: $(jp lo '{.status.conditions}')"; fi
  e2e_wait_for 120 "hi and lo succeed" bash -c "[ \"\$(kubectl -n kq get tj hi lo -o jsonpath='{.items[*].status.phase}')\" = 'Succeeded Succeeded' ]" &&
    [ "$(jp lo '{.status.restarts}')" = 0 ] &&
    pass "the high-priority job ran, then the preempted one was admitted again and succeeded, no restart counted" ||
    fail "hi/lo: $(k get tj hi lo 2>&1)"
else fail "lo did not run: $(jp lo '{.status}')"; fi

# Partial admission: with 1 of the 2 CPUs taken, an elastic job (2 Pods, minReplicas 1) is
# admitted by Kueue with 1 Pod (its Workload's minCount), and its gang runs at that size.
job one 20 lq | sed 's/^  replicas: 2/  replicas: 1/' | k apply -f - >/dev/null
if e2e_wait_for 60 "one runs" bash -c "[ \"\$(kubectl -n kq get tj one -o jsonpath='{.status.phase}')\" = Running ]"; then
  job el 4 lq | sed 's/^  replicas: 2/  replicas: 2\n  elasticPolicy: {minReplicas: 1, maxReplicas: 2}/' | k apply -f - >/dev/null
  if e2e_wait_for 90 "el succeeds" bash -c "[ \"\$(kubectl -n kq get tj el -o jsonpath='{.status.phase}')\" = Succeeded ]"; then
    wl="$(k get workloads.kueue.x-k8s.io trainingjob-el -o jsonpath='{.spec.podSets[0].count} {.spec.podSets[0].minCount}' 2>&1)"
    pods="$(k get pods -l meshwork.dev/job=el -o jsonpath='{range .items[*]}{.metadata.name}/{.metadata.labels.meshwork\.dev/world-size} {end}')"
    [ "$wl" = "2 1" ] && [ "$pods" = "el-0/1 " ] && [ "$(jp el '{.status.elastic.admittedReplicas}')" = 1 ] &&
      [ "$(jp el '{.status.elastic.replicas}')" = 1 ] &&
      pass "Kueue admitted the elastic job with 1 of its 2 Pods (Workload count 2, minCount 1); it ran and succeeded at world size 1" ||
      fail "partial admission: Workload '$wl', Pods '$pods', status.elastic $(jp el '{.status.elastic}')"
  else fail "el did not succeed: $(jp el '{.status}'); workload $(k get workloads.kueue.x-k8s.io trainingjob-el -o jsonpath='{.status}' 2>&1 | cut -c1-400)"; fi
  e2e_wait_for 60 "one succeeds" bash -c "[ \"\$(kubectl -n kq get tj one -o jsonpath='{.status.phase}')\" = Succeeded ]" ||
    fail "one: $(jp one '{.status.phase}')"
else fail "one did not run: $(jp one '{.status}')"; fi

# Preemption of part of an elastic job: a low-priority elastic job (2 Pods, minReplicas 1) holds the
# whole quota; a high-priority 1-Pod job preempts it (Kueue evicts a Workload whole), and Kueue
# admits it again at once with the 1 Pod left (partial admission): it runs smaller beside the high
# one instead of waiting for its whole gang, and succeeds, no restart counted.
job elp 25 lq low | sed 's/^  replicas: 2/  replicas: 2\n  elasticPolicy: {minReplicas: 1, maxReplicas: 2}/' | k apply -f - >/dev/null
if e2e_wait_for 60 "elp runs at 2 Pods" bash -c "[ \"\$(kubectl -n kq get tj elp -o jsonpath='{.status.phase} {.status.elastic.replicas}')\" = 'Running 2' ]"; then
  job hp 12 lq high | sed 's/^  replicas: 2/  replicas: 1/' | k apply -f - >/dev/null
  preempted=""
  beside() {
    kubectl -n kq get tj elp -o jsonpath='{.status.conditions[?(@.type=="Suspended")].message}' | grep -q Preempted &&
      preempted=1
    [ -n "$preempted" ] && [ "$(kubectl -n kq get tj hp elp -o jsonpath='{.items[*].status.phase}')" = "Running Running" ] &&
      [ "$(kubectl -n kq get tj elp -o jsonpath='{.status.elastic.admittedReplicas} {.status.elastic.replicas}')" = "1 1" ] &&
      [ "$(kubectl -n kq get pods -l meshwork.dev/job=elp -o jsonpath='{range .items[?(@.status.phase=="Running")]}{.metadata.name}/{.metadata.labels.meshwork\.dev/world-size} {end}')" = "elp-0/1 " ]
  }
  if e2e_wait_for 90 "elp runs at 1 Pod beside hp" beside; then
    pass "Kueue preempted the elastic job (Suspended: Preempted) for a 1-Pod high-priority job and admitted it again at 1 of its 2 Pods: it runs beside it"
  else
    fail "elp did not run at 1 Pod beside hp (preempted seen: '${preempted}'): $(k get tj hp elp 2>&1); elp $(jp elp '{.status.elastic}') $(jp elp '{.status.conditions[?(@.type=="Suspended")].message}')"
  fi
  e2e_wait_for 120 "hp and elp succeed" bash -c "[ \"\$(kubectl -n kq get tj hp elp -o jsonpath='{.items[*].status.phase}')\" = 'Succeeded Succeeded' ]" &&
    [ "$(jp elp '{.status.restarts}')" = 0 ] &&
    pass "both succeeded; the preemption counted no restart against the elastic job" || fail "hp/elp: $(k get tj hp elp 2>&1) restarts $(jp elp '{.status.restarts}')"
else fail "elp did not run at 2 Pods: $(jp elp '{.status}')"; fi

# Topology: a gang that requires one node; Kueue assigns the domain, its ungater places the Pods.
job tas 3 lq-tas | sed 's|^  image: busybox|  image: busybox\n  template: {metadata: {annotations: {kueue.x-k8s.io/podset-required-topology: kubernetes.io/hostname}}}|' |
  k apply -f - >/dev/null
req="$(k get workloads.kueue.x-k8s.io trainingjob-tas -o jsonpath='{.spec.podSets[0].topologyRequest.required} {.spec.podSets[0].topologyRequest.podIndexLabel}' 2>&1)"
[ "$req" = "kubernetes.io/hostname meshwork.dev/replica-index" ] &&
  pass "the template's topology annotation is the Workload's topologyRequest, replicas indexed ($req)" || fail "topologyRequest: '$req'"
if e2e_wait_for 90 "tas succeeds" bash -c "[ \"\$(kubectl -n kq get tj tas -o jsonpath='{.status.phase}')\" = Succeeded ]"; then
  node="$(k get nodes -o jsonpath='{.items[0].metadata.name}')"
  placed="$(k get pod tas-0 tas-1 -o jsonpath='{range .items[*]}{.spec.nodeSelector.kubernetes\.io/hostname}/{.spec.schedulingGates}/{.metadata.annotations.kueue\.x-k8s\.io/workload} {end}' 2>&1)"
  [ "$placed" = "$node//trainingjob-tas $node//trainingjob-tas " ] &&
    pass "Kueue's topology ungater put each Pod on its assigned domain ($node) and lifted the gate; the job succeeded" ||
    fail "tas Pods: '$placed' (node $node)"
else fail "tas did not succeed: $(jp tas '{.status}'); workload $(k get workloads.kueue.x-k8s.io trainingjob-tas -o jsonpath='{.status}' 2>&1 | cut -c1-400)"; fi
finish
