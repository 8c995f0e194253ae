#!/usr/bin/env bash
# TrainingJobs beside Kubernetes' own Job controller (issue 48): the same N gangs of P Pods each,
# once as TrainingJobs (meshwork-operator, its defaults: gang admission behind a scheduling gate,
# a headless Service, a ConfigMap and a rendezvous Secret per job) and once as Indexed Jobs
# (batch/v1, completionMode Indexed, completions = parallelism = P, run by kube-controller-manager's
# Job controller), every Pod running `true` with no resource requests, each run on a fresh local
# cluster (meshwork-cluster: the real kube-apiserver, etcd, controller-manager and scheduler, and
# the node agent). The kinds alternate within each round (tj job tj job ...) for REPEATS rounds.
#
# Both kinds are timed alike, from the API server's side: two watches started before the apply
# (`kubectl get --watch-only`, each line stamped as it arrives) see every Pod ADDED and every job
# finish (a TrainingJob's phase Succeeded, a Job's Complete condition); "all Pods created" is the
# arrival of the last Pod's ADDED event, "all finished" the last job's. API requests per job are
# kube-apiserver's apiserver_request_total over the run (every client: kubectl's apply, the
# controllers, the scheduler, the node agent) over N. CPU is user + system seconds over the run
# of the controller (meshwork-operator, or kube-controller-manager) and of the whole control plane.
#
# Writes bench/results/operator_vs_job.md (earlier results kept below) and the per-run records
# under bench/results/raw/operator_vs_job/.
# usage: bench/operator_vs_job.sh [build-dir]
#   ROWS (default "500x1 500x4"): JOBSxPODS_PER_JOB; REPEATS (default 5): rounds; TIMEOUT_S (900).
#   PEER_QPS: also run the Indexed Jobs with kube-controller-manager's client rate limit raised to
#   this many requests/s (--kube-api-qps, burst twice that; its default is 20, burst 30), as a
#   third kind, "job-qpsN": the Job controller's own speed apart from its client's throttle.
#   SKIP: ROWxKIND pairs not to run, e.g. "2000x1:job" (the throttled Job controller at 2,000 jobs
#   takes 10 minutes a run, and its rate is its client's limit); the table leaves their rows out.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
# shellcheck source=tests/common/free_port.sh
source "$root/tests/common/free_port.sh"
build="${1:-${MESHWORK_BUILD_DIR:-$root/build}}"
read -r -a rows <<<"${ROWS:-500x1 500x4}"
repeats="${REPEATS:-5}"
timeout_s="${TIMEOUT_S:-900}"
[[ $repeats =~ ^[1-9][0-9]*$ ]] || { echo "REPEATS '$repeats': expected a positive integer" >&2; exit 2; }
kinds=(tj job)
if [ -n "${PEER_QPS:-}" ]; then
  [[ $PEER_QPS =~ ^[1-9][0-9]*$ ]] || { echo "PEER_QPS '$PEER_QPS': expected a positive integer" >&2; exit 2; }
  kinds+=("job-qps$PEER_QPS")
fi
for row in "${rows[@]}"; do
  [[ "$row" =~ ^[1-9][0-9]*x[1-9][0-9]*$ ]] || { echo "ROWS: \"$row\" is not JOBSxPODS (e.g. 500x4)" >&2; exit 2; }
done
command -v kubectl >/dev/null || { echo "kubectl is not installed (scripts/setup.sh)" >&2; exit 1; }
out="$root/bench/results/operator_vs_job.md"
raw="$root/bench/results/raw/operator_vs_job/$(date -u +%Y%m%d-%H%M%S)"

tmp="$(mktemp -d)"
pids=()
cp_pid=""
stop_all() {
  local p children=""
  for p in "${pids[@]}"; do bench_stop_pid "$p"; done
  pids=()
  if [ -n "$cp_pid" ]; then children="$(pgrep -P "$cp_pid" 2>/dev/null || true)"; fi
  bench_stop_pid "$cp_pid"
  for p in $children; do kill -KILL -- "-$p" 2>/dev/null || true; done
  cp_pid=""
}
trap 'stop_all; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

