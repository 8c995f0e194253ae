#!/usr/bin/env bash
# The container images built and run for real, with podman (scripts/images.sh builds them on a
# Debian base made here with debootstrap; docs/images.md):
#   - the CPU trainer image, in a container with no network but its own loopback: prepares data,
#     trains the tiny Llama for 20 steps over 2 processes (launch, FSDP over Gloo), exports it;
#     the export is evaluated in the image and by this build's meshwork-train: the same loss;
#   - the operator image, on the host's network with a read-only root file system, against the
#     local cluster (meshwork-cluster: a real kube-apiserver) through a kubeconfig: answers
#     /healthz and /readyz, holds its Lease, and reconciles a TrainingJob to Succeeded. The local
#     cluster runs Pods as processes of this machine, not in images (docs/cluster.md), so that
#     job's trainers are this build's meshwork-train, not the trainer image.
# Opt-in, it builds two images (the first time about 25 min on 2 cores): MESHWORK_IMAGES_SMOKE=1.
# Exits 77 (ctest: Skipped) with the reason when not asked for, or when podman cannot run a
# container here (podman's refusal printed as it is); the images are still built in that case.
#
#   MESHWORK_IMAGES_REUSE=1: use the images already tagged, without running scripts/images.sh
#   MESHWORK_IMAGES_GPU=1: also build the GPU trainer image and run it on the CPU (no GPU here)
#
# usage: images_smoke.sh SOURCE_DIR CLUSTER TRAIN
set -uo pipefail

src="$1"
cp_bin="$2"
train_bin="$3"
if [ "${MESHWORK_IMAGES_SMOKE:-0}" != 1 ]; then
  echo "SKIP: builds and runs the container images only when asked: MESHWORK_IMAGES_SMOKE=1 ctest -L images"
  exit 77
fi
source "$src/tests/common/checks.sh"
source "$src/tests/common/e2e_lib.sh"
podman=(podman --runtime runc)
# podman asks for RLIMIT_NOFILE and RLIMIT_NPROC of 1048576 for root's containers by default;
# without CAP_SYS_RESOURCE (this machine's root lacks it) the runtime may not raise them, and the
# container is refused ("error setting rlimit type 7: operation not permitted"). podman runs the
# runtime with RLIMIT_NPROC lowered to 32768 (seen with strace), hence that value.
ulimits=(--ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit nproc=32768:32768)
containers=()
e2e_init
trap 'for c in "${containers[@]}"; do "${podman[@]}" rm -f -t 2 "$c" >/dev/null 2>&1; done; e2e_cleanup' EXIT

# ---- the images: tags from the chart and the examples, as scripts/images.sh gives them
version="$(awk '$1 == "appVersion:" { gsub(/"/, "", $2); print $2; exit }' "$src/charts/meshwork-operator/Chart.yaml")"
operator_repo="$(awk '/^image:/ { i = 1; next } /^[^[:space:]#]/ { i = 0 } i && $1 == "repository:" { print $2; exit }' "$src/charts/meshwork-operator/values.yaml")"
operator_image="$operator_repo:$version"
trainer_image="$(awk '$1 == "image:" { print $2; exit }' "$src/examples/trainingjob-tiny-cpu.yaml")"
if [ "${MESHWORK_IMAGES_REUSE:-0}" = 1 ] && podman image exists "$operator_image" && podman image exists "$trainer_image"; then
  echo "reusing $operator_image and $trainer_image (MESHWORK_IMAGES_REUSE=1)"
else
  start=$SECONDS
  "$src/scripts/images.sh"
  rc=$?
  # 5: this machine cannot build images at all (not root, not Debian 12, no packages): a skip.
  if ((rc == 5)); then echo "SKIP: scripts/images.sh cannot build images on this machine (exit 5, its reason above)"; exit 77; fi
  ((rc == 0)) || { fail "scripts/images.sh exited $rc"; checks_done images_smoke; exit 1; }
  echo "scripts/images.sh took $((SECONDS - start)) s"
fi
for image in "$operator_image" "$trainer_image"; do
  size="$(podman image inspect -f '{{.Size}}' "$image" 2>/dev/null)"
  [ -n "$size" ] && pass "$image is built ($((size / 1000 / 1000)) MB)" || fail "no image $image"
done
((failed == 0)) || { checks_done images_smoke; exit 1; }

# ---- can a container run here at all? If not, say exactly what refused, and skip.
if ! out="$("${podman[@]}" run --rm --network none "${ulimits[@]}" --entrypoint /bin/true "$trainer_image" 2>&1)"; then
  echo "SKIP: the images are built, but podman cannot run a container on this machine: $out"
  exit 77
