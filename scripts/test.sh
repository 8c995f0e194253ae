#!/usr/bin/env bash
# The whole test suite: install and build (scripts/setup.sh), then every ctest label
# (unit, integration, e2e). Extra arguments go to ctest, e.g. scripts/test.sh -L unit
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
build_dir="${MESHWORK_BUILD_DIR:-$root/build}"
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" "$@"
