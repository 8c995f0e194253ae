#!/usr/bin/env bash
# Node loss (issue 48): a two-node cluster, a 2-Pod job spread one rank a node; node-a's agent is
# stopped (SIGSTOP: its kubelet stops reporting, as on a dead machine, while its processes run
# on), the node lifecycle controller marks it Unknown, and once runPolicy.nodeLossGraceSeconds
# has passed the operator counts the rank lost: the gang restarts on node-b as a disruption
# (status.disruptionRestarts 1, restarts 0 with backoffLimit 0), the lost Pod is deleted at once
# (no kubelet will confirm a graceful delete), and the next gang succeeds there. Checks the
# status, the GangRestartAfterDisruption Event naming the Pod and the node, and where the new
# gang ran. (The Restarting condition's NodeLost reason is the unit tests': the job's success
# rewrites it within the second.) Beside it an elastic job (elasticPolicy {1, 2}) loses its rank
# on node-a too: it goes on at 1 Pod on node-b (status.elastic shrunkFrom 2, lostNodes node-a),
# and once node-a's agent runs again and the node is Ready, it grows back to 2 Pods (an
# ElasticGrow Event, a resize) and succeeds.
# usage: node_loss_e2e.sh CONTROLPLANE OPERATOR TRAIN SOURCE_DIR
set -uo pipefail

cp_bin="$1"
op_bin="$2"
src="$4"
source "$src/tests/common/e2e_lib.sh"
e2e_require_kubectl
e2e_init
k() { timeout 60 kubectl --request-timeout=30s -n e2e "$@"; }
jp() { k get tj nodeloss -o jsonpath="$1" 2>/dev/null; }
agent_pid() { pgrep -f -- "--state-dir $work/cp/agent/$1( |$)" | head -1; }
stopped=""
finish() {
  [ -n "$stopped" ] && kill -CONT "$stopped" 2>/dev/null
  if [ "$failed" -gt 0 ]; then
    echo "---- kubectl get tj,pods,nodes"; k get tj,pods -o wide 2>&1; kubectl get nodes 2>&1
    echo "---- status"; jp '{.status}'; echo
    echo "---- operator log"; tail -n 40 "$work/op.log"
  fi
  e2e_summary node_loss_e2e
  exit $?
}

cat >"$work/nodes.yaml" <<'YAML'
nodes:
- {name: node-a, cpu: "4", memory: 8Gi}
- {name: node-b, cpu: "5", memory: 8Gi}
YAML
e2e_start_controlplane "$cp_bin" --nodes "$work/nodes.yaml" || exit 1
e2e_apply_crd "$src" || { fail "the CRD did not apply"; finish; }
kubectl create namespace e2e >/dev/null
port="$(free_port)"
"$op_bin" --kubeconfig "$KUBECONFIG" --metrics-bind-address "127.0.0.1:$port" --leader-elect false \
  --report-interval-s 2 --pod-delete-grace-s 5 >>"$work/op.log" 2>&1 &
e2e_track $!

# spread_job NAME LAST_SLEEPING_GENERATION [EXTRA_SPEC_LINE]: a 2-Pod job, one rank a node while
# both are Ready (the spread leaves out a node tainted NotReady: nodeTaintsPolicy Honor), whose
# gangs up to that generation sleep (a rank that would run for hours) and later ones exit 0.
spread_job() {
  kubectl apply -f - >/dev/null <<YAML
apiVersion: meshwork.dev/v1alpha1
kind: TrainingJob
metadata: {name: $1, namespace: e2e}
spec:
  image: busybox
  device: cpu
  replicas: 2
${3:+  $3
}  command: ["sh", "-c", "[ \$MESHWORK_RESTART_GENERATION -le $2 ] && exec sleep 600; exit 0"]
  resources: {requests: {cpu: "${4:-1}"}}
  runPolicy: {backoffLimit: 0, nodeLossGraceSeconds: 5}
  template:
    spec:
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, nodeTaintsPolicy: Honor,
         labelSelector: {matchLabels: {meshwork.dev/job: $1}}}
  config:
    inline: "model: {preset: tiny}"
YAML
}
# The plain job: its first gang sleeps, the next one exits 0.
spread_job nodeloss 0
# The elastic job: generations 0 (both nodes) and 1 (node-b alone) sleep; 2, grown back to both
# nodes, exits 0. Its Pods ask 3 cpu: node-b (5) never holds two, so it cannot grow back on the
# room left there (a shrunk job grows back as soon as its whole gang fits the Ready nodes) and
# waits for node-a.
spread_job shrinks 1 "elasticPolicy: {minReplicas: 1, maxReplicas: 2}" 3
ejp() { k get tj shrinks -o jsonpath="$1" 2>/dev/null; }
nodes_of() { k get pods -l meshwork.dev/job=nodeloss -o jsonpath='{range .items[*]}{.metadata.name}={.spec.nodeName}/{.status.phase} {end}'; }
spread() { [ "$(nodes_of)" = "nodeloss-0=node-a/Running nodeloss-1=node-b/Running " ] ||
           [ "$(nodes_of)" = "nodeloss-0=node-b/Running nodeloss-1=node-a/Running " ]; }
if ! e2e_wait_for 90 "one rank running on each node" spread; then
  fail "the first gang did not run spread over both nodes: $(nodes_of)"; finish
fi
pass "the first gang runs, one rank a node: $(nodes_of)"
shrinks_spread() { k get pods -l meshwork.dev/job=shrinks -o jsonpath='{range .items[*]}{.spec.nodeName}/{.status.phase} {end}' |
                   tr ' ' '\n' | sort | tr '\n' ' ' | grep -qx 'node-a/Running node-b/Running '; }