fi

# ---- the trainer image
data="$work/trainer"
mkdir -p "$data" && chown 65532:65532 "$data"
trainer() {  # trainer ARGS...: meshwork-train ARGS... in the trainer image, /workspace = $data
  "${podman[@]}" run --rm --network none "${ulimits[@]}" --read-only -v "$data:/workspace" \
    -v "$src/examples/tiny.yaml:/etc/meshwork/tiny.yaml:ro" "$trainer_image" "$@"
}
if trainer prepare-data --out train.bin --val-out val.bin /usr/share/common-licenses/GPL-3 >"$work/prepare.log" 2>&1; then
  pass "prepare-data in the trainer image (byte-level, the image's own GPL-3 text)"
else
  fail "prepare-data in the trainer image: $(tail -n 5 "$work/prepare.log")"
fi
start=$SECONDS
if trainer launch --nproc 2 train --config /etc/meshwork/tiny.yaml --set data.train=train.bin --set data.val=val.bin \
     --set data.batch_size=8 --set schedule.steps=20 --set schedule.warmup_steps=5 --set eval.windows=4 \
     --set logging.every=5 --set checkpoint.export_hf=export >"$work/train.log" 2>&1; then
  pass "the trainer image trains tiny for 20 steps over 2 processes ($((SECONDS - start)) s)"
else
  fail "training in the trainer image: $(tail -n 15 "$work/train.log")"
fi
echo "---- the training's last lines"
tail -n 6 "$work/train.log"
if [ -s "$data/export/config.json" ] && [ -s "$data/export/model.safetensors" ]; then
  pass "the export holds config.json and model.safetensors ($(du -k "$data/export/model.safetensors" | cut -f1) KiB)"
else
  fail "the export: $(ls -l "$data/export" 2>&1)"
fi
in_image="$(trainer eval --weights export --data val.bin --windows 4 --set data.seq_len=128 2>/dev/null)"
on_host="$("$train_bin" eval --weights "$data/export" --data "$data/val.bin" --windows 4 --set data.seq_len=128 2>/dev/null)"
if [ -n "$in_image" ] && [ "$in_image" = "$on_host" ]; then
  pass "eval of the export: the image and this build's meshwork-train print the same ($in_image)"
else
  fail "eval of the export: in the image '$in_image', on the host '$on_host'"
fi

# ---- the GPU trainer image, on the CPU: its libtorch 2.11 loads, and it trains
if [ "${MESHWORK_IMAGES_GPU:-0}" = 1 ]; then
  gpu_image="$(awk '$1 == "image:" { print $2; exit }' "$src/examples/trainingjob-llama3-1b-gpu.yaml")"
  if [ "${MESHWORK_IMAGES_REUSE:-0}" = 1 ] && podman image exists "$gpu_image"; then
    echo "reusing $gpu_image (MESHWORK_IMAGES_REUSE=1)"
  else
    start=$SECONDS
    "$src/scripts/images.sh" trainer || fail "scripts/images.sh trainer exited $?"
    echo "scripts/images.sh trainer took $((SECONDS - start)) s"
  fi
  size="$(podman image inspect -f '{{.Size}}' "$gpu_image" 2>/dev/null)"
  [ -n "$size" ] && pass "$gpu_image is built ($((size / 1000 / 1000)) MB)" || fail "no image $gpu_image"
  gpu_trainer() {
    "${podman[@]}" run --rm --network none "${ulimits[@]}" --read-only -v "$data:/workspace" \
      -v "$src/examples/tiny.yaml:/etc/meshwork/tiny.yaml:ro" "$gpu_image" "$@"
  }
  devices="$(gpu_trainer devices 2>&1)"
  if grep -q '^libtorch 2\.11' <<<"$devices"; then
    pass "meshwork-train devices in the GPU image: libtorch $(sed -n 's/^libtorch //p' <<<"$devices" | head -n 1)"
  else
    fail "meshwork-train devices in the GPU image: $devices"
  fi
  # One process: the PyPI libtorch ships no Gloo, so this flavor's ranks talk over NCCL only.
  if gpu_trainer train --config /etc/meshwork/tiny.yaml --set data.train=train.bin --set data.val=val.bin \
       --set data.batch_size=8 --set schedule.steps=10 --set schedule.warmup_steps=2 --set eval.windows=2 \
       --set logging.every=5 --set training.device=cpu >"$work/train-gpu-image.log" 2>&1; then
    pass "the GPU image trains tiny for 10 steps on the CPU in one process (libtorch 2.11)"
  else
    fail "training in the GPU image on the CPU: $(tail -n 15 "$work/train-gpu-image.log")"
  fi
  tail -n 3 "$work/train-gpu-image.log"
