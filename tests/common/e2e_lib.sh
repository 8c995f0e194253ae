# Shared helpers for bash end-to-end tests on the local cluster (meshwork-cluster, docs/cluster.md):
# a temp work dir cleaned up on exit, free ports, polling, and starting the control plane.
# Source it, then call e2e_init. Callers: the operator, helm and Prometheus e2e tests.
# shellcheck shell=bash

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

# e2e_free_port: a port that is free on every address, from 61000-64999, above the kernel's
# ephemeral range (32768-60999 here): a port the kernel picked could be taken by any outgoing
# connection before the test binds it (seen: a Pod's 0.0.0.0 metrics port taken under load).
e2e_free_port() {
  python3 - <<'PY'
import random, socket
for _ in range(200):
    port = random.randrange(61000, 65000)
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
else:
    raise SystemExit("no free port in 61000-64999")
PY
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
  e2e_wait_for 180 "the control plane" grep -q "serving on" "$work/cp.log" || { cat "$work/cp.log"; return 1; }
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
