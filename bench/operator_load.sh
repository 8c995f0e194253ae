#!/usr/bin/env bash
# meshwork-operator under a burst: N TrainingJobs (default 500) applied at once, with one
# `kubectl apply -f` of a multi-document YAML, to a fresh local cluster (meshwork-cluster: the
# real kube-apiserver, etcd, controller-manager and scheduler, and the node agent) and one operator.
# Each job's Pods run `true` and exit at once, so what is measured is the control loop (operator,
# API server, node agent), not training. One row per replicas value (1, then 2 Pods per job),
# each on a fresh control plane: time until every Pod exists, time until every job is Succeeded,
# reconciles/s, reconcile errors by reason, pods created/deleted, the deepest work queue seen,
# CPU time and peak RSS of the operator and of the cluster's components (summed; each one in the
# details). The home-made meshwork-controlplane's rows from before it was retired (issue 19) stay
# in the table for comparison.
# Writes bench/results/operator_load.md. Needs a build and kubectl (scripts/setup.sh).
# usage: bench/operator_load.sh [build-dir] [jobs] [replicas...]
#   build-dir defaults to $MESHWORK_BUILD_DIR, else build/; jobs to $N, else 500; replicas to "1 2".
#   ROWS="500x1 500x2 2000x1": rows of JOBSxPODS_PER_JOB instead (overrides jobs and replicas).
#   TIMEOUT_S (default 900): give up on a row after this many seconds and report what is stuck.
#   KEEP_DIR: copy each row's logs, metrics, timeline and data dir there at the end.
#   POD_NETWORK (default none): meshwork-cluster's --pod-network. With auto every Pod gets an
#   address on its node's /24 bridge, and the node agent releases it only when the Pod is deleted
#   (kubelet releases it when the Pod finishes): past about 250 finished Pods a node, new Pods
#   fail with FailedCreatePodSandBox. none is also what the rows before the Pod network ran.
set -euo pipefail