else
  echo "NOT CHECKED: the GPU trainer image (MESHWORK_IMAGES_GPU=1 builds it: about 4 GB, 20 min the first time)"
fi

# ---- the operator image on the local cluster
if [ ! -x "${MESHWORK_KUBE_BIN:-}/kube-apiserver" ]; then
  echo "NOT CHECKED: the operator image on a cluster: no kube-apiserver in MESHWORK_KUBE_BIN='${MESHWORK_KUBE_BIN:-}' (scripts/setup.sh builds it)"
  checks_done images_smoke || exit 1
  exit 77
fi
k() { timeout 60 kubectl --request-timeout=30s "$@"; }
# The Pods the operator creates run with the control plane's environment: this build's
# meshwork-train on PATH.
export PATH="$(dirname "$train_bin"):$PATH"
e2e_start_controlplane "$cp_bin" || { checks_done images_smoke; exit 1; }
e2e_apply_crd "$src" || fail "the CRDs are not Established"
# The container runs as 65532: it gets a copy of the kubeconfig it can read.
install -m 0644 "$KUBECONFIG" "$work/kubeconfig.operator"
port="$(free_port)"
name="meshwork-images-smoke-$$"
if "${podman[@]}" run -d --name "$name" --network host "${ulimits[@]}" --read-only \
     -v "$work/kubeconfig.operator:/etc/meshwork/kubeconfig:ro" "$operator_image" \
     --kubeconfig /etc/meshwork/kubeconfig --metrics-bind-address "127.0.0.1:$port" --identity images-smoke \
     --report-interval-s 2 >"$work/operator.id" 2>"$work/operator.err"; then
  containers+=("$name")
  pass "the operator image starts (container $name, host network, read-only root)"
else
  fail "podman run of $operator_image: $(cat "$work/operator.err")"
fi
ready() { [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/readyz")" = 200 ]; }
if e2e_wait_for 60 "the operator's /readyz" ready; then
  pass "/readyz answers 200 on 127.0.0.1:$port"
else
  fail "/readyz: $(curl -s -w ' (HTTP %{http_code})' "http://127.0.0.1:$port/readyz"); its log: $(podman logs "$name" 2>&1 | tail -n 10)"
fi
code="$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/healthz")"
[ "$code" = 200 ] && pass "/healthz answers 200" || fail "/healthz: HTTP $code"
holds_lease() { [ "$(k -n default get lease meshwork-operator -o jsonpath='{.spec.holderIdentity}' 2>/dev/null)" = images-smoke ]; }
if e2e_wait_for 30 "the operator's Lease" holds_lease; then
  pass "it holds its Lease default/meshwork-operator (holder images-smoke)"
else
  fail "Lease default/meshwork-operator: $(k -n default get lease meshwork-operator -o yaml 2>&1 | tail -n 8)"
fi
echo "---- the operator's log"
podman logs "$name" 2>&1 | head -n 8

mkdir -p "$work/data"
"$train_bin" prepare-data --out "$work/data/train.bin" --val-out "$work/data/val.bin" "$src/README.md" >/dev/null 2>&1 ||
  fail "prepare-data on the host"
cat >"$work/job.yaml" <<EOF
apiVersion: meshwork.dev/v1alpha1
kind: TrainingJob
metadata:
  name: from-image
  namespace: default
spec:
  image: $trainer_image
  device: cpu
  replicas: 2
  masterPort: $(free_port)
  metricsPort: $(free_port)
  config:
    inline: |
      model: {preset: tiny}
      data: {train: $work/data/train.bin, val: $work/data/val.bin, seq_len: 64, batch_size: 4}
      schedule: {steps: 20, warmup_steps: 5}
      eval: {windows: 4}
      logging: {every: 5}
EOF
k apply -f "$work/job.yaml" >/dev/null 2>&1 || fail "kubectl apply of a TrainingJob"
succeeded() { [ "$(k get tj from-image -o jsonpath='{.status.phase}' 2>/dev/null)" = Succeeded ]; }
if e2e_wait_for 240 "from-image succeeds" succeeded; then
  step="$(k get tj from-image -o jsonpath='{.status.trainer.step}/{.status.trainer.totalSteps}')"
  [ "$step" = 20/20 ] && pass "the operator in its image runs a TrainingJob to Succeeded, step $step" ||
    fail "status.trainer: $step"
else
  fail "from-image did not succeed: $(k get tj from-image -o jsonpath='{.status}' 2>&1); operator log: $(podman logs "$name" 2>&1 | tail -n 10)"
fi
checks_done images_smoke
