#!/usr/bin/env bash
# meshwork-operator through an API-server outage (issue 20, finding 3): the control plane is
# frozen (SIGSTOP) past the operator's renew deadline and lease duration, then thawed. The
# operator must give leadership up (no reconciles while it cannot renew), stay alive, take the
# Lease back once the server answers, and reconcile again: a job applied after the outage runs
# to Succeeded. Before, it exited ("leadership lost; exiting so that a supervisor restarts this
# replica") and in local mode nothing restarted it.
# usage: operator_outage_e2e.sh CONTROLPLANE OPERATOR TRAIN SOURCE_DIR
set -uo pipefail

cp_bin="$1"
op_bin="$2"
train_bin="$3"
src="$4"
source "$src/tests/common/e2e_lib.sh"
e2e_require_kubectl
e2e_init
export PATH="$(dirname "$train_bin"):$PATH"
k() { timeout 60 kubectl --request-timeout=30s -n e2e "$@"; }
metric() { curl -s "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 == m {print $2}'; }
finish() {
  [ "$cp_pid" ] && kill -CONT "$cp_pid" 2>/dev/null
  if [ "$failed" -gt 0 ]; then
    echo "---- operator log"; tail -n 40 "$work/op.log"
    echo "---- kubectl get tj,pods"; k get tj,pods -o wide 2>&1
  fi
  e2e_summary operator_outage_e2e
  exit $?
}
cp_pid=""

e2e_start_controlplane "$cp_bin" || exit 1
if [ "$(basename "$cp_bin")" = meshwork-cluster ]; then
  # The API server itself: freezing its supervisor would leave it answering.
  cp_pid="$(pgrep -f -- "--tls-cert-file $work/cp/pki/apiserver.crt" | head -1)"
else
  cp_pid="$(pgrep -f -- "--data-dir $work/cp" | head -1)"
fi
[ -n "$cp_pid" ] || { fail "no control plane process found"; finish; }
e2e_apply_crd "$src" || { fail "the CRD did not apply"; finish; }
kubectl create namespace e2e >/dev/null

port="$(free_port)"
"$op_bin" --kubeconfig "$KUBECONFIG" --metrics-bind-address "127.0.0.1:$port" --identity outage \
  --lease-duration-s 4 --renew-deadline-s 3 --retry-period-s 1 --report-interval-s 2 >>"$work/op.log" 2>&1 &
op_pid=$!
e2e_track "$op_pid"
e2e_wait_for 30 "the operator leads" grep -q "became leader" "$work/op.log" || { fail "no leader: $(cat "$work/op.log")"; finish; }

# ---- the outage: longer than the renew deadline (3 s) and the lease (4 s)
kill -STOP "$cp_pid"
sleep 9
kill -CONT "$cp_pid"
if e2e_wait_for 30 "leadership given up" grep -q "leadership lost; standing by" "$work/op.log"; then
  pass "the operator gave leadership up while it could not renew"
else
  fail "no loss of leadership logged: $(tail -5 "$work/op.log")"
fi
if e2e_wait_for 30 "leading again" bash -c "[ \$(grep -c 'became leader' '$work/op.log') -ge 2 ]"; then
  pass "the operator took the Lease back once the API server answered"
else
  fail "not leading again: $(tail -5 "$work/op.log")"
fi
kill -0 "$op_pid" 2>/dev/null && pass "the operator process is still running" || fail "the operator exited: $(tail -3 "$work/op.log")"
! grep -q "exiting" "$work/op.log" && pass "nothing in the log says it exits" || fail "$(grep exiting "$work/op.log")"
e2e_wait_for 10 "leader gauge 1" bash -c "[ \"\$(curl -s http://127.0.0.1:$port/metrics | awk '\$1 == \"meshwork_operator_leader\" {print \$2}')\" = 1 ]" &&
  pass "meshwork_operator_leader is 1 again" || fail "leader gauge: $(metric "$port" meshwork_operator_leader)"

# ---- and it reconciles: a job applied now runs to Succeeded
k apply -f - >/dev/null <<EOF
apiVersion: meshwork.dev/v1alpha1
kind: TrainingJob
metadata:
  name: after-outage
  namespace: e2e
spec:
  image: busybox
  device: cpu
  replicas: 2
  command: ["sh", "-c", "exit 0"]
  config:
    inline: "model: {preset: tiny}"
EOF
if e2e_wait_for 90 "after-outage Succeeded" bash -c "[ \"\$(kubectl -n e2e get tj after-outage -o jsonpath='{.status.phase}')\" = Succeeded ]"; then
  pass "a job applied after the outage ran to Succeeded"
else
  fail "after-outage: phase '$(k get tj after-outage -o jsonpath='{.status.phase}')'"
fi
finish
