#!/usr/bin/env bash
# Debian's real Prometheus server against real TrainingJobs on the local cluster: it
# scrapes the trainer Pods (discovered from the Pod list, relabelled as kubernetes_sd would be)
# and the operator, and every query of metrics/dashboards/*.json (panel targets and query
# variables, with Grafana's variables substituted) must return data:
#   - while a 2-Pod job trains: both dashboards, per-rank panels with one series per rank,
#     rates above 0, every metric name the dashboards use present in the live scrape
#   - once a second, short job has succeeded: the operator dashboard again, the job counted in
#     phase Succeeded
# The first job's steps are effectively unbounded and it is deleted after the checks: on a
# shared machine a step takes 0.1 s to 1 s, so no fixed step count both lasts long enough to
# be scraped and ends soon enough; the short job's 20 steps do.
# docs/metrics.md ("Prometheus end to end") has the scrape config this uses.
# usage: prometheus_e2e.sh CONTROLPLANE OPERATOR TRAIN SOURCE_DIR
set -uo pipefail

abs() { (cd "$(dirname "$1")" && echo "$PWD/$(basename "$1")"); }
cp_bin="$(abs "$1")"
op_bin="$(abs "$2")"
train_bin="$(abs "$3")"
src="$(cd "$4" && pwd)"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
prometheus_bin="$(command -v prometheus || true)"
if [ -z "$prometheus_bin" ]; then
  echo "FAIL: prometheus is not installed (Debian's 'prometheus' package); run scripts/setup.sh"
  exit 1
fi
for tool in kubectl curl python3; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool is not installed; run scripts/setup.sh"; exit 1; }
done
# shellcheck source=tests/common/e2e_lib.sh
source "$src/tests/common/e2e_lib.sh"
e2e_init
PATH="$(dirname "$train_bin"):$PATH"  # the Pods run meshwork-train from PATH
export PATH

ns="prom-e2e"
name=scraped      # trains until deleted
short=short       # 20 steps, to Succeeded
world=2
scrape_s=1
prom=""
k() { timeout 60 kubectl --request-timeout=30s -n "$ns" "$@"; }
jp() { k get tj "$1" -o jsonpath="$2" 2>/dev/null; }
phase_is() { [ "$(jp "$1" '{.status.phase}')" = "$2" ]; }
dump() {
  echo "---- kubectl get tj,pods"; k get tj,pods -o wide 2>&1
  [ -n "$prom" ] && { echo "---- Prometheus targets"; curl -s "$prom/api/v1/targets" | cut -c 1-3000; echo; }
  echo "---- operator log"; tail -n 20 "$work/operator.log" 2>&1
  echo "---- prometheus log"; tail -n 20 "$work/prometheus.log" 2>&1
  local p
  for p in $(k get pods -o name 2>/dev/null); do echo "---- $p log"; k logs "$p" 2>&1 | tail -n 10; done
}
die() { echo "FAIL: $1"; dump; exit 1; }
started=$SECONDS

# ---- data, control plane, CRD, operator
mkdir -p "$work/data"
"$train_bin" prepare-data --out "$work/data/train.bin" --val-out "$work/data/val.bin" "$src/README.md" "$src/docs" \
  >/dev/null || die "prepare-data"
e2e_start_controlplane "$cp_bin" || die "the control plane did not start"
e2e_apply_crd "$src" || die "the TrainingJob CRD did not apply"
kubectl create namespace "$ns" >/dev/null || die "create namespace $ns"
op_port="$(free_port)"
"$op_bin" --kubeconfig "$KUBECONFIG" --metrics-bind-address "127.0.0.1:$op_port" --report-interval-s 2 \
  >"$work/operator.log" 2>&1 &
e2e_track $!
e2e_wait_for 30 "the operator is ready" curl -sf "http://127.0.0.1:$op_port/readyz" || die "the operator is not ready"

# ---- Prometheus: file_sd targets carrying kubernetes_sd's pod labels, relabelled as in the docs
prom_port="$(free_port)"
prom="http://127.0.0.1:$prom_port"
mkdir -p "$work/prometheus"
echo '[]' >"$work/prometheus/pods.json"
cat >"$work/prometheus/prometheus.yml" <<EOF
global:
  scrape_interval: ${scrape_s}s
  scrape_timeout: ${scrape_s}s
  evaluation_interval: ${scrape_s}s
scrape_configs:
  - job_name: meshwork-trainer
    honor_labels: true
    file_sd_configs:
      - files: ["$work/prometheus/pods.json"]
        refresh_interval: 1s
    relabel_configs:
      - source_labels: [__meta_kubernetes_pod_label_meshwork_dev_job]
        regex: .+
        action: keep
      - source_labels: [__meta_kubernetes_pod_container_port_name]
        regex: metrics(-[0-9]+)?
        action: keep
      - source_labels: [__meta_kubernetes_pod_phase]
        regex: Running
        action: keep
      - source_labels: [__meta_kubernetes_namespace]
        target_label: namespace
      - source_labels: [__meta_kubernetes_pod_name]
        target_label: pod
  - job_name: meshwork-operator
    static_configs:
      - targets: ["127.0.0.1:$op_port"]
