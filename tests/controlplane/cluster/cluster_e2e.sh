#!/usr/bin/env bash
# meshwork-cluster itself (docs/cluster.md), with the real components and kubectl 1.37:
#   - bad flags and missing binaries: a message naming the flag, exit 2, nothing started;
#   - two nodes from --nodes come up Ready, each served by its own agent under its own
#     system:node identity, which the API server refuses a list of every Pod;
#   - a Pod that asks for nvidia.com/gpu lands on the node that has one, gets CUDA_VISIBLE_DEVICES
#     and a bound service-account token, and its log comes through the kubelet API;
#   - a headless Service's name of a Pod on one node resolves in a Pod on the other;
#   - kube-apiserver SIGKILLed: the supervisor restarts it and kubectl works again;
#   - SIGTERM: every component exits; a restart on the same data directory serves the same
#     objects on the same port;
#   - a first start whose picked port another process takes before kube-apiserver binds it
#     picks new ports and serves.
# usage: cluster_e2e.sh CLUSTER OPERATOR TRAIN SOURCE_DIR (OPERATOR and TRAIN are unused)
set -uo pipefail

cluster_bin="$1"
src="$4"
source "$src/tests/common/e2e_lib.sh"
e2e_require_kube_bin
e2e_init
k() { timeout 60 kubectl --request-timeout=30s "$@"; }

# ---- bad input
out="$("$cluster_bin" --data-dir "$work/bad" --port abc 2>&1)"; rc=$?
[ $rc = 2 ] && [[ "$out" == *"--port abc: expected 1-65535"* ]] && pass "--port abc: exit 2, naming the flag" || fail "--port abc: rc $rc: $out"
out="$("$cluster_bin" --data-dir "$work/bad" --kube-bin "$work/nowhere" 2>&1)"; rc=$?
[ $rc = 2 ] && [[ "$out" == *"--kube-bin $work/nowhere: no etcd there"* ]] && pass "missing binaries: exit 2, naming --kube-bin and what to run" ||
  fail "--kube-bin: rc $rc: $out"
printf 'nodes:\n- {name: Bad_Name}\n' >"$work/bad-nodes.yaml"
out="$("$cluster_bin" --data-dir "$work/bad" --nodes "$work/bad-nodes.yaml" 2>&1)"; rc=$?
[ $rc = 2 ] && [[ "$out" == *"--nodes"*"Bad_Name"* ]] && pass "a bad nodes file: exit 2, naming the node" || fail "bad nodes: rc $rc: $out"
out="$("$cluster_bin" 2>&1)"; rc=$?
[ $rc = 2 ] && [[ "$out" == *"--data-dir is required"* ]] && pass "no --data-dir: exit 2" || fail "no data dir: rc $rc: $out"

# ---- two nodes
cat >"$work/nodes.yaml" <<'EOF'
nodes:
- {name: node-a, cpu: "2", memory: 8Gi}
- {name: node-b, cpu: "2", memory: 8Gi, nvidia.com/gpu: 1, labels: {pool: gpu}}
EOF
e2e_start_controlplane "$cluster_bin" --nodes "$work/nodes.yaml" || exit 1
ready() { [ "$(k get nodes -o jsonpath='{range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status} {end}')" = "node-a=True node-b=True " ]; }
e2e_wait_for 60 "both nodes Ready" ready && pass "node-a and node-b are Ready" || fail "nodes: $(k get nodes 2>&1)"
out="$(k get --raw /api/v1/pods --as system:node:node-a --as-group system:nodes 2>&1)"
[[ "$out" == *"Forbidden"* || "$out" == *"forbidden"* ]] && pass "a node's identity may not list every Pod (Node authorizer)" ||
  fail "list pods as node-a: $out"
out="$("$cluster_bin" --data-dir "$work/cp" --nodes "$work/nodes.yaml" 2>&1)"; rc=$?
[ $rc = 5 ] && [[ "$out" == *"another meshwork-cluster runs on it"* ]] &&
  pass "a second meshwork-cluster on the same data dir: exit 5, naming the lock" || fail "second on cp: rc $rc: $out"
holders="$(k -n kube-node-lease get lease -o jsonpath='{range .items[*]}{.spec.holderIdentity} {end}')"
[ "$holders" = "node-a node-b " ] && pass "each node renews its own Lease" || fail "leases: '$holders'"

cat <<'EOF' | k apply -f - >/dev/null
apiVersion: v1
kind: Service
metadata: {name: s}
spec: {clusterIP: None, publishNotReadyAddresses: true, selector: {app: x}, ports: [{port: 80}]}
---
apiVersion: v1
kind: Pod
metadata: {name: gpu, labels: {app: x}}
spec:
  hostname: gpu
  subdomain: s
  containers:
  - name: main
    image: busybox
    command: ["sh", "-c", "echo CUDA=$CUDA_VISIBLE_DEVICES; echo token=$(wc -c <$MESHWORK_SERVICE_ACCOUNT_DIR/token); sleep 60"]
    resources: {limits: {nvidia.com/gpu: 1}}
---
apiVersion: v1
kind: Pod
metadata: {name: resolver}
spec:
  restartPolicy: Never
  nodeSelector: {kubernetes.io/hostname: node-a}
  containers: [{name: main, image: busybox, command: ["sh", "-c", "sleep 2; getent hosts gpu.s.default.svc"]}]
