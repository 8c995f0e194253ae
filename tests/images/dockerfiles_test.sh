#!/usr/bin/env bash
# Static checks of the container images' Dockerfiles (images/*/Dockerfile); no Docker engine needed.
#
#   dockerfiles_test.sh SOURCE_DIR [OPERATOR_BINARY]
#
# For every Dockerfile: more than one stage; the final stage runs as a numeric non-root USER and
# has an ENTRYPOINT; every `--target X` is an add_executable of the project; every -DNAME=... given
# to the project's cmake (`cmake -S .`) is an option or cache variable the project defines (CMAKE_*
# are CMake's own); every package apt-get installs in a debian:bookworm stage exists in Debian 12
# (apt-cache show; skipped, saying why, off Debian 12 or without apt-cache); the configuration
# the image builds (its -D flags) is made here and each --target links only targets of it.
# With OPERATOR_BINARY (a built meshwork-operator): every library ldd resolves for it is in a
# package the operator image's final stage installs, one of their dependencies, or a package every
# Debian system has (Priority: required, which debian:bookworm-slim keeps).
set -uo pipefail

root="${1:?usage: dockerfiles_test.sh SOURCE_DIR [OPERATOR_BINARY]}"
operator_binary="${2:-}"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok:   $*"; }
note() { echo "note: $*"; }

# The project's CMake files, build folders left out.
cmake_files=()
while IFS= read -r f; do cmake_files+=("$f"); done < <(
  find "$root" \( -path "$root/build" -o -path "$root/build-*" -o -path "$root/.git" -o -path "$root/.meshwork" \) -prune \
    -o \( -name CMakeLists.txt -o -name '*.cmake' \) -type f -print)