cmdline="bench/operator_load.sh${*:+ $*}"
[ -n "${N:-}" ] && cmdline="N=$N $cmdline"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
build="${1:-${MESHWORK_BUILD_DIR:-$root/build}}"
njobs="${2:-${N:-500}}"
shift $(($# > 2 ? 2 : $#))
replicas_list=(1 2)
[ $# -gt 0 ] && replicas_list=("$@")
rows=()
for r in "${replicas_list[@]}"; do rows+=("${njobs}x$r"); done
if [ -n "${ROWS:-}" ]; then
  read -r -a rows <<<"$ROWS"
  cmdline="ROWS=\"$ROWS\" $cmdline"
fi
for row in "${rows[@]}"; do
  [[ "$row" =~ ^[1-9][0-9]*x[1-9][0-9]*$ ]] || { echo "ROWS: \"$row\" is not JOBSxPODS (e.g. 2000x1)" >&2; exit 2; }
done
timeout_s="${TIMEOUT_S:-900}"
pod_network="${POD_NETWORK:-none}"
out="$root/bench/results/operator_load.md"
command -v kubectl >/dev/null || { echo "kubectl is not installed (scripts/setup.sh)" >&2; exit 1; }

tmp="$(mktemp -d)"
cp_pid=""
op_pid=""
apply_pid=""
# Pod processes are the control plane's children, each its own process group (setsid). They
# carry PR_SET_PDEATHSIG too, but a group that outlives its leader's parent would escape that.
stop_all() {
  local children c
  bench_stop_pid "$apply_pid"
  bench_stop_pid "$op_pid"
  children=""
  if [ -n "$cp_pid" ]; then children="$(pgrep -P "$cp_pid" 2>/dev/null || true)"; fi
  bench_stop_pid "$cp_pid"
  for c in $children; do kill -KILL -- "-$c" 2>/dev/null || true; done
  apply_pid="" op_pid="" cp_pid=""
}
cleanup() {
  stop_all
  if [ -n "${KEEP_DIR:-}" ]; then
    mkdir -p "$KEEP_DIR"
    cp -r "$tmp"/run-* "$KEEP_DIR"/ 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Copies, so that a rebuild of $build during the run changes nothing.
mkdir -p "$tmp/bin"
cp -p "$build/controlplane/cluster/meshwork-cluster" "$build/controlplane/agent/meshwork-node-agent" \
  "$build/operator/meshwork-operator" "$tmp/bin/"
cp_bin="$tmp/bin/meshwork-cluster"
export PATH="$root/.meshwork/kube/bin:$PATH"  # kubectl of the cluster's release
op_bin="$tmp/bin/meshwork-operator"
# bin_line FILE: "name (built <mtime>, sha256 <12 hex>)", for the results: the build dir may be
# rebuilt from a working tree that is not the commit named in the results.
bin_line() { echo "\`$(basename "$1")\` (built $(date -u -r "$1" '+%H:%M:%S UTC'), sha256 $(sha256sum "$1" | cut -c1-12))"; }
binaries="$(bin_line "$cp_bin"), $(bin_line "$tmp/bin/meshwork-node-agent"), $(bin_line "$op_bin")"
export HOME="$tmp"  # kubectl's discovery cache

now() { date +%s.%N; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cpu_s() { bench_cpu_s "$@"; }
children_cpu_s() { bench_children_cpu_s "$@"; }
hwm_kib() { bench_hwm_kib "$@"; }
# The cluster's components: the supervisor's children (etcd, kube-apiserver, ...).
components() { pgrep -P "$cp_pid" 2>/dev/null || true; }
# cluster_cpu_s: user + system seconds of every component.
cluster_cpu_s() { local p t=0; for p in $(components); do t="$(awk -v a="$t" -v b="$(cpu_s "$p")" 'BEGIN {print a + b}')"; done; echo "$t"; }
# cluster_hwm_kib: the sum of the components' peak RSS.
cluster_hwm_kib() { local p t=0; for p in $(components); do t=$((t + $(hwm_kib "$p"))); done; echo "$t"; }
# agent_pid: the node agent, whose reaped children are the Pods' processes.
agent_pid() { pgrep -P "$cp_pid" -x meshwork-node-a | head -1; }

# jobs_yaml COUNT REPLICAS: COUNT TrainingJobs whose Pods run `true`, as one multi-document YAML.
jobs_yaml() {
  local i
  for i in $(seq -f '%04g' 1 "$1"); do
    cat <<EOF
---
apiVersion: meshwork.dev/v1alpha1
kind: TrainingJob
metadata:
  name: load-$i
  namespace: bench
spec:
  image: busybox
  device: cpu
  replicas: $2
  command: ["true"]
  metricsPort: 0
  config:
    inline: "model: {preset: tiny}"
EOF
  done
}

{
  echo "| control plane | jobs | Pods/job | apply returned | all Pods created | all Succeeded | reconciles | reconciles/s | errors (conflict/api/other) | Pods created/deleted | queue depth max | operator CPU | control plane CPU | Pods' CPU | operator peak RSS | control plane peak RSS |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
} >"$tmp/table.md"
: >"$tmp/details.md"
load_start="$(cut -d' ' -f1-3 /proc/loadavg)"

for row in "${rows[@]}"; do
  njobs="${row%x*}"
  r="${row#*x}"
  run="$tmp/run-$row"
  mkdir -p "$run"
  want_pods=$((njobs * r))
  export KUBECONFIG="$run/cp/kubeconfig"
  k() { kubectl --request-timeout=60s "$@"; }

  # ---- a fresh control plane, the CRD, a namespace, one operator
  bench_start_cluster "$run" "$cp_bin" "$tmp/bin/meshwork-node-agent" --pod-network "$pod_network" || exit 1
  port="$(free_port)"
  # One replica and no leader election: the lease renewals would only add writes to the store.
  "$op_bin" --kubeconfig "$KUBECONFIG" --leader-elect false --metrics-bind-address "127.0.0.1:$port" \
    >"$run/op.log" 2>&1 &
  op_pid=$!
  for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
  curl -sf "http://127.0.0.1:$port/readyz" >/dev/null || { cat "$run/op.log" >&2; exit 1; }
  jobs_yaml "$njobs" "$r" >"$run/jobs.yaml"
  op_cpu0="$(cpu_s "$op_pid")"
  cp_cpu0="$(cluster_cpu_s)"
  pods_cpu0="$(children_cpu_s "$(agent_pid)")"

  # ---- the burst. Progress is read every 0.5 s from the operator's /metrics (Pods created, jobs
  # Succeeded as the operator last wrote them): cheap, where a kubectl list of 1,500 objects takes
  # seconds on this machine and competes with what is measured. One kubectl list then confirms
  # each milestone from the API server.
  echo "[bench] $njobs TrainingJobs x $r Pods, one kubectl apply ($(wc -c <"$run/jobs.yaml") bytes of YAML)" >&2
  t0="$(now)"
  (k apply -f "$run/jobs.yaml" >"$run/apply.log" 2>&1; echo "$? $(now)" >"$run/apply.done") &
  apply_pid=$!
  t_pods="" t_pods_seen="" t_done="" t_done_seen="" depth_max=0 pods_metrics=""
  echo "t_s pods_created jobs_succeeded queue_depth op_cpu_s cp_cpu_s" >"$run/timeline.txt"
  while :; do
    metrics="$(curl -s --max-time 5 "http://127.0.0.1:$port/metrics" || true)"
    read -r n_pods n_ok depth <<<"$(awk '$1 == "meshwork_operator_pods_created_total" {p = $2}
      $1 == "meshwork_operator_jobs{phase=\"Succeeded\"}" {s = $2}
      $1 == "meshwork_operator_workqueue_depth" {d = $2}
      END {print int(p), int(s), int(d)}' <<<"$metrics")"
    ((depth > depth_max)) && depth_max=$depth
    t="$(awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')"
    echo "$t $n_pods $n_ok $depth $(awk -v a="$op_cpu0" -v b="$(cpu_s "$op_pid")" 'BEGIN {printf "%.1f", b - a}') $(awk -v a="$cp_cpu0" -v b="$(cluster_cpu_s)" 'BEGIN {printf "%.1f", b - a}')" >>"$run/timeline.txt"
    if [ -z "$t_pods" ] && ((n_pods >= want_pods)); then
      t_pods="$t"
      pods_metrics="$metrics"
    fi
    if [ -n "$t_pods" ] && [ -z "$t_pods_seen" ] &&
      (($(k get pods -n bench -l meshwork.dev/job -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}' 2>/dev/null | wc -l) >= want_pods)); then
      t_pods_seen="$(awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')"
    fi
    [ -z "$t_done" ] && ((n_ok >= njobs)) && t_done="$t"
    if [ -n "$t_done" ] && (($(k get tj -n bench -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' 2>/dev/null | grep -c '^Succeeded$') == njobs)); then
      t_done_seen="$(awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')"
      break
    fi
    if awk -v t="$t" -v l="$timeout_s" 'BEGIN {exit !(t > l)}'; then break; fi
    sleep 0.5
  done
  elapsed="$(awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')"
  curl -s "http://127.0.0.1:$port/metrics" >"$run/metrics.txt"
  op_cpu="$(awk -v a="$op_cpu0" -v b="$(cpu_s "$op_pid")" 'BEGIN {printf "%.1f", b - a}')"
  cp_cpu="$(awk -v a="$cp_cpu0" -v b="$(cluster_cpu_s)" 'BEGIN {printf "%.1f", b - a}')"
  pods_cpu="$(awk -v a="$pods_cpu0" -v b="$(children_cpu_s "$(agent_pid)")" 'BEGIN {printf "%.1f", b - a}')"
  op_hwm="$(hwm_kib "$op_pid")"
  cp_hwm="$(cluster_hwm_kib)"
  per_component="$(for p in $(components); do
    printf '%s %.1f s CPU, peak %.0f MiB; ' "$(cat "/proc/$p/comm")" "$(cpu_s "$p")" "$(($(hwm_kib "$p") / 1024))"
  done)"
  for _ in $(seq 1 600); do [ -s "$run/apply.done" ] && break; sleep 0.5; done
  read -r apply_rc apply_end <"$run/apply.done" || { apply_rc="?"; apply_end=""; }
  t_apply="$( [ -n "$apply_end" ] && awk -v a="$t0" -v b="$apply_end" 'BEGIN {printf "%.1f s", b - a}' || echo "did not return")"
  apply_pid=""
  # Evidence for the notes, while everything is still up.
  k get tj -n bench -o jsonpath='{range .items[*]}{.metadata.name} {.status.phase} {.metadata.creationTimestamp} {.status.completionTime}{"\n"}{end}' >"$run/jobs.txt" 2>&1 || true
  n_events="$(k get events -n bench -o name 2>/dev/null | wc -l)"
  store_kib="$(du -sk "$run/cp/etcd" | cut -f1)"
  agent_kib="$(du -sk "$run/cp/agent" 2>/dev/null | cut -f1 || echo 0)"
  for task in /proc/"$cp_pid"/task/*; do
    echo "cp $(cat "$task/comm") $(awk -v hz="$(getconf CLK_TCK)" '{sub(/.*\) /, ""); print ($12 + $13) / hz}' "$task/stat")"
  done >"$run/threads.txt" 2>/dev/null || true
  for task in /proc/"$op_pid"/task/*; do
    echo "op $(cat "$task/comm") $(awk -v hz="$(getconf CLK_TCK)" '{sub(/.*\) /, ""); print ($12 + $13) / hz}' "$task/stat")"
  done >>"$run/threads.txt" 2>/dev/null || true
  pods_by_phase="$(k get pods -n bench -o jsonpath='{range .items[*]}{.status.phase}/{.spec.nodeName}{"\n"}{end}' 2>/dev/null |
    sed 's|/$|/unscheduled|; s|/local$||' | sort | uniq -c | awk '{printf "%s%s %s", (NR > 1 ? ", " : ""), $2, $1}')"
  stuck="$(awk '$2 != "Succeeded" {print $1 "(" ($2 == "" ? "no phase" : $2) ")"}' "$run/jobs.txt" | head -n 20 | xargs)"
  # kube-apiserver's own request latency histogram, every client's requests since it started.
  api_port="$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["apiserver"])' "$run/cp/ports.json")"
  curl -s --max-time 30 --cacert "$run/cp/pki/ca.crt" --cert "$run/cp/pki/admin.crt" --key "$run/cp/pki/admin.key" \
    "https://127.0.0.1:$api_port/metrics" >"$run/apiserver-metrics.txt" || true
  api_latency="$(python3 "$root/bench/apiserver_latency.py" "$run/apiserver-metrics.txt" 2>&1)"
  stop_all

  python3 - "$run/metrics.txt" "$njobs" "$r" "$t_apply" "${t_pods:-}" "${t_done:-}" "$elapsed" "$depth_max" \
    "$op_cpu" "$cp_cpu" "$pods_cpu" "$op_hwm" "$cp_hwm" "$pod_network" "$(git -C "$root" rev-parse --short HEAD)" \
    >>"$tmp/table.md" <<'PY'
import re, sys
m, jobs, r, t_apply, t_pods, t_done, elapsed, depth, op_cpu, cp_cpu, pods_cpu, op_hwm, cp_hwm, net, commit = sys.argv[1:]
vals = {}
for line in open(m):
    mm = re.match(r'^(\w+)(\{[^}]*\})? ([0-9.e+-]+)$', line.strip())
    if mm: vals[mm.group(1) + (mm.group(2) or "")] = float(mm.group(3))
def v(name): return int(vals.get(name, 0))
rec = sum(x for k, x in vals.items() if k.startswith("meshwork_operator_reconcile_total{"))
err = "/".join(str(v('meshwork_operator_reconcile_errors_total{reason="%s"}' % x)) for x in ("conflict", "api", "other"))
span = float(t_done or elapsed)
cell = lambda t: f"{float(t):.1f} s" if t else f"not after {float(elapsed):.0f} s"
print(f"| meshwork-cluster (kube 1.37.2, Pod network {net}, {commit}) | {jobs} | {r} | {t_apply} | {cell(t_pods)} | {cell(t_done)} | {rec:.0f} | {rec / span:.1f} | {err} | "
      f"{v('meshwork_operator_pods_created_total')}/{v('meshwork_operator_pods_deleted_total')} | {depth} | "
      f"{op_cpu} s | {cp_cpu} s | {float(pods_cpu):.1f} s | {int(op_hwm) / 1024:.1f} MiB | {int(cp_hwm) / 1024:.1f} MiB |")
PY

  {
    echo "### $njobs jobs x $r Pods"
    echo
    echo "- apply: exit $apply_rc, $(grep -c ' created$' "$run/apply.log" || true) created; $(grep -v ' created$' "$run/apply.log" | head -n 3 | tr '\n' ' ')"
    echo "- milestones confirmed by a kubectl list at: all Pods ${t_pods_seen:-never} s, all Succeeded ${t_done_seen:-never} s"
    echo "- Pods by phase at the end: $pods_by_phase"
    echo "- jobs by phase at the end: $(awk '{print ($2 == "" ? "none" : $2)}' "$run/jobs.txt" | sort | uniq -c | awk '{printf "%s %s, ", $2, $1}' | sed 's/, $//')"
    [ -n "$stuck" ] && echo "- not Succeeded (first 20): $stuck"
    echo "- completionTime - creationTimestamp (seconds resolution): $(python3 - "$run/jobs.txt" <<'PY'
import sys, datetime
def t(s): return datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").timestamp()
rows = [l.split() for l in open(sys.argv[1]) if len(l.split()) == 4]
if not rows: print("no finished job"); sys.exit()
d = sorted(t(c) - t(a) for _, _, a, c in rows)
first = min(t(a) for _, _, a, _ in rows)
print(f"p50 {d[len(d) // 2]:.0f} s, max {d[-1]:.0f} s; last completion {max(t(c) for *_, c in rows) - first:.0f} s after the first create")
PY
)"
    echo "- reconcile duration: $(awk '/^meshwork_operator_reconcile_duration_seconds_sum/ {s = $2} /^meshwork_operator_reconcile_duration_seconds_count/ {c = $2} END {if (c) printf "mean %.1f ms over %d", 1000 * s / c, c}' "$run/metrics.txt"); work-queue adds $(awk '$1 == "meshwork_operator_workqueue_adds_total" {print int($2)}' "$run/metrics.txt"), retries $(awk '$1 == "meshwork_operator_workqueue_retries_total" {print int($2)}' "$run/metrics.txt"); queue wait mean $(awk '/^meshwork_operator_workqueue_queue_duration_seconds_sum/ {s = $2} /^meshwork_operator_workqueue_queue_duration_seconds_count/ {c = $2} END {if (c) printf "%.2f s", s / c}' "$run/metrics.txt")"
    if [ -n "$pods_metrics" ]; then
      echo "- reconciles when the last Pod appeared: $(awk '/^meshwork_operator_reconcile_total\{/ {s += $2} END {print s + 0}' <<<"$pods_metrics")"
    fi
    echo "- errors by reason: $(sed -nE 's/^meshwork_operator_reconcile_errors_total\{reason="([a-z_]+)"\} ([0-9.e+]+)$/\1 \2/p' "$run/metrics.txt" | awk '{printf "%s%s %d", (NR > 1 ? ", " : ""), $1, $2}')"
    echo "- operator log: $(wc -l <"$run/op.log") lines, $(grep -c 'reconcile ' "$run/op.log" || true) reconcile lines, $(grep -c 'events: ' "$run/op.log" || true) from the event recorder$(grep -m1 'events: ' "$run/op.log" | cut -c1-160 | sed 's/^/ (first: /; s/$/)/' || true); first error line: $(grep -m1 -iE 'error|fail|conflict' "$run/op.log" | cut -c1-200 || echo none)"
    echo "- control plane log: $(wc -l <"$run/cp.log") lines$( [ "$(wc -l <"$run/cp.log")" -gt 1 ] && echo ": $(grep -v 'serving on' "$run/cp.log" | head -n 2 | cut -c1-200 | tr '\n' ' ')")"
    echo "- kube-apiserver request latency (apiserver_request_duration_seconds, all clients, since its start; p50/p99 interpolated within buckets): $api_latency"
    echo "- events in namespace bench: $n_events; etcd $((store_kib / 1024)) MiB, agent dir (Pod logs, hosts files) $((agent_kib / 1024)) MiB"
    echo "- components since their start (CPU) and peak RSS: $per_component"
    echo "- timeline (s since the apply; operator metrics: Pods created, jobs Succeeded, queue depth; CPU seconds since the apply), one line per 10 s:"
    echo
    echo '```'
    awk 'BEGIN {last = -1} NR == 1 {print; next} int($1 / 10) != last {print; last = int($1 / 10)} END {print}' "$run/timeline.txt" | uniq
    echo '```'
    echo
  } >>"$tmp/details.md"
done
load_end="$(cut -d' ' -f1-3 /proc/loadavg)"
# The home-made server's rows from the results this replaces, kept for comparison (rows of the
# old format get the control plane column).
bench_home_made_rows "$out" 15 >"$tmp/home.md"

{
  echo "# meshwork-operator under a burst of TrainingJobs"
  echo
  bench_command_line "$cmdline" "$root"
  echo
  echo "Machine: $(bench_machine), $(free -g | awk '/^Mem:/ {print $2}') GiB memory; the cores are shared with other"
  echo "engineers' builds: load average (1/5/15 min) $load_start at the start, $load_end at the end."
  echo "Binaries, copied from \`$build\` at the start: $binaries."
  echo "A fresh meshwork-cluster (kube-apiserver, etcd, controller-manager, scheduler, node agent"
  echo "with one node \`local\`; control plane CPU and peak RSS are summed over them) per row, one"
  echo "meshwork-operator (\`--leader-elect false\`, 4 workers), both on this machine. All jobs are"
  echo "applied by one \`kubectl apply -f\` of a multi-document YAML (kubectl sends a GET and a POST"
  echo "per object, one after another); each job runs \`command: [\"true\"]\`, \`device: cpu\`, no"
  echo "resource requests, \`metricsPort: 0\`. Times are from the start of the apply; \"all Pods"
  echo "created\" and \"all Succeeded\" are read every 0.5 s from the operator's \`/metrics\`"
  echo "(\`pods_created_total\`, \`jobs{phase=\"Succeeded\"}\`) and then confirmed by a kubectl list"
  echo "(Details). Reconciles are \`meshwork_operator_reconcile_total\` summed over \`result\`, per"
  echo "second of the time to all Succeeded; CPU is user + system seconds from the apply to the end;"
  echo "\"Pods' CPU\" is the reaped Pod processes'. Peak RSS is VmHWM."
  echo
  cat "$tmp/table.md"
  cat "$tmp/home.md"
  echo
  echo "The home-made rows are the retired meshwork-controlplane's (one process: API server, store with"
  echo "fsync per write, scheduler and node agent) last measurement, from the results this run replaced."
  echo
  echo "## Details"
  echo
  cat "$tmp/details.md"
} >"$tmp/result.md"
mkdir -p "$(dirname "$out")"
cp "$tmp/result.md" "$out"
cat "$out"
