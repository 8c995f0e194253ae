#!/usr/bin/env bash
# The main job: install and build what it runs (scripts/setup.sh --demo), start a local Kubernetes cluster
# (meshwork-cluster: the real kube-apiserver, etcd, controller-manager and scheduler, plus
# Meshwork's node agent) and the operator (meshwork-operator), `kubectl apply` the CPU example
# TrainingJob (examples/trainingjob-tiny-cpu.yaml: the tiny Llama, FSDP over 2 Pods), and follow
# it to Succeeded. The control plane and the operator keep running afterwards so that kubectl
# works; `scripts/demo.sh --stop` stops them (a new run also replaces them).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
state="$root/.meshwork/local"

stop() {
  for name in operator controlplane; do
    local pidfile="$state/$name.pid"
    [ -f "$pidfile" ] || continue
    local pid
    pid="$(cat "$pidfile")"
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
      # meshwork-cluster stops its Pods (their grace period) and then its components.
      for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
  done
}
if [ "${1:-}" = "--stop" ]; then
  stop
  echo "stopped the local control plane and the operator"
  exit 0
fi

demo_start=$SECONDS
# Only what the demo runs is built (scripts/setup.sh --demo); scripts/test.sh builds the rest.
echo "== set-up: the Kubernetes components the local cluster runs, then the trainer, operator and cluster"
echo "   (a first run on 2 cores: about 8 minutes of Go, then about 7 of C++; later runs skip both)"
"$root/scripts/setup.sh" --demo
echo "   set-up done after $(( (SECONDS - demo_start) / 60 )) min $(( (SECONDS - demo_start) % 60 )) s"
build="${MESHWORK_BUILD_DIR:-$root/build}"
train="$build/trainer/meshwork-train"
# The Pods run meshwork-train from PATH; kubectl and helm of the cluster's release come first.
export PATH="$root/.meshwork/kube/bin:$build/trainer:$PATH"
export KUBECONFIG="$state/controlplane/kubeconfig"

echo
echo "== preparing data"
mkdir -p .meshwork/data
corpus=()
for f in GPL-3 GPL-2 LGPL-2.1 LGPL-3 Apache-2.0 GFDL-1.3 MPL-2.0 Artistic; do
  [ -f "/usr/share/common-licenses/$f" ] && corpus+=("/usr/share/common-licenses/$f")
done
corpus+=(README.md docs)
# A byte-level BPE trained on the corpus itself, with the tiny preset's 320 ids (the 256 bytes, two
# separators and 62 merges); without Hugging Face support in this build, the byte vocabulary.
tokenizer=bytes
if "$train" train-tokenizer --vocab-size 320 --out .meshwork/data/tokenizer "${corpus[@]}"; then
  tokenizer=.meshwork/data/tokenizer
else
  echo "(no tokenizer trained: the data is prepared with the byte-level vocabulary)"
fi
"$train" prepare-data --tokenizer "$tokenizer" --out .meshwork/data/train.bin --val-out .meshwork/data/val.bin \
  "${corpus[@]}"

echo
echo "== starting the local control plane and the operator (a fresh cluster in $state)"
stop
rm -rf "$state" /tmp/meshwork-checkpoints/default/tiny
mkdir -p "$state"
setsid "$build/controlplane/cluster/meshwork-cluster" --data-dir "$state/controlplane" \
  >"$state/controlplane.log" 2>&1 </dev/null &
echo $! >"$state/controlplane.pid"
# A cold start takes 25-40 s on 2 cores (kube-apiserver's start-up, mostly).
for _ in $(seq 1800); do grep -q "serving on" "$state/controlplane.log" 2>/dev/null && break; sleep 0.1; done
grep -q "serving on" "$state/controlplane.log" || { cat "$state/controlplane.log"; exit 1; }
cat "$state/controlplane.log"
kubectl apply -f crds/
kubectl wait --for=condition=Established crd/trainingjobs.meshwork.dev crd/trainingruntimes.meshwork.dev \
  --timeout=30s >/dev/null
setsid "$build/operator/meshwork-operator" --metrics-bind-address 127.0.0.1:8080 --report-interval-s 2 \
  >"$state/operator.log" 2>&1 </dev/null &
echo $! >"$state/operator.pid"
for _ in $(seq 300); do curl -sf http://127.0.0.1:8080/readyz >/dev/null 2>&1 && break; sleep 0.1; done

echo
echo "== kubectl apply -f examples/trainingjob-tiny-cpu.yaml"
kubectl apply -f examples/trainingjob-tiny-cpu.yaml
start=$SECONDS
last=""
phase=""
while ((SECONDS - start < 900)); do
  line="$(kubectl get tj tiny -o jsonpath='{.status.phase} {.status.ready} {.status.trainer.step} {.status.trainer.totalSteps} {.status.trainer.loss} {.status.trainer.tokensPerSecond} {.status.restarts}' 2>/dev/null || true)"
  read -r phase ready step total loss tps restarts <<<"$line" || true
  if [ -n "$line" ] && [ "$line" != "$last" ]; then
    printf '%4ds  %-10s pods %-4s step %4s/%-4s loss %-7s %8s tok/s  restarts %s\n' \
      $((SECONDS - start)) "${phase:-Created}" "${ready:--}" "${step:--}" "${total:--}" "${loss:--}" "${tps:--}" "${restarts:-0}"
    last="$line"
  fi
  if [ "$phase" = Succeeded ] || [ "$phase" = Failed ]; then break; fi
  sleep 2
done

echo
kubectl get tj tiny -o wide
if [ "$phase" != Succeeded ]; then
  echo "the job did not succeed (phase '${phase:-none}'); see: kubectl describe tj tiny, kubectl logs tiny-0, $state/operator.log" >&2
  exit 1
fi
echo
echo "== the last lines of rank 0 (kubectl logs tiny-0)"
kubectl logs tiny-0 | tail -n 3

cat <<MSG

Done in $(( (SECONDS - demo_start) / 60 )) min $(( (SECONDS - demo_start) % 60 )) s: the TrainingJob 'tiny' Succeeded. The control plane and the operator are still running:
  export KUBECONFIG=$KUBECONFIG PATH=$root/.meshwork/kube/bin:\$PATH   # kubectl 1.37, the cluster's release
  kubectl get tj,pods,svc                   # the job, its 2 Pods and its headless Service
  kubectl describe tj tiny                  # status, conditions and events
  kubectl logs tiny-0                       # rank 0's log (tiny-1 for rank 1)
  curl -s http://127.0.0.1:8080/metrics     # the operator's metrics (docs/metrics.md)
  less $state/operator.log                  # the operator's log ($state/controlplane.log: the control plane's)
  kubectl delete tj tiny && kubectl apply -f examples/trainingjob-tiny-cpu.yaml   # again
  scripts/demo.sh --stop                    # stop the control plane and the operator
While a job trains, each trainer serves /metrics on its Pod's address, port 9400 (kubectl get pod tiny-0 -o wide).
MSG