EOF
running() { [ "$(k get pod gpu -o jsonpath='{.status.phase}')" = Running ]; }
done_() { [ "$(k get pod resolver -o jsonpath='{.status.phase}')" = Succeeded ]; }
if e2e_wait_for 60 "gpu Running" running; then
  node="$(k get pod gpu -o jsonpath='{.spec.nodeName}')"
  log="$(k logs gpu 2>&1)"
  [ "$node" = node-b ] && [[ "$log" == *"CUDA=0"* ]] && pass "the GPU Pod runs on node-b with CUDA_VISIBLE_DEVICES=0 (log through the kubelet API)" ||
    fail "gpu: node $node, log: $log"
  [[ "$log" =~ token=[1-9][0-9]{2,} ]] && pass "it got a bound service-account token" || fail "token: $log"
else
  fail "gpu Pod not Running: $(k describe pod gpu 2>&1 | tail -5)"
fi
if e2e_wait_for 60 "resolver done" done_; then
  ip="$(k get pod gpu -o jsonpath='{.status.podIP}')"
  out="$(k logs resolver 2>&1)"
  [[ "$out" == "$ip "* ]] && pass "gpu.s.default.svc (node-b) resolves to $ip in a Pod on node-a" || fail "resolver: '$out' (gpu at $ip)"
else
  fail "resolver did not succeed: $(k logs resolver 2>&1)"
fi

# ---- a component dies: the supervisor restarts it
api_pid="$(pgrep -f -- "--tls-cert-file $work/cp/pki/apiserver.crt" | head -1)"
kill -KILL "$api_pid"
restarted() { local p; p="$(pgrep -f -- "--tls-cert-file $work/cp/pki/apiserver.crt" | head -1)"; [ -n "$p" ] && [ "$p" != "$api_pid" ] && k get ns default >/dev/null 2>&1; }
e2e_wait_for 120 "kube-apiserver restarted" restarted &&
  grep -q "kube-apiserver was killed by signal 9; restarting" "$work/cp.log" &&
  pass "kube-apiserver SIGKILLed: restarted, logged, and kubectl answers again" || fail "restart: $(tail -3 "$work/cp.log")"

# ---- SIGTERM stops everything; the same data dir serves the same objects again
cluster_pid="$(pgrep -f -- "meshwork-cluster --data-dir $work/cp" | head -1)"
port="$(python3 -c "import json; print(json.load(open('$work/cp/ports.json'))['apiserver'])")"
kill -TERM "$cluster_pid"
stopped() { ! kill -0 "$cluster_pid" 2>/dev/null && [ -z "$(pgrep -f -- "$work/cp/" || true)" ]; }
e2e_wait_for 90 "everything stopped" stopped && pass "SIGTERM: the supervisor and every component exited" ||
  fail "left running: $(pgrep -fa -- "$work/cp/" | cut -c1-120)"
mv "$work/cp.log" "$work/cp.first.log"
e2e_start_controlplane "$cluster_bin" --nodes "$work/nodes.yaml" || exit 1
[ "$(python3 -c "import json; print(json.load(open('$work/cp/ports.json'))['apiserver'])")" = "$port" ] &&
  k get svc s >/dev/null 2>&1 && pass "restarted on the same data dir: same port $port, the Service is still there" ||
  fail "after restart: $(k get svc s 2>&1)"

# ---- a first start whose picked port is taken after etcd serves, before kube-apiserver binds it
# (seen in CI, where other tests' servers pick from the same range): it picks new ports, serves
python3 -c '
import json, os, socket, sys, time
path, out = sys.argv[1], sys.argv[2]
while not os.path.exists(path):
    time.sleep(0.002)
ports = json.load(open(path))
while socket.socket().connect_ex(("127.0.0.1", ports["etcd-client"])) != 0:  # kube-apiserver starts next
    time.sleep(0.002)
port = ports["apiserver"]
s = socket.socket()
try:
    s.bind(("127.0.0.1", port))
except OSError as e:  # kube-apiserver was first: nothing was taken
    open(out, "w").write("unbound: " + str(e))
    raise SystemExit(0)
s.listen()
open(out, "w").write(str(port))
time.sleep(600)
' "$work/race/ports.json" "$work/taken" &
taker=$!
e2e_track $taker
mkdir -p "$work/race"
"$cluster_bin" --data-dir "$work/race" --nodes none >"$work/race.log" 2>&1 &
race_pid=$!
e2e_track $race_pid
if e2e_wait_serving $race_pid "$work/race.log" "the cluster whose port was taken"; then
  taken="$(cat "$work/taken" 2>/dev/null)"
  now="$(python3 -c "import json; print(json.load(open('$work/race/ports.json'))['apiserver'])")"
  if [[ "$taken" == unbound* ]]; then
    echo "SKIP: kube-apiserver bound its port before the test could take it ($taken); the retry was not exercised"
  elif [ -n "$taken" ] && [ "$now" != "$taken" ] && grep -q "bind: address already in use" "$work/race.log" &&
    grep -q "picking new ports (attempt 2 of 3)" "$work/race.log" &&
    k --kubeconfig "$work/race/kubeconfig" get ns default >/dev/null 2>&1; then
    pass "port $taken taken after the pick: picked again, logged, serving on $now"
  else
    fail "taken '$taken', now '$now': $(cat "$work/race.log")"
  fi
fi
kill -TERM $race_pid $taker 2>/dev/null
wait $race_pid 2>/dev/null

e2e_summary cluster_e2e