if ((${#cmake_files[@]} == 0)); then
  echo "FAIL: no CMake files under $root"
  exit 1
fi

# Instructions one per line: comment lines dropped, backslash continuations joined.
logical_lines() {
  grep -v '^[[:space:]]*#' "$1" | awk '{ if (sub(/\\[[:space:]]*$/, "")) { buf = buf $0 " "; next } print buf $0; buf = "" } END { if (buf != "") print buf }'
}

# Debian 12 here? apt-cache answers for this machine's package lists only.
apt_reason=""
if ! command -v apt-cache >/dev/null; then
  apt_reason="apt-cache is not installed"
elif ! grep -qs '^VERSION_CODENAME=bookworm' /etc/os-release; then
  apt_reason="this machine is not Debian 12 (bookworm), so its apt-cache cannot say what bookworm has"
fi

# "PACKAGE PRIORITY" for each of the named packages apt-cache knows (one call: it is slow).
known_packages() {
  apt-cache show "$@" 2>/dev/null | awk '/^Package:/ { p = $2 } /^Priority:/ { print p, $2 }' | sort -u
}

# Packages apt-get installs in one stage's lines (stdin).
apt_packages() {
  grep -oE 'apt-get install[^;&|]*' | sed -E 's/^apt-get install//' | tr ' ' '\n' | grep -vE '^(-.*)?$' | sort -u
}

dockerfiles=("$root"/images/*/Dockerfile)
if [ ! -f "${dockerfiles[0]}" ]; then
  echo "FAIL: no images/*/Dockerfile under $root"
  exit 1
fi

for dockerfile in "${dockerfiles[@]}"; do
  name="${dockerfile#"$root"/}"
  echo "== $name"
  lines="$(logical_lines "$dockerfile")"

  # Stages.
  froms="$(grep -ciE '^[[:space:]]*FROM[[:space:]]' <<<"$lines")"
  if ((froms >= 2)); then pass "$name: $froms stages"; else fail "$name: $froms FROM line(s); a multi-stage build has at least 2"; fi
  final_stage="$(awk 'tolower($0) ~ /^[[:space:]]*from[[:space:]]/ { buf = "" } { buf = buf $0 "\n" } END { printf "%s", buf }' <<<"$lines")"

  # Non-root numeric USER in the final stage (the last USER wins).
  user="$(grep -iE '^[[:space:]]*USER[[:space:]]' <<<"$final_stage" | tail -n 1 | awk '{ print $2 }')"
  uid="${user%%:*}"
  if [ -z "$user" ]; then
    fail "$name: the final stage has no USER (it would run as root)"
  elif ! [[ "$uid" =~ ^[0-9]+$ ]]; then
    fail "$name: USER $user is not numeric (runAsNonRoot cannot check a name)"
  elif ((uid == 0)); then
    fail "$name: USER $user is root"
  else
    pass "$name: final stage runs as USER $user"
  fi

  # ENTRYPOINT in the final stage.
  entrypoint="$(grep -iE '^[[:space:]]*ENTRYPOINT[[:space:]]' <<<"$final_stage" | tail -n 1)"
  if [ -n "$entrypoint" ]; then pass "$name: ${entrypoint#"${entrypoint%%[![:space:]]*}"}"; else fail "$name: the final stage has no ENTRYPOINT"; fi

  # Every --target is an executable of the project.
  # (--target X, or MESHWORK_CUDA_TARGET=X for scripts/cuda-flavor.sh)
  targets="$({ grep -oE -- '--target[[:space:]]+[A-Za-z0-9_.+-]+' <<<"$lines" | awk '{ print $2 }'
               grep -oE 'MESHWORK_CUDA_TARGET=[A-Za-z0-9_.+-]+' <<<"$lines" | cut -d= -f2; } | sort -u)"
  [ -n "$targets" ] || fail "$name: builds no --target (it would build everything)"
  for t in $targets; do
    if grep -qE "add_executable\([[:space:]]*${t//./\\.}([[:space:]]|\))" "${cmake_files[@]}"; then
      pass "$name: --target $t is an add_executable of the project"
    else
      fail "$name: --target $t is not an add_executable in the project's CMake files"
    fi
  done

  # Every -DNAME= given to the project's configure is defined by the project (or is CMake's own).
  configure="$(grep -E 'cmake[[:space:]]+-S[[:space:]]+\.[[:space:]]' <<<"$lines")"
  script="$(grep -oE 'scripts/[A-Za-z0-9_-]+\.sh' <<<"$lines" | head -n 1)"
  if [ -n "$configure" ]; then
    :
  elif [ -n "$script" ] && [ -x "$root/$script" ]; then
    pass "$name: configured and built by $script (its own configure)"
  else
    fail "$name: no 'cmake -S .' configure of the project, nor a scripts/*.sh of the project that builds it"
  fi
  for var in $(grep -oE -- '-D[A-Za-z_][A-Za-z0-9_]*(:[A-Z]+)?=' <<<"$configure" | sed -E 's/^-D//; s/(:[A-Z]+)?=$//' | sort -u); do
    if [[ "$var" == CMAKE_* ]]; then
      pass "$name: -D$var (CMake's own)"
    elif grep -qE "(option|find_library|find_path|find_program|find_file)\([[:space:]]*${var}[[:space:]]|set\([[:space:]]*${var}[[:space:]].*[[:space:]]CACHE[[:space:]]" "${cmake_files[@]}"; then
      pass "$name: -D$var is an option or cache variable of the project"
    else
      fail "$name: -D$var is not an option or cache variable the project's CMake defines"
    fi
  done

  # The configuration the image builds, made here: each --target links only targets of that
  # configuration. A library that is no target there (one under a switched-off subdirectory)
  # appears as a bare -l<name> and fails the image's link, not this machine's full build.
  # Configurations whose flags come from the image's shell (CUDA's, with $torch_prefix) are
  # made only in their image.
  flags="$(grep -oE -- '-D[A-Za-z_][A-Za-z0-9_]*(:[A-Z]+)?=[^[:space:]]+' <<<"$configure")"
  if [ -z "$configure" ]; then
    :
  elif grep -q '\$' <<<"$flags"; then
    note "$name: its configuration is not made here: its flags are set by the image's shell"
  elif ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
    note "$name: its configuration is not made here: cmake or ninja is not installed"
  else
    config_dir="$(mktemp -d)"
    # shellcheck disable=SC2086  # the flags are words
    if ! cmake -S "$root" -B "$config_dir" -G Ninja $flags >"$config_dir/configure.log" 2>&1; then
      if grep -qE 'Could NOT find|Could not find a package' "$config_dir/configure.log"; then
        note "$name: its configuration is not made here, a dependency is missing: $(grep -m 1 -E 'Could NOT find|Could not find a package' "$config_dir/configure.log")"
      else
        fail "$name: cmake $(tr '\n' ' ' <<<"$flags")fails: $(grep -m 3 -A 2 'CMake Error' "$config_dir/configure.log" | tr '\n' ' ')"
      fi
    else
      for t in $targets; do
        link="$(ninja -C "$config_dir" -t commands "$t" 2>/dev/null | tail -n 1)"
        bare="$(grep -oE -- '(^|[[:space:]])-lmeshwork[A-Za-z0-9_]*' <<<"$link" | sort -u | tr -d ' ' | tr '\n' ' ')"
        if [ -z "$link" ]; then
          fail "$name: $t is no target of the configuration $(tr '\n' ' ' <<<"$flags")"
        elif [ -n "$bare" ]; then
          fail "$name: with $(tr '\n' ' ' <<<"$flags")$t links ${bare}which are no targets of that configuration"
        else
          pass "$name: with its flags $t links only targets of that configuration"
        fi
      done
    fi
    rm -rf "$config_dir"
  fi

  # Packages of debian:bookworm stages exist in Debian 12.
  declare -A arg_default=()
  while IFS= read -r a; do
    a="$(sed -E 's/^[[:space:]]*[Aa][Rr][Gg][[:space:]]+//' <<<"$a")"
    [[ "$a" == *=* ]] && arg_default["${a%%=*}"]="${a#*=}"
  done < <(awk 'tolower($0) ~ /^[[:space:]]*from[[:space:]]/ { exit } tolower($0) ~ /^[[:space:]]*arg[[:space:]]/ { print }' <<<"$lines")
  stage_index=0
  while IFS= read -r -d $'\x1e' stage; do
    [ -n "$stage" ] || continue
    stage_index=$((stage_index + 1))
    image="$(head -n 1 <<<"$stage" | awk '{ print $2 }')"
    if [[ "$image" =~ ^\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?$ ]]; then image="${arg_default[${BASH_REMATCH[1]}]:-$image}"; fi
    image="${image//\"/}"
    [[ "$image" == debian:bookworm* ]] || continue
    packages="$(apt_packages <<<"$stage")"
    [ -n "$packages" ] || continue
    if [ -n "$apt_reason" ]; then
      note "$name: stage $stage_index ($image) packages not checked: $apt_reason"
      continue
    fi
    known="$(known_packages $packages)"
    for p in $packages; do
      if grep -q "^$p " <<<"$known"; then pass "$name: stage $stage_index ($image): package $p exists in bookworm"; else fail "$name: stage $stage_index ($image): package $p is not a Debian 12 package"; fi
    done
  done < <(awk 'tolower($0) ~ /^[[:space:]]*from[[:space:]]/ && NR > 1 { printf "\036" } { print } END { printf "\036" }' \
             < <(sed -n '/^[[:space:]]*[Ff][Rr][Oo][Mm][[:space:]]/,$p' <<<"$lines"))
  unset arg_default
done

# The operator binary's libraries against the operator image's runtime packages.
operator_dockerfile="$root/images/operator/Dockerfile"
if [ -z "$operator_binary" ]; then
  note "operator runtime libraries not checked: no meshwork-operator binary given"
elif [ ! -x "$operator_binary" ]; then
  fail "no meshwork-operator binary at $operator_binary (build it first)"
elif [ -n "$apt_reason" ] || ! command -v dpkg >/dev/null || ! command -v ldd >/dev/null; then
  note "operator runtime libraries not checked: ${apt_reason:-dpkg or ldd is not installed}"
else
  echo "== $operator_binary against ${operator_dockerfile#"$root"/}"
  final_stage="$(logical_lines "$operator_dockerfile" | awk 'tolower($0) ~ /^[[:space:]]*from[[:space:]]/ { buf = "" } { buf = buf $0 "\n" } END { printf "%s", buf }')"
  runtime_packages="$(apt_packages <<<"$final_stage")"
  # What those packages bring with them.
  provided="$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces --no-enhances \
                $runtime_packages 2>/dev/null | grep -vE '^[[:space:]]|^<' | sed 's/:.*//' | sort -u)"
  owners=()
  while read -r lib path; do
    if [ "$path" = "not" ]; then fail "ldd: $lib not found here"; continue; fi
    real="$(readlink -f "$path")"
    owner="$(dpkg -S "$real" 2>/dev/null || dpkg -S "$path" 2>/dev/null)"
    owners+=("$lib $path $(head -n 1 <<<"$owner" | cut -d: -f1)")
  done < <(ldd "$operator_binary" | awk '$2 == "=>" { print $1, $3 }')
  mapfile -t owner_packages < <(printf '%s\n' "${owners[@]}" | awk 'NF == 3 { print $3 }' | sort -u)
  required="$(known_packages "${owner_packages[@]}" | awk '$2 == "required" { print $1 }')"
  for entry in "${owners[@]}"; do
    read -r lib path pkg <<<"$entry"
    if [ -z "$pkg" ]; then
      fail "$lib ($path) belongs to no Debian package"
    elif grep -qxF "$pkg" <<<"$provided"; then
      pass "$lib from $pkg: installed by the image's package list"
    elif grep -qxF "$pkg" <<<"$required"; then
      pass "$lib from $pkg: Priority required, in every Debian image"
    else
      fail "$lib comes from $pkg, which the operator image's final stage does not install"
    fi
  done
fi

if ((failures > 0)); then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
