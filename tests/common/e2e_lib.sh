# Shared helpers for bash end-to-end tests on the local cluster (meshwork-cluster, docs/cluster.md):
# a temp work dir cleaned up on exit, free ports, polling, and starting the control plane.
# Source it, then call e2e_init. Callers: the operator, helm and Prometheus e2e tests.
# shellcheck shell=bash

# shellcheck source=tests/common/free_port.sh
source "$(dirname "${BASH_SOURCE[0]}")/free_port.sh"

# e2e_init: makes $work, points HOME and KUBECONFIG into it, and installs the EXIT trap that
# kills every process registered with e2e_track (and the Pods of this control plane).
e2e_init() {
  work="$(mktemp -d)"
  e2e_pids=()
  export HOME="$work" KUBECONFIG="$work/cp/kubeconfig"
  trap e2e_cleanup EXIT
  trap 'exit 130' INT TERM
}

e2e_track() { e2e_pids+=("$@"); }

e2e_cleanup() {
  local p
  # Newest first: Prometheus and the operator before the control plane, whose SIGTERM stops
  # its Pods (process groups of the control plane).
  for ((i = ${#e2e_pids[@]} - 1; i >= 0; i--)); do
    p="${e2e_pids[$i]}"
    kill -TERM "$p" 2>/dev/null
  done
  for p in "${e2e_pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  # Pods run in sessions of their own; the control plane stops them on SIGTERM, but one that
  # outlived it would keep its ports. Every process started under this run (Pods inherit the
  # control plane's environment) has this run's KUBECONFIG: kill exactly those.
  local f
  for f in /proc/[0-9]*/environ; do
    p="${f#/proc/}"
    p="${p%/environ}"
    [ "$p" = "$$" ] && continue
    if { tr '\0' '\n' <"$f"; } 2>/dev/null | grep -qxF "KUBECONFIG=$KUBECONFIG"; then kill -9 "$p" 2>/dev/null; fi
  done
  rm -rf "$work"
}

# e2e_require_kube_bin: exits 0 with a SKIP line (and why) when MESHWORK_KUBE_BIN has no
# kube-apiserver; else puts it first on PATH (kubectl and helm of meshwork-cluster's release).
e2e_require_kube_bin() {
  if [ ! -x "${MESHWORK_KUBE_BIN:-}/kube-apiserver" ]; then
    echo "SKIP: no kube-apiserver in MESHWORK_KUBE_BIN='${MESHWORK_KUBE_BIN:-}' (scripts/setup.sh builds the Kubernetes components there)"
    exit 0
  fi
  export PATH="$MESHWORK_KUBE_BIN:$PATH"
}

# e2e_wait_for SECONDS DESCRIPTION COMMAND...: polls COMMAND until it succeeds.
e2e_wait_for() {
  local limit="$1" what="$2"
  shift 2
  local end=$((SECONDS + limit))
  while ((SECONDS < end)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  echo "timed out after ${limit}s waiting for: $what"
  return 1
}

# e2e_start_controlplane BINARY [FLAG...]: starts meshwork-cluster with its data in $work/cp,
# the kubeconfig at $KUBECONFIG, run from $work (relative paths in Pods resolve there), with any
# further flags (e.g. --nodes FILE); returns once it serves. kubectl and helm of its release
# (MESHWORK_KUBE_BIN) come first on PATH.
e2e_start_controlplane() {
  mkdir -p "$work/cp"
  local bin="$1"
  shift
  e2e_require_kube_bin
  (cd "$work" && exec "$bin" --data-dir "$work/cp" --kubeconfig "$KUBECONFIG" "$@" >"$work/cp.log" 2>&1) &
  e2e_track $!
  e2e_wait_serving $! "$work/cp.log" "the control plane"
}

# e2e_wait_serving PID LOG WHAT: waits up to 180 s for the meshwork-cluster PID to say in LOG that
# it serves. If it exits first, says so at once with its log (which ends with the failed
# component's log), instead of waiting out the 180 s.
e2e_wait_serving() {
  local pid="$1" log="$2" what="$3" end=$((SECONDS + 180))
  while ((SECONDS < end)); do
    grep -q "serving on" "$log" && return 0
    if ! kill -0 "$pid" 2>/dev/null; then
      grep -q "serving on" "$log" && return 0
      echo "$what exited before serving:"
      cat "$log"
      return 1
    fi
    sleep 0.5
  done
  echo "timed out after 180s waiting for: $what"
  cat "$log"
  return 1
}

# e2e_apply_crd SOURCE_DIR: applies the CRDs (crds/: TrainingJob, TrainingRuntime) and waits until
# they are Established.
e2e_apply_crd() {
  kubectl apply -f "$1/crds/" >/dev/null &&
    kubectl wait --for=condition=Established crd/trainingjobs.meshwork.dev crd/trainingruntimes.meshwork.dev \
      --timeout=20s >/dev/null
}

# e2e_require_kubectl: exits 0 with a SKIP line (and why) when kubectl is not installed.
e2e_require_kubectl() {
  command -v kubectl >/dev/null && return 0
  echo "SKIP: kubectl is not installed (scripts/setup.sh installs it)"
  exit 0
}

# pass MSG / fail MSG: one check's result, counted in $passed and $failed.
passed=0
failed=0
pass() { echo "PASS: $1"; passed=$((passed + 1)); }
fail() { echo "FAIL: $1"; failed=$((failed + 1)); }

# e2e_summary NAME: the counts; returns 0 when no check failed.
e2e_summary() {
  echo "$1: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}

# ---- Kueue (the real controller, built by scripts/kube-build.sh into $MESHWORK_KUBE_BIN)

# e2e_require_kueue: exits 0 with a SKIP line (and why) when Kueue or openssl is missing.
e2e_require_kueue() {
  if [ ! -x "$MESHWORK_KUBE_BIN/kueue" ] || [ ! -d "$MESHWORK_KUBE_BIN/kueue-crds" ]; then
    echo "SKIP: no kueue (and kueue-crds/) in MESHWORK_KUBE_BIN='$MESHWORK_KUBE_BIN' (scripts/kube-build.sh builds them)"
    exit 0
  fi
  command -v openssl >/dev/null || { echo "SKIP: openssl is not installed (the Kueue metrics certificate needs it)"; exit 0; }
}

# e2e_kueue_certs: Kueue with its internal certificate management off reads a metrics
# certificate from the fixed path /etc/kueue/metrics/certs: writes a self-signed one there when
# none exists (as root, which CI is; e2e_kueue_cleanup removes what it made), and one for the
# webhook server in $work/certs (the API server calls no webhook: Kueue's webhook configurations
# are not installed). Returns 1 after a SKIP line when it cannot.
e2e_kueue_made_certs=""
e2e_kueue_certs() {
  if [ ! -f /etc/kueue/metrics/certs/tls.crt ]; then
    [ -d /etc/kueue ] || e2e_kueue_made_certs=/etc/kueue
    [ -z "$e2e_kueue_made_certs" ] && [ ! -d /etc/kueue/metrics ] && e2e_kueue_made_certs=/etc/kueue/metrics
    [ -z "$e2e_kueue_made_certs" ] && e2e_kueue_made_certs=/etc/kueue/metrics/certs
    mkdir -p /etc/kueue/metrics/certs || { echo "SKIP: cannot write /etc/kueue/metrics/certs (not root?)"; return 1; }
    openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=kueue-metrics \
      -keyout /etc/kueue/metrics/certs/tls.key -out /etc/kueue/metrics/certs/tls.crt 2>/dev/null
  fi
  mkdir -p "$work/certs"
  openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=kueue-webhook \
    -keyout "$work/certs/tls.key" -out "$work/certs/tls.crt" 2>/dev/null
}
e2e_kueue_cleanup() { [ -n "$e2e_kueue_made_certs" ] && rm -rf "$e2e_kueue_made_certs"; }

# e2e_kueue_apis KUBECONFIG: applies Kueue's CRDs and waits until discovery serves its kinds
# (Kueue maps them once, at start; Established comes a moment before discovery shows a new CRD,
# longer under load).
e2e_kueue_apis() {
  local out
  out="$(KUBECONFIG="$1" kubectl apply --server-side -f "$MESHWORK_KUBE_BIN/kueue-crds/" 2>&1)" || { echo "$out"; return 1; }
  KUBECONFIG="$1" e2e_wait_for 60 "Kueue's API in discovery" bash -c \
    "kubectl get --raw /apis/kueue.x-k8s.io/v1beta2 2>/dev/null | grep -q '\"name\":\"workloads\"' &&
     kubectl get --raw /apis/kueue.x-k8s.io/v1beta2 | grep -q '\"name\":\"clusterqueues\"'"
}

# e2e_start_kueue KUBECONFIG PREFIX [EXTRA_CONFIG_YAML]: starts Kueue against that cluster, with
# TrainingJob as an external framework, config PREFIX.yaml, log PREFIX.log; waits for its workers.
e2e_start_kueue() {
  cat >"$2.yaml" <<EOF
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
manageJobsWithoutQueueName: false
internalCertManagement: {enable: false}
leaderElection: {leaderElect: false}
health: {healthProbeBindAddress: "127.0.0.1:0"}
metrics: {bindAddress: "0"}
webhook: {port: $(free_port), host: 127.0.0.1, certDir: $work/certs}
featureGates: {VisibilityOnDemand: false}
integrations:
  frameworks: ["batch/job"]
  externalFrameworks: ["TrainingJob.v1alpha1.meshwork.dev"]
${3:-}
EOF
  "$MESHWORK_KUBE_BIN/kueue" --config "$2.yaml" --kubeconfig "$1" >"$2.log" 2>&1 &
  e2e_track $!
  e2e_wait_for 60 "Kueue's controllers" grep -q '"msg":"Starting workers"' "$2.log"
}