mkdir -p "$tmp/bin"
cp -p "$build/controlplane/cluster/meshwork-cluster" "$build/controlplane/agent/meshwork-node-agent" \
  "$build/operator/meshwork-operator" "$tmp/bin/"
export PATH="$root/.meshwork/kube/bin:$PATH"  # kubectl of the cluster's release
export HOME="$tmp"
now() { date +%s.%N; }
component() { pgrep -P "$cp_pid" -x "$1" | head -1; }
cluster_cpu_s() {
  local p t=0
  for p in $(pgrep -P "$cp_pid"); do t="$(awk -v a="$t" -v b="$(bench_cpu_s "$p")" 'BEGIN {print a + b}')"; done
  echo "$t"
}
# components_cpu: "NAME SECONDS" for each control-plane process and the operator, if one runs.
components_cpu() {
  local p
  for p in $(pgrep -P "$cp_pid") ${1:-}; do echo "$(cat "/proc/$p/comm") $(bench_cpu_s "$p")"; done
}
# requests_by_kind: "VERB RESOURCE[/SUBRESOURCE] COUNT" from apiserver_request_total, summed over
# the other labels (clients, codes, scopes).
requests_by_kind() {
  local port
  port="$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["apiserver"])' "$cp_dir/ports.json")"
  curl -s --max-time 30 --cacert "$cp_dir/pki/ca.crt" --cert "$cp_dir/pki/admin.crt" --key "$cp_dir/pki/admin.key" \
    "https://127.0.0.1:$port/metrics" | awk '/^apiserver_request_total\{/ {
      v = r = s = ""
      if (match($0, /verb="[^"]*"/)) v = substr($0, RSTART + 6, RLENGTH - 7)
      if (match($0, /resource="[^"]*"/)) r = substr($0, RSTART + 10, RLENGTH - 11)
      if (match($0, /subresource="[^"]*"/)) s = substr($0, RSTART + 13, RLENGTH - 14)
      n[v " " r (s == "" ? "" : "/" s)] += $NF
    } END {for (k in n) print k, n[k]}'
}
# delta BEFORE AFTER: AFTER's last column minus BEFORE's, by the other columns, largest first.
delta() {
  awk 'NR == FNR {k = $0; sub(/ [^ ]*$/, "", k); b[k] = $NF; next}
       {k = $0; sub(/ [^ ]*$/, "", k); d = $NF - b[k]; if (d != 0) printf "%s %.1f\n", k, d}' "$1" "$2" | sort -k3 -n -r -t' '
}
# api_requests: apiserver_request_total summed over every label (all clients, verbs, codes).
api_requests() {
  local port
  port="$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["apiserver"])' "$cp_dir/ports.json")"
  curl -s --max-time 30 --cacert "$cp_dir/pki/ca.crt" --cert "$cp_dir/pki/admin.crt" --key "$cp_dir/pki/admin.key" \
    "https://127.0.0.1:$port/metrics" | awk '/^apiserver_request_total\{/ {s += $NF} END {printf "%d", s}'
}

# manifests KIND COUNT PODS: the multi-document YAML of COUNT jobs of PODS Pods each.
manifests() {
  local kind=$1 i
  for i in $(seq -f '%04g' 1 "$2"); do
    if [ "$kind" = tj ]; then
      printf -- '---\napiVersion: meshwork.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: load-%s, namespace: bench}\n' "$i"
      printf 'spec:\n  image: busybox\n  device: cpu\n  replicas: %s\n  command: ["true"]\n  metricsPort: 0\n' "$3"
      printf '  config: {inline: "model: {preset: tiny}"}\n'
    else
      printf -- '---\napiVersion: batch/v1\nkind: Job\nmetadata: {name: load-%s, namespace: bench}\n' "$i"
      printf 'spec:\n  completionMode: Indexed\n  completions: %s\n  parallelism: %s\n  backoffLimit: 0\n' "$3" "$3"
      printf '  template:\n    spec:\n      restartPolicy: Never\n'
      printf '      containers: [{name: trainer, image: busybox, command: ["true"]}]\n'
    fi
  done
}

# stamp FILE: each line of stdin into FILE, after the seconds since the epoch it arrived at.
stamp() { while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done >"$1"; }

echo "kind jobs pods_per_job repeat pods_created_s finished_s api_requests controller_cpu_s controller_peak_mib cluster_cpu_s status" \
  >"$tmp/runs.txt"
# one KIND ROW REPEAT: a run on a fresh cluster; a line of runs.txt.
one() {
  local kind=$1 row=$2 rep=$3 njobs pods run ctl_pid ctl_cpu0 cp_cpu0 req0 t0 n_pods n_done t status
  njobs="${row%x*}"
  pods="${row#*x}"
  run="$tmp/$row-$kind-$rep"
  cp_dir="$run/cp"
  mkdir -p "$run"
  export KUBECONFIG="$cp_dir/kubeconfig"
  local kcm_args=()
  if [[ $kind == job-qps* ]]; then
    kcm_args=(--controller-manager-arg "--kube-api-qps=${kind#job-qps}" --controller-manager-arg "--kube-api-burst=$((2 * ${kind#job-qps}))")
  fi
  bench_start_cluster "$run" "$tmp/bin/meshwork-cluster" "$tmp/bin/meshwork-node-agent" --pod-network none \
    "${kcm_args[@]}" || return 1
  if [ "$kind" = tj ]; then
    local port
    port="$(free_port)"
    "$tmp/bin/meshwork-operator" --kubeconfig "$KUBECONFIG" --leader-elect false \
      --metrics-bind-address "127.0.0.1:$port" >"$run/op.log" 2>&1 &
    ctl_pid=$!
    pids+=("$ctl_pid")
    for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
  else
    ctl_pid="$(component kube-controller)"
  fi
  manifests "$kind" "$njobs" "$pods" >"$run/jobs.yaml"
  # The watches write through process substitutions, so that $! is kubectl's own pid: stopping
  # it ends the stamping too (a pipeline's wait would wait for a watch that never ends).
  kubectl get pods -n bench --watch-only --output-watch-events -o jsonpath='{.type} {.object.metadata.name}{"\n"}' \
    2>"$run/watch-pods.err" > >(stamp "$run/pods.watch") &
  pids+=($!)
  if [ "$kind" = tj ]; then
    kubectl get tj -n bench --watch-only -o jsonpath='{.metadata.name} {.status.phase}{"\n"}' 2>"$run/watch-jobs.err" \
      > >(stamp "$run/jobs.watch") &
  else
    kubectl get jobs.batch -n bench --watch-only -o jsonpath='{.metadata.name} {.status.conditions[?(@.type=="Complete")].status}{"\n"}' \
      2>"$run/watch-jobs.err" > >(stamp "$run/jobs.watch") &
  fi
  pids+=($!)
  sleep 1
  ctl_cpu0="$(bench_cpu_s "$ctl_pid")"
  cp_cpu0="$(cluster_cpu_s)"
  req0="$(api_requests)"
  local op_pid=""
  [ "$kind" = tj ] && op_pid="$ctl_pid"
  components_cpu "$op_pid" >"$run/cpu.0"
  requests_by_kind >"$run/requests.0"
  echo "[bench] $kind $row, round $rep" >&2
  t0="$EPOCHREALTIME"
  kubectl apply -f "$run/jobs.yaml" >"$run/apply.log" 2>&1 &
  pids+=($!)
  local done_word=Succeeded
  [[ $kind == job* ]] && done_word=True
  status=ok
  while :; do
    n_done="$(awk -v w="$done_word" '$3 == w {print $2}' "$run/jobs.watch" | sort -u | wc -l)"
    ((n_done >= njobs)) && break
    t="$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%d", b - a}')"
    if ((t > timeout_s)); then status="timeout after ${timeout_s} s: $n_done of $njobs finished"; break; fi
    sleep 0.5
  done
  local req ctl_cpu cp_cpu hwm t_pods t_done
  req=$(($(api_requests) - req0))
  components_cpu "$op_pid" >"$run/cpu.1"
  requests_by_kind >"$run/requests.1"
  delta "$run/cpu.0" "$run/cpu.1" >"$run/cpu.txt"
  delta "$run/requests.0" "$run/requests.1" >"$run/requests.txt"
  ctl_cpu="$(awk -v a="$ctl_cpu0" -v b="$(bench_cpu_s "$ctl_pid")" 'BEGIN {printf "%.1f", b - a}')"
  cp_cpu="$(awk -v a="$cp_cpu0" -v b="$(cluster_cpu_s)" 'BEGIN {printf "%.1f", b - a}')"
  hwm="$(( $(bench_hwm_kib "$ctl_pid") / 1024 ))"
  # The last of the unique Pods' ADDED lines and of the finished jobs' lines, from the apply.
  n_pods="$(awk '$2 == "ADDED" {print $3}' "$run/pods.watch" | sort -u | wc -l)"
  t_pods="$(awk -v t0="$t0" -v want=$((njobs * pods)) '$2 == "ADDED" && !seen[$3]++ {n++; if (n == want) {printf "%.1f", $1 - t0; exit}}' "$run/pods.watch")"
  t_done="$(awk -v t0="$t0" -v want="$njobs" -v w="$done_word" '$3 == w && !seen[$2]++ {n++; if (n == want) {printf "%.1f", $1 - t0; exit}}' "$run/jobs.watch")"
  [ -n "$t_pods" ] || status="only $n_pods of $((njobs * pods)) Pods seen${status:+; $status}"
  echo "$kind $njobs $pods $rep ${t_pods:--} ${t_done:--} $req $ctl_cpu $hwm $cp_cpu $(tr ' ' _ <<<"$status")" >>"$tmp/runs.txt"
  stop_all
  mkdir -p "$raw/$row-$kind-$rep"
  cp "$run/pods.watch" "$run/jobs.watch" "$run/apply.log" "$run/cpu.txt" "$run/requests.txt" "$raw/$row-$kind-$rep/" 2>/dev/null || true
  gzip -q "$raw/$row-$kind-$rep/"*.watch || true
  [ "$kind" = tj ] && tail -n 20 "$run/op.log" >"$raw/$row-$kind-$rep/op.log.tail"
  rm -rf "$run"
}

load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
for row in "${rows[@]}"; do
  for ((rep = 1; rep <= repeats; rep++)); do
    for kind in "${kinds[@]}"; do
      [[ " ${SKIP:-} " == *" $row:$kind "* ]] && continue
      one "$kind" "$row" "$rep" || echo "[bench] $kind $row round $rep failed" >&2
    done
  done
done
load_end="$(cut -d' ' -f1-3 /proc/loadavg)"
mkdir -p "$raw"
cp "$tmp/runs.txt" "$raw/runs.txt"

{
  echo "# TrainingJobs beside Kubernetes' Job controller ($repeats interleaved round(s) a row$( ((repeats < 5)) && echo ", FEWER than the protocol's 5"))"
  echo
  bench_command_line "bench/operator_vs_job.sh" "$root" ROWS REPEATS TIMEOUT_S PEER_QPS SKIP
  echo
  echo "Machine: $(bench_machine); load average $load_start at the start, $load_end at the end."
  echo "Each run: a fresh meshwork-cluster (one node), the jobs applied by one \`kubectl apply -f\`, Pods"
  echo "running \`true\` with no requests; TrainingJobs with meshwork-operator's defaults, Indexed Jobs"
  echo "with completions = parallelism = Pods a job. Times from the apply, from watches of Pods and jobs"
  echo "started before it; median [min, max] over the rounds. Pods/s: Pods over the time to all Pods"
  echo "created. Controller CPU: meshwork-operator, or kube-controller-manager (all its controllers)."
  echo "Client rate limits: kube-controller-manager's client is limited to 20 requests/s, burst 30"
  echo "(its defaults; the Job controller has its own client, --use-service-account-credentials);"
  echo "meshwork-operator's client has no rate limit. Rows \"Indexed Job (kube-api-qps N)\" raise it."
  echo "Per-run records: \`${raw#"$root/"}/runs.txt\`, with each run's watch lines, CPU seconds by"
  echo "process (cpu.txt) and API requests by verb and resource (requests.txt)."
  echo
  python3 "$root/bench/operator_vs_job_table.py" "$tmp/runs.txt"
  echo
  bench_earlier_results "$out"
} >"$tmp/result.md"
mkdir -p "$(dirname "$out")"
cp "$tmp/result.md" "$out"
cat "$out"
