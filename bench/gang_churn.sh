#!/usr/bin/env bash
# Gang churn (issue 20): N small training jobs (default 30) applied at once to a one-node local
# cluster with room for one of them at a time (2 CPUs; 2 Pods x 1 CPU per job), once per gang
# admission mode. Each trainer waits at most 30 s for its peer at the rendezvous and each job may
# restart 3 times. Placed one Pod at a time (gangAdmission None), rank 0 of one job and rank 0 of
# another can hold the node between them and both wait out the timeout: a spurious restart. With
# Operator (the scheduling gate) or PodGroup (kube-scheduler's gang scheduling) a gang is placed
# whole or not at all. Per mode: wall time from the apply until every job finished, jobs
# Succeeded/Failed, and restarts summed over the jobs.
# Writes bench/results/gang_churn.md. Needs a build and the kube binaries (scripts/setup.sh).
# usage: bench/gang_churn.sh [build-dir]     N=30 MODES="None Operator PodGroup" STEPS=30
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-${MESHWORK_BUILD_DIR:-$root/build}}"
njobs="${N:-30}"
read -r -a modes <<<"${MODES:-None Operator PodGroup}"
steps="${STEPS:-30}"
timeout_s="${TIMEOUT_S:-1500}"
out="$root/bench/results/gang_churn.md"
cmdline="bench/gang_churn.sh${1:+ $1}"
[ -n "${N:-}" ] && cmdline="N=$N $cmdline"
[ -n "${MODES:-}" ] && cmdline="MODES=\"$MODES\" $cmdline"
export MESHWORK_KUBE_BIN="${MESHWORK_KUBE_BIN:-$root/.meshwork/kube/bin}"
source "$root/tests/common/e2e_lib.sh"
e2e_require_kube_bin
e2e_init
export PATH="$build/trainer:$PATH"
k() { timeout 60 kubectl --request-timeout=30s "$@"; }

cat >"$work/nodes.yaml" <<'EOF'
nodes:
- {name: node-a, cpu: "2", memory: 16Gi}
EOF
e2e_start_controlplane "$build/controlplane/cluster/meshwork-cluster" --nodes "$work/nodes.yaml" || exit 1
e2e_apply_crd "$root" || { echo "the CRDs did not apply" >&2; exit 1; }
mkdir -p "$work/data"
meshwork-train prepare-data --out "$work/data/train.bin" "$root/README.md" "$root/docs" >/dev/null || exit 1
port="$(free_port)"
"$build/operator/meshwork-operator" --kubeconfig "$KUBECONFIG" --metrics-bind-address "127.0.0.1:$port" \
  --leader-elect false --report-interval-s 2 --pod-delete-grace-s 5 >>"$work/op.log" 2>&1 &
e2e_track $!

# job NS NAME MASTER_PORT MODE
job() {
  cat <<EOF
---
apiVersion: meshwork.dev/v1alpha1
kind: TrainingJob
metadata: {name: $2, namespace: $1}
spec:
  image: meshwork/trainer:bench
  device: cpu
  replicas: 2
  masterPort: $3
  metricsPort: $(($3 + 1))
  resources: {requests: {cpu: "1"}}
  runPolicy: {backoffLimit: 3, schedulingPolicy: {gangAdmission: $4}}
  config:
    inline: |
      model: {preset: tiny}
      data: {train: $work/data/train.bin, seq_len: 32, batch_size: 2}
      schedule: {steps: $steps, warmup_steps: 2}
      logging: {every: 10}
      dist: {timeout_seconds: 30}
EOF
}

rows=()
for mode in "${modes[@]}"; do
  ns="churn-$(tr 'A-Z' 'a-z' <<<"$mode")"
  k create namespace "$ns" >/dev/null
  { for i in $(seq "$njobs"); do job "$ns" "job-$i" $((40000 + 10 * i)) "$mode"; done; } >"$work/$ns.yaml"
  start=$(date +%s.%N)
  k apply -f "$work/$ns.yaml" >/dev/null || { echo "apply failed ($mode)" >&2; exit 1; }
  finished=0
  while :; do
    phases="$(k -n "$ns" get tj -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' 2>/dev/null)"
    finished="$(grep -cE '^(Succeeded|Failed)$' <<<"$phases")"
    [ "$finished" -ge "$njobs" ] && break
    if (($(date +%s) - ${start%.*} > timeout_s)); then echo "$mode: timed out with $finished of $njobs finished" >&2; break; fi
    sleep 1
  done
  wall="$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.0f", b - a}')"
  table="$(k -n "$ns" get tj -o jsonpath='{range .items[*]}{.status.phase}{" "}{.status.restarts}{"\n"}{end}')"
  succeeded="$(awk '$1 == "Succeeded"' <<<"$table" | wc -l)"
  failed="$(awk '$1 == "Failed"' <<<"$table" | wc -l)"
  restarts="$(awk '{s += $2} END {print s + 0}' <<<"$table")"
  with_restarts="$(awk '$2 > 0' <<<"$table" | wc -l)"
  echo "$mode: $succeeded Succeeded, $failed Failed, $restarts restarts ($with_restarts jobs) in $wall s"
  rows+=("| $mode | $njobs | ${wall} s | $succeeded | $failed | $restarts | $with_restarts |")
  k delete namespace "$ns" --wait=false >/dev/null
  e2e_wait_for 120 "the $ns Pods gone" bash -c "[ -z \"\$(kubectl -n $ns get pods -o name 2>/dev/null)\" ]" >/dev/null
done

{
  echo "# Gang churn: $njobs two-Pod jobs at once on one 2-CPU node"
  echo
  echo "Command: \`$cmdline\` ($(date -u +%Y-%m-%d), commit $(git -C "$root" rev-parse --short HEAD))"
  echo
  echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'). The local cluster"
  echo "(meshwork-cluster: kube-apiserver, etcd, controller manager and kube-scheduler 1.37 with"
  echo "GenericWorkload on, one node agent) with one Node of 2 CPUs, and one meshwork-operator. Each job:"
  echo "2 Pods x 1 CPU request (so one job fits at a time), the tiny model for $steps steps, a 30 s rendezvous"
  echo "timeout (\`dist.timeout_seconds\`), \`backoffLimit: 3\`. All $njobs jobs in one \`kubectl apply\`; one"
  echo "mode after the other on the same cluster. Restarts: \`status.restarts\` summed over the jobs: every one"
  echo "is spurious here (the trainers never fail on their own), a gang that timed out waiting for its"
  echo "other half."
  echo
  echo "| gangAdmission | jobs | wall time | Succeeded | Failed | restarts | jobs with restarts |"
  echo "| --- | --- | --- | --- | --- | --- | --- |"
  printf '%s\n' "${rows[@]}"
} >"$out"
cat "$out"
