# Shared by the bash checks that run meshwork binaries directly (cli_e2e, distributed_e2e,
# calibration_e2e): PASS/FAIL lines with counts, an exit-code-and-message check, and the closing
# "N passed, N failed" line, and free_port (free_port.sh). Source it; end with `checks_done NAME`.
# shellcheck shell=bash

# shellcheck source=tests/common/free_port.sh
source "$(dirname "${BASH_SOURCE[0]}")/free_port.sh"

passed=0
failed=0
pass() { echo "PASS: $1"; passed=$((passed + 1)); }
fail() { echo "FAIL: $1"; failed=$((failed + 1)); }

# expect_exit NAME WANT_EXIT WANT_STDERR_SUBSTRING -- COMMAND...: runs COMMAND (stdout dropped),
# passes when it exits WANT_EXIT and its stderr holds WANT_STDERR_SUBSTRING.
expect_exit() {
  local name="$1" want_rc="$2" want_msg="$3"
  shift 4
  local out rc
  out="$("$@" 2>&1 >/dev/null)"
  rc=$?
  if [ "$rc" -ne "$want_rc" ]; then
    fail "$name: exit $rc, want $want_rc; stderr: $out"
  elif [[ "$out" != *"$want_msg"* ]]; then
    fail "$name: stderr lacks '$want_msg': $out"
  else
    pass "$name (exit $rc)"
  fi
}

# checks_done NAME: the closing line; the exit status is whether every check passed.
checks_done() {
  echo "$1: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}
