#!/usr/bin/env bash
# The longest function definitions in the project's C++ (tests left out), as "lines file:line name".
#   scripts/largest-functions.sh [N] [DIR...]     default: 15, every source folder
# Needs Universal Ctags (Debian's universal-ctags). Used to keep functions short (STYLE.md) and to
# show a refactor's before and after.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-15}
shift || true
dirs=("$@")
[ ${#dirs[@]} -gt 0 ] || dirs=(common trainer operator controlplane metrics)
if ! command -v ctags >/dev/null || ! ctags --version 2>/dev/null | grep -q Universal; then
  echo "largest-functions: needs Universal Ctags (apt-get install universal-ctags)" >&2
  exit 2
fi
ctags -R --languages=C++ --kinds-C++=f --fields=+ne -f - "${dirs[@]}" |
  awk -F'\t' '{
    line = ""; end = ""
    for (i = 4; i <= NF; i++) {
      if ($i ~ /^line:/) line = substr($i, 6)
      if ($i ~ /^end:/) end = substr($i, 5)
    }
    if (line != "" && end != "") printf "%d %s:%s %s\n", end - line + 1, $2, line, $1
  }' | sort -rn | head -n "$n"
