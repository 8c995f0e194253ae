#!/usr/bin/env bash
# Builds Meshwork's container images with podman on Debian 12, where no image registry may be
# reachable: the Debian bookworm base images are made here with debootstrap from the machine's
# Debian mirror, then images/operator/Dockerfile and images/trainer-cpu/Dockerfile (and, when
# named, the GPU trainer's images/trainer/Dockerfile) are built on them and tagged as the Helm
# chart's and the examples' defaults. docs/images.md says what is in the
# images, what was measured and what is not verified. tests/images/images_smoke.sh runs them.
#
# usage: scripts/images.sh [base] [operator] [trainer-cpu] [trainer]
#   what to build (default: base operator trainer-cpu); the base is made once and kept in the
#   cache folder. trainer is the GPU trainer (torch 2.11 + CUDA 13 from PyPI, about 4 GB; its
#   build needs no GPU)
#
#   MESHWORK_IMAGES_DIR            cache: the base's root file systems and the build logs
#                                  (default .meshwork/images)
#   MESHWORK_DEBIAN_MIRROR         where debootstrap and the images' apt-get download Debian from
#                                  (default: the machine's apt sources, else http://deb.debian.org/debian)
#   MESHWORK_DEBIAN_SECURITY       the security archive (default: likewise, .../debian-security)
#   MESHWORK_IMAGES_ISOLATION      oci: RUN steps in runc containers; chroot: buildah's chroot
#                                  isolation, which needs no OCI runtime; auto (default): oci when
#                                  a container runs here, else chroot (and says why)
#
# Exit codes: 1 a Dockerfile's build failed (its log is named), 2 bad arguments, 3 invalid input
# (a Dockerfile or the chart's default image is missing), 4 I/O (debootstrap, an unreachable
# mirror included; import; disk), 5 unavailable (not root, not Debian 12, podman, runc or debootstrap cannot be installed).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${MESHWORK_IMAGES_DIR:-$root/.meshwork/images}"
isolation="${MESHWORK_IMAGES_ISOLATION:-auto}"

log() { echo "[images] $*"; }
die() {
  local code=$1
  shift
  echo "[images] error: $*" >&2
  exit "$code"
}

wanted=("$@")
((${#wanted[@]})) || wanted=(base operator trainer-cpu)
for w in "${wanted[@]}"; do
  case "$w" in
    base | operator | trainer-cpu | trainer) ;;
    *) die 2 "unknown image '$w' (base, operator, trainer-cpu or trainer)" ;;
  esac
done
case "$isolation" in
  auto | oci | chroot) ;;
  *) die 2 "MESHWORK_IMAGES_ISOLATION='$isolation': must be auto, oci or chroot" ;;
esac
wants() { [[ " ${wanted[*]} " == *" $1 "* ]]; }

# debootstrap and podman's root storage (/var/lib/containers) need root; rootless podman would
# keep its images in another store, out of sight of the tests.
[ "$(id -u)" -eq 0 ] || die 5 "run as root: debootstrap and podman's root image store need it"
grep -qs '^VERSION_CODENAME=bookworm' /etc/os-release ||
  die 5 "this script uses Debian 12 (bookworm) packages: podman 4.3, runc, debootstrap; this machine is $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-unknown}")"

# The engine: podman (its build is buildah's), runc as its OCI runtime, debootstrap for the base.
# Debian 12's crun 1.8 refuses a cgroup v1 host with any controller on the v2 hierarchy ("cgroups
# in hybrid mode not supported, drop all controllers from cgroupv2"); runc runs on it and on v2.
packages=(podman runc debootstrap)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; } ||
    die 5 "could not install ${missing[*]} with apt-get (no Debian mirror?)"
fi
podman=(podman --runtime runc)

mkdir -p "$cache/logs" || die 4 "cannot create $cache"
# One run at a time: two would debootstrap into the same folder.
exec 9>"$cache/lock"
flock -n 9 || { log "another scripts/images.sh holds $cache/lock; waiting for it"; flock 9; }

