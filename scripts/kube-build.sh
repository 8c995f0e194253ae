#!/usr/bin/env bash
# Builds the real Kubernetes components the local cluster runs (docs/cluster.md) from their
# Go modules, pinned in tools/*/go.mod: kube-apiserver, kube-controller-manager, kube-scheduler
# and kubectl (k8s.io/kubernetes v1.37.2), etcd (go.etcd.io/etcd/server/v3 v3.6.16), the CNI
# reference plugins bridge, host-local and loopback (github.com/containernetworking/plugins v1.10.0,
# into cni/: the node agent gives each Pod its network namespace with them), helm
# (helm.sh/helm/v3 v3.22.0) and Kueue (sigs.k8s.io/kueue v0.17.0, with its CRDs in kueue-crds/),
# into .meshwork/kube/bin, plus the scheduler-plugins PodGroup CRD (scheduler-plugins-crds/). Go's module and build caches live in
# .meshwork/go while it builds; a module whose go.mod, go.sum and Go version are unchanged since
# its last build is skipped. Called by scripts/setup.sh.
#
# usage: scripts/kube-build.sh [kubernetes] [etcd] [cni] [helm] [kueue]
#   the modules to build (default: all five); scripts/demo.sh's set-up builds only what the local
#   cluster runs (kubernetes, etcd, cni), the tests need helm and Kueue too
#
#   MESHWORK_KUBE_BIN       where the binaries go (default .meshwork/kube/bin)
#   MESHWORK_KEEP_GO_CACHE  1: keep Go's module and build caches (about 8 GB) after a build, so
#                           that a change to one tools/*/go.mod rebuilds only what it touches.
#                           Default 0: they are removed once every binary is built (the stamps
#                           skip the next run's builds), which keeps a fresh checkout's test run
#                           (scripts/test.sh) about 8 GB smaller on disk
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${MESHWORK_KUBE_BIN:-$root/.meshwork/kube/bin}"
command -v go >/dev/null || { echo "[kube-build] no go on PATH: the Go toolchain is needed to build the Kubernetes components" >&2; exit 1; }
export GOMODCACHE="$root/.meshwork/go/mod" GOCACHE="$root/.meshwork/go/build" GOFLAGS="-buildvcs=false -modcacherw"
# The machine's Go builds these releases; never download another toolchain behind the user's back.
export GOTOOLCHAIN=local
# Static binaries without cgo, as the upstream releases of these components are built (Kubernetes'
# hack/lib/golang.sh builds its servers and kubectl with CGO_ENABLED=0; etcd, helm and Kueue ship
# the same way): no C compiler runs, and name lookups use Go's own resolver (/etc/hosts, then
# resolv.conf). The compiler writes no DWARF, which "-ldflags -s -w" dropped at link time anyway.
# A small saving, every first build: 582 s -> 565 s for the four builds on 2 cores (helm alone,
# with a warm module cache: 78 s -> 67 s); the binaries are 20% smaller.
export CGO_ENABLED=0
gcflags="all=-dwarf=false"
mkdir -p "$out"
wanted=("$@")
((${#wanted[@]})) || wanted=(kubernetes etcd cni helm kueue)
for w in "${wanted[@]}"; do
  case "$w" in
    kubernetes | etcd | cni | helm | kueue) ;;
    *) echo "[kube-build] unknown module '$w' (kubernetes, etcd, cni, helm or kueue)" >&2; exit 2 ;;
  esac
done
wants() { [[ " ${wanted[*]} " == *" $1 "* ]]; }
# What a first build takes on 2 cores (measured; seconds), for the progress lines.
declare -A first_build_seconds=([kubernetes]=445 [etcd]=33 [cni]=40 [helm]=55 [kueue]=152)

# build MODULE-DIR "BINARIES" GO-BUILD-ARGS...: go build in tools/MODULE-DIR, unless its stamp
# says the same go.mod, go.sum, arguments and Go built every one of BINARIES already.
build() {
  local module=$1 dir="$root/tools/$1" binaries=$2 stamp="$out/.stamp-$1" want have="" missing=0 b
  shift 2
  want="$({ cat "$dir/go.mod" "$dir/go.sum"; echo "$*"; } | sha256sum | cut -d' ' -f1) $(go env GOVERSION)"
  [ -f "$stamp" ] && have="$(cat "$stamp")"
  for b in $binaries; do [ -x "$out/$b" ] || missing=1; done
  if [ "$want" = "$have" ] && [ $missing = 0 ]; then
    echo "[kube-build] $binaries: up to date in $out"
    return
  fi
  local estimate=$(( ${first_build_seconds[$module]:-60} * 2 / $(nproc) ))
  echo "[kube-build] building $binaries (a first build: about $(( (estimate + 59) / 60 )) min on $(nproc) cores; later runs skip it)"
  local start=$SECONDS
  (cd "$dir" && go build -trimpath "$@")
  echo "$want" >"$stamp"
  echo "[kube-build] built $binaries in $((SECONDS - start)) s"
}

# The release, stamped as Kubernetes' own build does (hack/lib/version.sh): without it the
# components report v0.0.0, and clients that check the server's version (helm's kubeVersion) refuse.
kube_version="$(awk '$1 == "k8s.io/kubernetes" {print $2}' "$root/tools/kubernetes/go.mod" | head -1)"
[ -n "$kube_version" ] || { echo "[kube-build] no k8s.io/kubernetes version in tools/kubernetes/go.mod" >&2; exit 1; }
kube_minor="$(cut -d. -f2 <<<"$kube_version")"
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$kube_minor"
  kube_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
wants kubernetes && build kubernetes "kube-apiserver kube-controller-manager kube-scheduler kubectl" -gcflags "$gcflags" -ldflags "$kube_ldflags" -o "$out/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
# etcd's main package is its module's root: named explicitly, or go would call it "server".
wants etcd && build etcd etcd -gcflags "$gcflags" -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3
# The CNI reference plugins, called by the node agent as a kubelet's container runtime calls them
# (docs/controlplane-agent.md, "Pod networks"); the bridge plugin needs no iptables without ipMasq.
if wants cni; then
  mkdir -p "$out/cni"
  build cni "cni/bridge cni/host-local cni/loopback" -gcflags "$gcflags" -ldflags "-s -w" -o "$out/cni/" \
    github.com/containernetworking/plugins/plugins/main/bridge \
    github.com/containernetworking/plugins/plugins/ipam/host-local \
    github.com/containernetworking/plugins/plugins/main/loopback
fi
wants helm && build helm helm -gcflags "$gcflags" -ldflags "-s -w" -o "$out/" helm.sh/helm/v3/cmd/helm
# Kueue's controller manager (sigs.k8s.io/kueue), for the e2e test of TrainingJobs queued by it,
# and its CRDs from the same module, into $out/kueue-crds/; with it the scheduler-plugins CRD,
# which tools/kueue's go.mod also pins. Only the tests use them.
if wants kueue; then
  build kueue kueue -gcflags "$gcflags" -ldflags "-s -w" -o "$out/kueue" sigs.k8s.io/kueue/cmd/kueue
  kueue_version="$(awk '$1 == "sigs.k8s.io/kueue" {print $2}' "$root/tools/kueue/go.mod" | head -1)"
  if [ "$(cat "$out/.stamp-kueue-crds" 2>/dev/null)" != "$kueue_version" ]; then
    dir="$(cd "$root/tools/kueue" && go mod download -json "sigs.k8s.io/kueue@$kueue_version" |
      awk -F'"' '$2 == "Dir" {print $4}')"
    [ -n "$dir" ] || { echo "[kube-build] could not download sigs.k8s.io/kueue@$kueue_version" >&2; exit 1; }
    rm -rf "$out/kueue-crds" && mkdir -p "$out/kueue-crds"
    cp "$dir"/config/components/crd/bases/*.yaml "$out/kueue-crds/"
    echo "$kueue_version" >"$out/.stamp-kueue-crds"
  fi
  # The scheduler-plugins PodGroup CRD (scheduling.x-k8s.io/v1alpha1, the Coscheduling plugin's), so
  # that gang_e2e checks the operator's PodGroups against the real schema. Only the CRD: the
  # scheduler itself (a kube-scheduler of another Kubernetes release) is not built.
  scheduler_plugins_version=v0.33.5
  if [ ! -f "$out/scheduler-plugins-crds/scheduling.x-k8s.io_podgroups.yaml" ] ||
    [ "$(cat "$out/scheduler-plugins-crds/VERSION" 2>/dev/null)" != "$scheduler_plugins_version" ]; then
    dir="$(cd "$root/tools/kueue" && go mod download -json "sigs.k8s.io/scheduler-plugins@$scheduler_plugins_version" |
      awk -F'"' '$2 == "Dir" {print $4}')"
    [ -n "$dir" ] || { echo "[kube-build] could not download sigs.k8s.io/scheduler-plugins@$scheduler_plugins_version" >&2; exit 1; }
    rm -rf "$out/scheduler-plugins-crds" && mkdir -p "$out/scheduler-plugins-crds"
    cp "$dir/config/crd/bases/scheduling.x-k8s.io_podgroups.yaml" "$out/scheduler-plugins-crds/"
    echo "$scheduler_plugins_version" >"$out/scheduler-plugins-crds/VERSION"
  fi
fi

# Everything is built: the caches only speed up a rebuild after a go.mod changes.
# Renamed at once, so that no later build finds half a cache, and deleted in the background: about
# 8 GB in many small files takes a minute on 2 cores, which the set-up need not wait for.
if [ -d "$root/.meshwork/go" ] && [ "${MESHWORK_KEEP_GO_CACHE:-0}" != 1 ]; then
  echo "[kube-build] removing Go's caches (.meshwork/go, in the background); MESHWORK_KEEP_GO_CACHE=1 keeps them"
  mv "$root/.meshwork/go" "$root/.meshwork/go.removing.$$"
fi
for trash in "$root"/.meshwork/go.removing.*; do
  [ -e "$trash" ] && nohup rm -rf "$trash" >/dev/null 2>&1 &
done
