#!/usr/bin/env bash
# Installs Meshwork's Debian dependencies (idempotently) and builds the project into build/.
# Run by scripts/demo.sh and scripts/test.sh; safe to run again at any time.
#
# usage: scripts/setup.sh [--demo]
#   --demo: only what scripts/demo.sh runs: of the Kubernetes components those the local cluster
#           runs (not helm, not Kueue), and of the build meshwork-train, meshwork-operator and
#           meshwork-cluster with its node agent (no tests). A later run without it builds the rest.
#
#   MESHWORK_BUILD_DIR   build folder (default: build)
#   MESHWORK_BUILD_TYPE  CMake build type (default: Release)
#   MESHWORK_JOBS        parallel compile jobs (default: nproc)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${MESHWORK_BUILD_DIR:-$root/build}"
build_type="${MESHWORK_BUILD_TYPE:-Release}"
jobs="${MESHWORK_JOBS:-$(nproc)}"
demo=0
case "${1:-}" in
  --demo) demo=1 ;;
  "") ;;
  *) echo "usage: scripts/setup.sh [--demo] (got '$1')" >&2; exit 2 ;;
esac

# Debian 12 packages the build and the tests use.
packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libgloo-dev libcpprest-dev prometheus-cpp-dev libyaml-cpp-dev
  nlohmann-json3-dev libgtest-dev libgmock-dev libssl-dev
  libopenblas0-pthread  # libtorch calls the system BLAS: netlib's reference BLAS is ~30x slower
  curl ca-certificates python3 python3-yaml procps  # procps: pkill in the operator e2e test
  libsentencepiece-dev  # prepare-data with SentencePiece .model files (trainer/data/spm_module.cpp)
  python3-pip  # the reference tokenizers the tests compare with (below)
  python3-numpy  # the PyTorch peer (bench/peers/llama_peer.py), which ctest llama_peer_same_losses runs
  iproute2  # ss: the operator e2e test checks the address rank 0's store listens on; netlab: ip, tc
  openssl  # meshwork-cluster makes the local cluster's certificates with it
  prometheus  # promtool: the dashboards' and alert rules' tests (the package also ships the server)
)

# Real kubectl drives the local control plane in the e2e tests. A kubectl already on the machine
# (e.g. Google Cloud SDK's 1.32) is used; otherwise Debian's kubernetes-client.
command -v kubectl >/dev/null || packages+=(kubernetes-client)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[setup] installing Debian packages: ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -q
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "[setup] Debian packages present"
fi

