#!/usr/bin/env bash
# Run on a CPU machine with Debian 12's apt and PyPI: gathers into one folder everything that
# scripts/gpu-build.sh needs on a GPU machine without internet besides its own PyTorch, CUDA and
# NCCL: the Debian packages the trainer and its tests build against (.deb files), the CUDA 13
# headers that torch's wheels lack (crt/, CCCL) and, for a machine without them, cmake and ninja
# (wheels). The folder (about 32 MiB) is what the device tool carries (`carry`, 64 MiB at most).
#
#   MESHWORK_GPU_BUNDLE  the folder (default: .meshwork/gpu-bundle)
#   PYTHON               the python3 whose pip downloads the wheels (default: python3)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bundle="${MESHWORK_GPU_BUNDLE:-$root/.meshwork/gpu-bundle}"
python="${PYTHON:-python3}"
limit_mib=64

log() { echo "[gpu-bundle] $*"; }
die() { echo "[gpu-bundle] error: $*" >&2; exit 1; }

# What the trainer (control plane off) and its tests find with find_package, and the packages
# their CMake configs need in turn: prometheus-cpp's config finds civetweb, ZLIB and CURL and
# checks that its core, pull and push libraries exist; civetweb's checks for its server binary.
# meshwork-train links only yaml-cpp and prometheus-cpp-core; the tests add GoogleTest's static
# libraries. Runtime libraries come along so that every symlink and imported file resolves.
packages=(
  libyaml-cpp-dev libyaml-cpp0.7
  nlohmann-json3-dev
  prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libprometheus-cpp-push1.0
  libcivetweb-dev libcivetweb1 civetweb
  zlib1g-dev zlib1g
  libcurl4-openssl-dev libcurl4
  libgtest-dev libgmock-dev
)
# The headers that cuda_runtime_api.h and nccl.h include but torch's wheels do not bring (the
# cuda-toolkit 13.0.2 release, as torch 2.11's nvidia-cuda-runtime 13.0.96), and the build tools.
wheels=(
  nvidia-cuda-crt==13.0.88
  nvidia-cuda-cccl==13.0.85
  cmake==3.31.6
  ninja==1.13.0
)

command -v apt-get >/dev/null || die "apt-get not found: run this on the Debian 12 CPU machine"
"$python" -m pip --version >/dev/null 2>&1 || die "$python has no pip (Debian: apt-get install python3-pip)"

rm -rf "$bundle.tmp"
mkdir -p "$bundle.tmp/debs" "$bundle.tmp/wheels"

log "downloading ${#packages[@]} Debian packages"
# apt-get download writes into the current folder; its sandbox user may not write ours.
if ! (cd "$bundle.tmp/debs" && apt-get download -q -o APT::Sandbox::User=root "${packages[@]}"); then
  log "apt-get download failed: refreshing the package lists once"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q
  (cd "$bundle.tmp/debs" && apt-get download -q -o APT::Sandbox::User=root "${packages[@]}") ||
    die "apt-get download ${packages[*]} failed"
fi

log "downloading ${wheels[*]}"
"$python" -m pip download --quiet --no-deps --only-binary=:all: --dest "$bundle.tmp/wheels" \
  --implementation cp --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  "${wheels[@]}" || die "pip could not download ${wheels[*]} (is PyPI reachable?)"

# What is in it, for the record and for gpu-build.sh's checks.
{
  echo "# made by scripts/gpu-bundle.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  for f in "$bundle.tmp"/debs/*.deb; do
    dpkg-deb -f "$f" Package Version | sed 's/^[^:]*: //' | paste -sd' '
  done
  (cd "$bundle.tmp/wheels" && ls)
} >"$bundle.tmp/MANIFEST"

size_kib=$(du -sk "$bundle.tmp" | cut -f1)
((size_kib <= limit_mib * 1024)) || die "the bundle is $((size_kib / 1024)) MiB, over $limit_mib MiB"
rm -rf "$bundle"
mv "$bundle.tmp" "$bundle"
log "$bundle: $(ls "$bundle/debs" | wc -l) .deb, $(ls "$bundle/wheels" | wc -l) wheels, $((size_kib / 1024)) MiB"
log "on the GPU machine: scripts/gpu-build.sh (with $bundle carried there; docs/gpu.md)"
