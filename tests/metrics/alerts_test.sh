#!/usr/bin/env bash
# Checks the Prometheus alert rules in metrics/alerts/: promtool accepts them and their unit tests
# pass, they use only metrics docs/metrics.md lists, and every alert links an existing runbook
# section. Usage: alerts_test.sh [REPO_ROOT]
set -euo pipefail

root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
rules="$root/metrics/alerts/meshwork-alerts.yaml"
metrics_doc="$root/docs/metrics.md"
runbook="$root/docs/runbook.md"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

if ! command -v promtool >/dev/null; then
  echo "FAIL: promtool not found on PATH; install Debian's prometheus package (scripts/setup.sh does)" >&2
  exit 1
fi

echo "== promtool check rules"
promtool check rules "$rules" || fail "promtool check rules $rules"

echo "== promtool test rules"
tests=("$root"/metrics/alerts/tests/*.yaml)
[ -e "${tests[0]}" ] || fail "no unit tests in metrics/alerts/tests/"
promtool test rules "${tests[@]}" || fail "promtool test rules"

echo "== metric names against docs/metrics.md"
# Comments are skipped; histogram series are documented under their base name.
names=$(grep -v '^[[:space:]]*#' "$rules" | grep -o 'meshwork_[a-z_]*' |
  sed -E 's/_(bucket|sum|count)$//' | sort -u)
[ -n "$names" ] || fail "no meshwork_ metric found in $rules"
for name in $names; do
  grep -q "\`$name\`" "$metrics_doc" || fail "$name is used in the rules but not listed in docs/metrics.md"
done
echo "$(echo "$names" | wc -l) metric names checked"

echo "== runbook links"
# GitHub's anchors of the runbook's headings: lower case, punctuation dropped, spaces to '-'.
anchors=$(grep -E '^#{1,6} ' "$runbook" | sed -E 's/^#+ +//' | tr 'A-Z' 'a-z' |
  sed -E 's/[^a-z0-9 _-]//g; s/ /-/g')
# One line per alert: NAME URL SEVERITY SUMMARY DESCRIPTION (a "-" where one is missing).
table=$(awk '
  function flush() { if (alert != "") print alert, (url ? url : "-"), (sev ? sev : "-"), (sum ? "y" : "-"), (desc ? "y" : "-") }
  /^[[:space:]]*- (alert|record):/ { flush(); alert = ""; url = ""; sev = ""; sum = 0; desc = 0 }
  /^[[:space:]]*- alert:/ { alert = $3 }
  /^[[:space:]]*runbook_url:/ { url = $2 }
  /^[[:space:]]*severity:/ { sev = $2 }
  /^[[:space:]]*summary:/ { sum = 1 }
  /^[[:space:]]*description:/ { desc = 1 }
  END { flush() }' "$rules")
[ -n "$table" ] || fail "no alert found in $rules"
while read -r alert url severity summary description; do
  [ "$severity" != "-" ] || fail "$alert has no severity label"
  [ "$summary" != "-" ] || fail "$alert has no summary annotation"
  [ "$description" != "-" ] || fail "$alert has no description annotation"
  case "$url" in
    */docs/runbook.md#*) ;;
    *) fail "$alert: runbook_url '$url' does not point into docs/runbook.md"; continue ;;
  esac
  anchor="${url##*#}"
  grep -qxF "$anchor" <<<"$anchors" || fail "$alert: docs/runbook.md has no section #$anchor"
done <<<"$table"
echo "$(echo "$table" | wc -l) alerts checked"

if ((failures)); then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "all alert checks passed"