EOF
promtool check config "$work/prometheus/prometheus.yml" >/dev/null 2>&1 ||
  die "promtool rejects the scrape config: $(promtool check config "$work/prometheus/prometheus.yml" 2>&1)"
"$prometheus_bin" --config.file="$work/prometheus/prometheus.yml" --storage.tsdb.path="$work/prometheus/data" \
  --web.listen-address="127.0.0.1:$prom_port" >"$work/prometheus.log" 2>&1 &
e2e_track $!
e2e_wait_for 30 "Prometheus is ready" curl -sf "$prom/-/ready" || die "Prometheus is not ready"
prom_epoch="$(date +%s)"

# ---- the TrainingJob that is scraped while it trains
# job NAME STEPS: a TrainingJob of the tiny model, $world Pods x 1 CPU process.
job() {
  cat <<EOF
apiVersion: meshwork.dev/v1alpha1
kind: TrainingJob
metadata:
  name: $1
  namespace: $ns
spec:
  image: meshwork/trainer:e2e
  device: cpu
  replicas: $world
  masterPort: $(free_port)
  metricsPort: $(free_port)
  config:
    inline: |
      model: {preset: tiny}
      data: {train: $work/data/train.bin, val: $work/data/val.bin, seq_len: 64, batch_size: 4}
      training: {threads: 1}
      schedule: {steps: $2, warmup_steps: 5}
      eval: {windows: 4, every: 50}
      logging: {every: 50}
EOF
}
job "$name" 1000000 | kubectl apply -f - >/dev/null || die "apply TrainingJob $name"
pods_running() {
  [ "$(k get pods -l "meshwork.dev/job=$1" -o jsonpath='{range .items[*]}{.status.phase}{" "}{.status.podIP}{"\n"}{end}' |
    awk '$1 == "Running" && $2 != ""' | wc -l)" = "$world" ]
}
e2e_wait_for 60 "$world Pods running" pods_running "$name" || die "the Pods did not start"
n="$(k get pods -o json | python3 "$here/prometheus_e2e.py" file-sd "$work/prometheus/pods.json")" ||
  die "cannot write the file_sd targets"
echo "file_sd: $n Pod ports; Prometheus at $prom"

targets_up() {
  [ "$(curl -s "$prom/api/v1/query" --data-urlencode 'query=count(up{job=~"meshwork-operator|meshwork-trainer"} == 1)' |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else 0)')" = $((world + 1)) ]
}
e2e_wait_for 60 "the operator and $world trainers are up in Prometheus" targets_up ||
  die "targets not up: $(curl -s "$prom/api/v1/query" --data-urlencode 'query=up')"
# rate() over $__rate_interval (15 scrapes) needs that long of samples from training ranks:
# evaluate at one instant (Prometheus' `time`) 20 s after the operator first reports a step.
trains() { [ "$(jp "$name" '{.status.trainer.step}')" -ge 1 ] 2>/dev/null; }
e2e_wait_for 90 "$name trains" trains || die "$name does not train"
sleep 20
at="$(date +%s)"
phase_is "$name" Running || die "$name is not Running: $(jp "$name" '{.status}')"

failed=0
echo "== dashboards while $name trains (step $(jp "$name" '{.status.trainer.step}'), $((SECONDS - started)) s in)"
python3 "$here/prometheus_e2e.py" check --prometheus "$prom" --dashboards "$src/metrics/dashboards" --stage running \
  --namespace "$ns" --job "$name" --world-size "$world" --scrape-interval "$scrape_s" --range $((at - prom_epoch)) \
  --time "$at" || failed=1

# ---- a job that succeeds: the operator's dashboard, with it counted as Succeeded
k delete tj "$name" --wait=false >/dev/null || die "delete $name"
no_pods() { [ -z "$(k get pods -l "meshwork.dev/job=$1" -o name 2>/dev/null)" ]; }
e2e_wait_for 60 "the Pods of $name are gone" no_pods "$name" || die "the Pods of $name were not deleted"
job "$short" 20 | kubectl apply -f - >/dev/null || die "apply TrainingJob $short"
e2e_wait_for 180 "$short succeeds" phase_is "$short" Succeeded || die "$short did not succeed: $(jp "$short" '{.status}')"
sleep $((2 * scrape_s + 1))
echo "== the operator dashboard after $short succeeded ($((SECONDS - started)) s in)"
python3 "$here/prometheus_e2e.py" check --prometheus "$prom" --dashboards "$src/metrics/dashboards" --stage succeeded \
  --namespace "$ns" --job "$short" --world-size "$world" --scrape-interval "$scrape_s" --range $(($(date +%s) - prom_epoch)) ||
  failed=1

echo "prometheus e2e: $((SECONDS - started)) s"
if [ "$failed" != 0 ]; then dump; echo "FAIL"; exit 1; fi
echo "PASS"
