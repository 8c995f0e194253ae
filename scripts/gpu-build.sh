#!/usr/bin/env bash
# Run on a GPU machine without internet or apt: builds the CUDA flavor (meshwork-train and the
# tests, control plane off) against the PyTorch of the machine's python3 and the CUDA runtime and
# NCCL that its wheels brought, using for everything else the bundle that scripts/gpu-bundle.sh
# made on a CPU machine, then runs the GPU tests (ctest -L gpu). Needs: a C++17 compiler, python3
# with torch (a CUDA build) and nvidia-nccl-cu13, and the bundle. Safe to run again.
#
#   MESHWORK_GPU_BUNDLE     the bundle (default: .meshwork/gpu-bundle)
#   MESHWORK_GPU_PREFIX     where the bundle is unpacked (default: .meshwork/gpu-prefix)
#   MESHWORK_GPU_BUILD_DIR  build folder (default: build-gpu)
#   MESHWORK_BUILD_TYPE     CMake build type (default: Release)
#   MESHWORK_JOBS           parallel compile jobs (default: nproc)
#   MESHWORK_CMAKE_ARGS     more CMake arguments, for the first configure of the build folder
#   MESHWORK_RUN_TESTS      1 (default): run ctest -L gpu after the build; 0: build only
#   PYTHON                  the python3 that holds torch (default: python3)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bundle="${MESHWORK_GPU_BUNDLE:-$root/.meshwork/gpu-bundle}"
prefix="${MESHWORK_GPU_PREFIX:-$root/.meshwork/gpu-prefix}"
build_dir="${MESHWORK_GPU_BUILD_DIR:-$root/build-gpu}"
build_type="${MESHWORK_BUILD_TYPE:-Release}"
jobs="${MESHWORK_JOBS:-$(nproc)}"
run_tests="${MESHWORK_RUN_TESTS:-1}"
python="${PYTHON:-python3}"

log() { echo "[gpu-build] $*"; }
die() { echo "[gpu-build] error: $*" >&2; exit 1; }

[ -f "$bundle/MANIFEST" ] ||
  die "no bundle at $bundle: run scripts/gpu-bundle.sh on a CPU machine and bring that folder here"
command -v "$python" >/dev/null || die "$python not found: set PYTHON to the python3 that holds torch"
command -v c++ >/dev/null || die "no C++ compiler (c++) on PATH"

# --- torch: found without importing it (importing needs a driver and every NVIDIA library) ---
torch_info="$("$python" - <<'EOF'
import importlib.metadata, importlib.util, os, re
spec = importlib.util.find_spec("torch")
if spec is None or not spec.submodule_search_locations:
    raise SystemExit("")
torch_dir = spec.submodule_search_locations[0]
with open(os.path.join(torch_dir, "version.py")) as f:
    m = re.search(r"^cuda\b[^=]*=\s*'([^']+)'", f.read(), re.M)
print(torch_dir, importlib.metadata.version("torch"), m.group(1) if m else "none")
EOF
)" || true
[ -n "$torch_info" ] || die "$python has no torch: use the python3 that holds PyTorch (PYTHON=...)"
read -r torch_dir torch_version torch_cuda <<<"$torch_info"
[ "$torch_cuda" != none ] || die "torch $torch_version at $torch_dir is a CPU build: a CUDA build is needed"
site="$(dirname "$torch_dir")"
[ -f "$site/nvidia/nccl/include/nccl.h" ] ||
  log "warning: no NCCL wheel at $site/nvidia/nccl (nvidia-nccl-cu13): CMake will look elsewhere"
log "torch $torch_version (CUDA $torch_cuda) at $torch_dir"