e2e_wait_for 60 "the elastic job's ranks on both nodes" shrinks_spread ||
  { fail "the elastic job's first gang is not spread: $(k get pods -l meshwork.dev/job=shrinks -o wide 2>&1)"; finish; }
lost_pod="$(k get pods -l meshwork.dev/job=nodeloss -o jsonpath='{range .items[?(@.spec.nodeName=="node-a")]}{.metadata.name}{end}')"

stopped="$(agent_pid node-a)"
[ -n "$stopped" ] || { fail "no node agent process for node-a"; finish; }
kill -STOP "$stopped"
t_stop=$SECONDS
# The node lifecycle controller marks node-a Unknown after its monitor grace period (40-50 s
# without a Lease renewal), then the job's 5 s grace runs.
unknown() { [ "$(kubectl get node node-a -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = Unknown ]; }
e2e_wait_for 120 "node-a Unknown" unknown && pass "node-a is Ready=Unknown $((SECONDS - t_stop)) s after its agent stopped" ||
  fail "node-a: $(kubectl get node node-a -o jsonpath='{.status.conditions[?(@.type=="Ready")]}')"
succeeded() { [ "$(jp '{.status.phase}')" = Succeeded ]; }
if e2e_wait_for 120 "nodeloss succeeds" succeeded; then
  pass "the job succeeded $((SECONDS - t_stop)) s after node-a's agent stopped"
  [ "$(jp '{.status.disruptionRestarts}')" = 1 ] && [ "$(jp '{.status.restarts}')" = 0 ] &&
    [ "$(jp '{.status.restartGeneration}')" = 1 ] &&
    pass "one gang restart, a disruption: disruptionRestarts 1, restarts 0 (backoffLimit 0 not reached)" ||
    fail "counts: $(jp '{.status}')"
  msg="$(k get events --field-selector involvedObject.name=nodeloss,reason=GangRestartAfterDisruption -o jsonpath='{.items[*].message}')"
  [[ "$msg" == *"pod $lost_pod is lost with its node (node node-a is NotReady (Ready Unknown"*"past runPolicy.nodeLossGraceSeconds 5)"* ]] &&
    pass "Event GangRestartAfterDisruption names the Pod and the node: ${msg:0:160}" || fail "event: $msg"
  # The second gang ran on node-b alone (its Pods are Succeeded and kept: cleanPodPolicy Running).
  [ "$(nodes_of)" = "nodeloss-0=node-b/Succeeded nodeloss-1=node-b/Succeeded " ] &&
    pass "the next gang ran on node-b, the node left" || fail "the second gang: $(nodes_of)"
else
  fail "nodeloss did not succeed after node-a was lost: phase $(jp '{.status.phase}'), $(jp '{.status.conditions[*].message}')"
fi

# The elastic job went on at 1 Pod on node-b; node-a comes back and it grows to 2 again.
shrinks_pods() { k get pods -l meshwork.dev/job=shrinks -o jsonpath='{range .items[*]}{.metadata.name}={.spec.nodeName}/{.status.phase} {end}'; }
one_left() { [ "$(ejp '{.status.elastic.replicas}')" = 1 ] && [ "$(shrinks_pods)" = "shrinks-0=node-b/Running " ]; }
if e2e_wait_for 60 "shrinks runs 1 Pod on node-b" one_left; then
  [ "$(ejp '{.status.elastic.shrunkFrom}')" = 2 ] && [ "$(ejp '{.status.elastic.lostNodes}')" = '["node-a"]' ] &&
    [ "$(ejp '{.status.restarts}')" = 0 ] && [ "$(ejp '{.status.disruptionRestarts}')" = 1 ] &&
    pass "the elastic job goes on at 1 Pod on node-b (shrunkFrom 2, lostNodes [node-a], a disruption)" ||
    fail "shrinks after the loss: $(ejp '{.status}')"
else
  fail "the elastic job did not go on at 1 Pod: $(shrinks_pods) $(ejp '{.status.elastic}')"
  k get pods -o wide; k get pod shrinks-0 -o jsonpath='{.spec.schedulingGates} {.status.conditions}'; echo
  k get events --field-selector involvedObject.name=shrinks -o jsonpath='{range .items[*]}{.reason}: {.message}{"\n"}{end}' | tail -n 8
  kubectl get nodes -o wide
fi
kill -CONT "$stopped"; stopped=""
t_back=$SECONDS
shrinks_done() { [ "$(ejp '{.status.phase}')" = Succeeded ]; }
if e2e_wait_for 150 "shrinks grows back and succeeds" shrinks_done; then
  grow="$(k get events --field-selector involvedObject.name=shrinks,reason=ElasticGrow -o jsonpath='{.items[*].message}')"
  [[ "$grow" == "node node-a is back (Ready, schedulable, untainted): the job grows back to spec.replicas 2" ]] &&
    [ "$(ejp '{.status.elastic.replicas}')" = 2 ] && [ "$(ejp '{.status.restartGeneration}')" = 2 ] &&
    [ "$(shrinks_pods)" = "shrinks-0=node-a/Succeeded shrinks-1=node-b/Succeeded " -o \
      "$(shrinks_pods)" = "shrinks-0=node-b/Succeeded shrinks-1=node-a/Succeeded " ] &&
    pass "node-a back: the elastic job grew to 2 Pods, one a node, $((SECONDS - t_back)) s after its agent resumed (Event: $grow)" ||
    fail "growing back: event '$grow', pods $(shrinks_pods), $(ejp '{.status.elastic}')"
else
  fail "shrinks did not grow back and succeed: $(shrinks_pods) $(ejp '{.status.phase}') $(ejp '{.status.elastic}')"
fi
finish