# The mirror the machine's apt uses (deb822 or one-line sources), so the images download from
# where apt here does. Only sources of the suite's main component count: a third-party repository
# for bookworm (Docker's: .../linux/debian bookworm stable) is not Debian's archive.
apt_uri() {  # apt_uri SUITE: the first configured URI serving SUITE's main (bookworm, bookworm-security)
  { awk -v suite="$1" 'BEGIN { RS = "" } {
        uris = ""; ok = 0; main = 0
        n = split($0, lines, "\n")
        for (i = 1; i <= n; i++) {
          if (lines[i] ~ /^URIs:/) uris = substr(lines[i], 6)
          if (lines[i] ~ /^Suites:/) { m = split(substr(lines[i], 8), ss, " "); for (j = 1; j <= m; j++) if (ss[j] == suite) ok = 1 }
          if (lines[i] ~ /^Components:/) { m = split(substr(lines[i], 12), cs, " "); for (j = 1; j <= m; j++) if (cs[j] == "main") main = 1 }
        }
        if (ok && main) { m = split(uris, us, " "); for (j = 1; j <= m; j++) print us[j] }
      }' /etc/apt/sources.list.d/*.sources /dev/null 2>/dev/null
    grep -hsE '^deb[[:space:]]' /etc/apt/sources.list /etc/apt/sources.list.d/*.list /dev/null |
      awk -v suite="$1" '{ sub(/\[[^]]*\]/, ""); main = 0; for (i = 4; i <= NF; i++) if ($i == "main") main = 1
                           if ($3 == suite && main) print $2 }'
  } | sed 's#/*$##' | head -n 1 || true
}
mirror="${MESHWORK_DEBIAN_MIRROR:-$(apt_uri bookworm)}"
mirror="${mirror:-http://deb.debian.org/debian}"
security="${MESHWORK_DEBIAN_SECURITY:-$(apt_uri bookworm-security)}"
security="${security:-${mirror%/debian}/debian-security}"

# make_base DIR: the two root file systems debian:bookworm and debian:bookworm-slim are made of,
# as Debian's official images are (debuerreotype): debootstrap's minbase variant, apt pointed at
# bookworm, its updates and security, downloaded packages and lists removed after each apt run;
# the slim one also leaves out documentation, manual pages and translations, now and for every
# package installed on it later (dpkg's path-exclude).
make_base() {
  local dir=$1 rootfs=$1/rootfs slim=$1/rootfs-slim
  rm -rf "$rootfs" "$slim"
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$dir/debootstrap.log" 2>&1 || {
    tail -n 20 "$dir/debootstrap.log" >&2
    return 1
  }
  rm -f "$rootfs/etc/apt/sources.list"
  cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  echo 'Acquire::Languages "none";' >"$rootfs/etc/apt/apt.conf.d/docker-no-languages"
  # The engine provides these at run time; device nodes and the build machine's DNS stay out.
  rm -rf "$rootfs"/dev/* "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
  find "$rootfs/var/log" -type f -delete
  : >"$rootfs/etc/resolv.conf"
  : >"$rootfs/etc/hostname"
  cp -a "$rootfs" "$slim"
  cat >"$slim/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
EOF
  find "$slim/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
  local d
  for d in groff info linda lintian/overrides locale man; do
    [ -d "$slim/usr/share/$d" ] && find "$slim/usr/share/$d" -mindepth 1 -delete
  done
  find "$slim/usr/share/doc" -mindepth 1 -type d -empty -delete
  tar --numeric-owner -C "$rootfs" -cf "$dir/bookworm.tar" . &&
    tar --numeric-owner -C "$slim" -cf "$dir/bookworm-slim.tar" . &&
    rm -rf "$rootfs" "$slim"
}

# The base's identity: the recipe above and the mirrors. A change to either makes it again.
base_id="$({ declare -f make_base; echo "$mirror $security"; } | sha256sum | cut -c1-16)"
base_dir="$cache/base"
if wants base || wants operator || wants trainer-cpu || wants trainer; then
  mkdir -p "$base_dir"
  if [ "$(cat "$base_dir/id" 2>/dev/null)" != "$base_id" ] || [ ! -f "$base_dir/bookworm.tar" ] ||
     [ ! -f "$base_dir/bookworm-slim.tar" ]; then
    log "making the Debian bookworm base with debootstrap from $mirror (about 1 min; later runs reuse it)"
    start=$SECONDS
    rm -f "$base_dir/id"
    make_base "$base_dir" || die 4 "debootstrap of bookworm from $mirror failed: $base_dir/debootstrap.log"
    echo "$base_id" >"$base_dir/id"
    log "made the base in $((SECONDS - start)) s ($base_dir)"
  fi
  # Imported under localhost/, so that no registry name is claimed; the Dockerfiles' defaults
  # (debian:bookworm, debian:bookworm-slim) resolve to these too where no other is stored.
  for name in bookworm bookworm-slim; do
    have="$("${podman[@]}" image inspect -f '{{index .Labels "dev.meshwork.base"}}' "localhost/debian:$name" 2>/dev/null || true)"
    if [ "$have" != "$base_id" ]; then
      "${podman[@]}" import -q --change 'CMD ["bash"]' --change "LABEL dev.meshwork.base=$base_id" \
        "$base_dir/$name.tar" "localhost/debian:$name" >/dev/null ||
        die 4 "podman import of $base_dir/$name.tar as localhost/debian:$name failed"
      log "imported localhost/debian:$name"
    fi
  done
fi

# The tags: the operator's is the chart's default (image.repository, and appVersion for an empty
# image.tag); the CPU trainer's is the one the CPU examples name (the GPU trainer, images/trainer,
# is ghcr.io/meshwork/trainer:VERSION without the -cpu).
values="$root/charts/meshwork-operator/values.yaml"
operator_repo="$(awk '/^image:/ { in_image = 1; next } /^[^[:space:]#]/ { in_image = 0 } in_image && $1 == "repository:" { print $2; exit }' "$values" 2>/dev/null)"
version="$(awk '$1 == "appVersion:" { gsub(/"/, "", $2); print $2; exit }' "$root/charts/meshwork-operator/Chart.yaml" 2>/dev/null)"
[ -n "$operator_repo" ] && [ -n "$version" ] ||
  die 3 "no image.repository in $values or no appVersion in charts/meshwork-operator/Chart.yaml"
operator_image="$operator_repo:$version"
trainer_image="$(awk '$1 == "image:" { print $2; exit }' "$root/examples/trainingjob-tiny-cpu.yaml" 2>/dev/null)"
[ "$trainer_image" = "${trainer_image%:*}:$version-cpu" ] ||
  die 3 "spec.image in examples/trainingjob-tiny-cpu.yaml is '$trainer_image': the CPU trainer's tag is REPOSITORY:$version-cpu (the chart's appVersion)"
gpu_trainer_image="$(awk '$1 == "image:" { print $2; exit }' "$root/examples/trainingjob-llama3-1b-gpu.yaml" 2>/dev/null)"
[ "$gpu_trainer_image" = "${trainer_image%:*}:$version" ] ||
  die 3 "spec.image in examples/trainingjob-llama3-1b-gpu.yaml is '$gpu_trainer_image': the GPU trainer's tag is ${trainer_image%:*}:$version"
revision="$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
git -C "$root" diff --quiet HEAD 2>/dev/null || revision="$revision-dirty"

# RUN steps in containers when one runs here; else buildah's chroot isolation, which builds the
# same layers without an OCI runtime (no cgroups, no namespaces but mount).
if [ "$isolation" = auto ] && { wants operator || wants trainer-cpu || wants trainer; }; then
  if probe="$("${podman[@]}" run --rm --network none --ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" \
                --ulimit nproc=32768:32768 localhost/debian:bookworm-slim true 2>&1)"; then
    isolation=oci
  else
    isolation=chroot
    log "no container runs here, so RUN steps use chroot isolation: $probe"
  fi
fi

# build NAME DOCKERFILE ESTIMATE_MIN TAG...: podman build of DOCKERFILE (context: the repository,
# .dockerignore applied) on the local base, the full log in $cache/logs/NAME.log, the steps shown.
build() {
  local name=$1 dockerfile=$2 estimate=$3 tag=$4
  shift 4
  [ -f "$root/$dockerfile" ] || die 3 "no $dockerfile"
  local tags=(-t "$tag") t
  for t in "$@"; do tags+=(-t "$t"); done
  log "building $tag from $dockerfile (a first build: about $estimate min on $(nproc) cores; unchanged layers are reused)"
  local start=$SECONDS status
  # --network host: the RUN steps' apt-get reaches the mirror as this machine does, with no
  # bridge or firewall rules made for it. --pull=never: the bases are the local ones.
  {
    "${podman[@]}" build --pull=never --network host --isolation "$isolation" --layers \
      --build-arg BUILDER_IMAGE=localhost/debian:bookworm --build-arg RUNTIME_IMAGE=localhost/debian:bookworm-slim \
      --build-arg VERSION="$version" --build-arg REVISION="$revision" "${secret[@]}" \
      -f "$root/$dockerfile" "${tags[@]}" "$root" 2>&1
    echo $? >"$cache/logs/$name.status"
  } | tee "$cache/logs/$name.log" | grep --line-buffered -oE '^(\[[0-9]+/[0-9]+\] )?STEP [0-9]+/[0-9]+: (FROM|RUN).{0,100}' || true
  status="$(cat "$cache/logs/$name.status")"
  if ((status != 0)); then
    tail -n 30 "$cache/logs/$name.log" >&2
    die 1 "podman build of $dockerfile failed (exit $status); the whole log: $cache/logs/$name.log"
  fi
  log "built $tag in $((SECONDS - start)) s"
}

secret=()
wants operator && build operator images/operator/Dockerfile 12 "$operator_image"
wants trainer-cpu && build trainer-cpu images/trainer-cpu/Dockerfile 25 "$trainer_image"
# pip in the GPU build downloads from PyPI over HTTPS: where this machine trusts an extra
# certificate authority (an egress proxy's), the build gets this machine's bundle as a secret.
ca_bundle=/etc/ssl/certs/ca-certificates.crt
secret=()
[ -s "$ca_bundle" ] && secret=(--secret "id=pip-ca,src=$ca_bundle")
wants trainer && build trainer images/trainer/Dockerfile 20 "$gpu_trainer_image"

# Sizes: what the image takes unpacked in the store (podman's SIZE).
images=()
wants base && images+=(localhost/debian:bookworm localhost/debian:bookworm-slim)
wants operator && images+=("$operator_image")
wants trainer-cpu && images+=("$trainer_image")
wants trainer && images+=("$gpu_trainer_image")
for image in "${images[@]}"; do
  bytes="$("${podman[@]}" image inspect -f '{{.Size}}' "$image")"
  log "$(printf '%-45s %6d MB' "$image" $((bytes / 1000 / 1000)))"
done