# --- unpack the bundle into a private prefix: .debs as they would lie under / ---------------
unpack_deb() {  # dpkg-deb where there is one, else ar + tar (a .deb is an ar archive)
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$1" "$prefix"
  else
    command -v ar >/dev/null || die "neither dpkg-deb nor ar found to unpack $1"
    local tmp member
    tmp="$(mktemp -d)"
    member="$(ar t "$1" | grep '^data\.tar')"
    (cd "$tmp" && ar x "$1" "$member")
    tar -xf "$tmp/$member" -C "$prefix"
    rm -rf "$tmp"
  fi
}
unpack_wheel() {  # a wheel is a zip; python3 is there for sure, unzip may not be
  "$python" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$1" "$2"
}
if ! cmp -s "$bundle/MANIFEST" "$prefix/.manifest"; then
  log "unpacking $bundle into $prefix"
  rm -rf "$prefix"
  mkdir -p "$prefix/wheels" "$prefix/tools"
  for deb in "$bundle"/debs/*.deb; do unpack_deb "$deb"; done
  # Debian's links may be absolute (libz.so -> /lib/x86_64-linux-gnu/libz.so.1.2.13): point them
  # into the prefix. Their CMake configs need no change: they locate themselves.
  while IFS= read -r link; do
    target="$(readlink "$link")"
    ln -sfn "$prefix$target" "$link"
  done < <(find "$prefix" -type l -lname '/*')
  for whl in "$bundle"/wheels/nvidia_*.whl; do unpack_wheel "$whl" "$prefix/wheels"; done
  cp "$bundle/MANIFEST" "$prefix/.manifest"
fi
multiarch=x86_64-linux-gnu

# --- cmake and ninja: the machine's, else the bundle's wheels --------------------------------
cmake_ok() {
  command -v cmake >/dev/null &&
    [ "$(printf '%s\n' 3.22 "$(cmake --version | sed -n '1s/[^0-9]*\([0-9.]*\).*/\1/p')" | sort -V | head -1)" = 3.22 ]
}
if ! cmake_ok || ! command -v ninja >/dev/null; then
  tools="$prefix/tools"
  if [ ! -x "$tools/cmake/data/bin/cmake" ]; then
    for whl in "$bundle"/wheels/cmake-*.whl "$bundle"/wheels/ninja-*.whl; do unpack_wheel "$whl" "$tools"; done
    chmod +x "$tools"/cmake/data/bin/* "$tools"/ninja-*.data/scripts/ninja
  fi
  cmake_ok || export PATH="$tools/cmake/data/bin:$PATH"
  command -v ninja >/dev/null || export PATH="$(dirname "$tools"/ninja-*.data/scripts/ninja):$PATH"
  log "using the bundle's build tools: $(command -v cmake), $(command -v ninja)"
fi

# --- configure, build, test --------------------------------------------------------------------
# The prefix comes first on every search path; pkg-config is kept out because its .pc files of
# the machine (or the prefix's, which say prefix=/usr) would point CMake at other copies.
if [ ! -f "$build_dir/build.ninja" ]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  log "configuring $build_dir ($build_type)"
  # shellcheck disable=SC2086  # MESHWORK_CMAKE_ARGS is a list of arguments
  cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" "${launcher[@]}" \
    -DCMAKE_PREFIX_PATH="$torch_dir/share/cmake;$prefix/usr;$prefix/usr/lib/$multiarch/cmake;$prefix/usr/share/cmake" \
    -DCMAKE_LIBRARY_PATH="$prefix/usr/lib/$multiarch;$prefix/lib/$multiarch" \
    -DCMAKE_INCLUDE_PATH="$prefix/usr/include" \
    -DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON \
    -DTORCH_LIBRARY="$torch_dir/lib/libtorch.so" \
    -DMESHWORK_CUDA_ROOTS="$prefix/wheels/nvidia/cu13" \
    -DMESHWORK_WITH_CUDA=ON -DMESHWORK_BUILD_CONTROLPLANE=OFF \
    ${MESHWORK_CMAKE_ARGS:-}
fi
log "building with $jobs jobs"
start=$SECONDS
cmake --build "$build_dir" -j "$jobs"
log "built in $((SECONDS - start)) s: $build_dir/trainer/meshwork-train"

if [ "$run_tests" = 1 ]; then
  log "ctest -L gpu"
  ctest --test-dir "$build_dir" --output-on-failure --no-tests=error -L gpu
fi