# The Python packages the tests compare with or read through (PyPI). Each install warns and goes
# on when PyPI is out of reach (its tests then skip and say why): never fatal.
install_python_tools() {
  # The reference tokenizers tests/integration/tokenizer_e2e.sh compares meshwork-train with: PyPI's
  # tokenizers at the version of the crate meshwork-train links (trainer/data/hf_tokenizers/
  # Cargo.toml), and sentencepiece. Without PyPI the test skips and says why.
  tokenizer_ref="$root/.meshwork/tools/tokenizer-ref"
  if [ ! -f "$tokenizer_ref/.installed" ]; then
    echo "[setup] installing the reference tokenizers into $tokenizer_ref"
    rm -rf "$tokenizer_ref"
    if /usr/bin/python3 -m pip install -q --no-deps --only-binary=:all: --target "$tokenizer_ref" \
        tokenizers==0.23.2 sentencepiece==0.2.1; then
      touch "$tokenizer_ref/.installed"
    else
      echo "[setup] warning: could not install the reference tokenizers from PyPI; tokenizer_e2e will skip" >&2
    fi
  fi
  # Real tokenizer files a registry ships: the SentencePiece models Google trained for
  # sentencepiece's own tests (English and Japanese), in its PyPI source archive, with the text they
  # were trained on. tokenizer_e2e compares meshwork-train's ids on them with the Python package's.
  if [ -f "$tokenizer_ref/.installed" ] && [ ! -f "$tokenizer_ref/real/.installed" ]; then
    echo "[setup] unpacking sentencepiece's test models into $tokenizer_ref/real"
    sdist="$(mktemp -d)"
    if /usr/bin/python3 -m pip download -q --no-deps --no-binary :all: --no-build-isolation -d "$sdist" sentencepiece==0.2.1 &&
       mkdir -p "$tokenizer_ref/real" &&
       tar -xzf "$sdist"/sentencepiece-0.2.1.tar.gz -C "$tokenizer_ref/real" --strip-components=2 \
         sentencepiece-0.2.1/test/test_model.model sentencepiece-0.2.1/test/test_ja_model.model \
         sentencepiece-0.2.1/test/botchan.txt; then
      touch "$tokenizer_ref/real/.installed"
    else
      echo "[setup] warning: could not unpack sentencepiece's source archive; tokenizer_e2e skips its real models" >&2
    fi
    rm -rf "$sdist"
  fi

  # Apache Arrow's C++ library for Parquet input (cmake/parquet.cmake): PyPI's pyarrow wheel carries
  # libarrow, libparquet and their headers, and Debian 12 packages no Arrow. The same package writes
  # the Parquet files the tests read. Without PyPI the build leaves Parquet out and says so.
  arrow_dir="$root/.meshwork/tools/arrow"
  if [ ! -f "$arrow_dir/.installed" ]; then
    echo "[setup] installing Apache Arrow (pyarrow wheel) into $arrow_dir"
    rm -rf "$arrow_dir"
    if /usr/bin/python3 -m pip install -q --no-deps --only-binary=:all: --target "$arrow_dir" pyarrow==26.0.1; then
      touch "$arrow_dir/.installed"
    else
      echo "[setup] warning: could not install pyarrow from PyPI; prepare-data will refuse Parquet inputs" >&2
    fi
  fi

  # PyPI transformers, which tests/integration/hf_export_transformers.sh loads an HF export with (on
  # the CUDA flavor's PyPI torch, run on the CPU). Without PyPI that test skips and says why.
  transformers_dir="$root/.meshwork/tools/transformers"
  if [ ! -f "$transformers_dir/.installed" ]; then
    echo "[setup] installing transformers into $transformers_dir"
    rm -rf "$transformers_dir"
    if /usr/bin/python3 -m pip install -q --only-binary=:all: --target "$transformers_dir" transformers==5.24.0; then
      touch "$transformers_dir/.installed"
    else
      echo "[setup] warning: could not install transformers from PyPI; hf_export_transformers will skip" >&2
    fi
  fi
}

# The downloads wait on the network and the Go build on the CPU: they run side by side, the
# downloads' output printed once both are done.
python_tools_log="$(mktemp)"
install_python_tools >"$python_tools_log" 2>&1 &
python_tools_pid=$!
trap 'kill "$python_tools_pid" 2>/dev/null || true; rm -f "$python_tools_log"' EXIT

# The real Kubernetes components of the local cluster (meshwork-cluster): kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, etcd and helm, built from their Go modules
# into .meshwork/kube/bin (scripts/kube-build.sh; 20 to 30 minutes on 2 cores the first time).
kube_modules=()
((demo)) && kube_modules=(kubernetes etcd cni)
"$root/scripts/kube-build.sh" "${kube_modules[@]}"

wait "$python_tools_pid" || true
cat "$python_tools_log"

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

if [ ! -f "$build_dir/build.ninja" ]; then
  echo "[setup] configuring $build_dir ($build_type)"
  cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" "${launcher[@]}" \
    ${MESHWORK_CMAKE_ARGS:-}
fi
targets=()
((demo)) && targets=(meshwork-train meshwork-operator meshwork-cluster)
# A first build says how long it will take, from its compile steps (ninja -t commands; a dry run
# would only re-check the globbed directories): 3 to 5 CPU-seconds a step without ccache (the
# demo's 157 took 6.5 minutes on 2 cores, all 308 about 8; the tokenizers crate, one step, 85 s).
if [ ! -f "$build_dir/.ninja_log" ]; then
  steps="$(ninja -C "$build_dir" -t commands "${targets[@]}" 2>/dev/null | wc -l)"
  echo "[setup] a first build: $steps compile steps with $jobs jobs (about $(( (steps * 4 / jobs + 59) / 60 )) min)"
else
  echo "[setup] building what changed with $jobs jobs"
fi
cmake --build "$build_dir" -j "$jobs" ${targets[@]:+--target "${targets[@]}"}
