#!/usr/bin/env bash
# netlab: ranks on one machine that talk over a shaped link instead of loopback, so that
# communication costs wire time, not CPU time, and overlapping it with compute can pay off.
#
# Topology: namespace mwlab-hub holds a bridge; rank r lives in namespace mwlab-<r> with one
# interface, eth0 = 10.77.0.<r+1>/24, a veth whose other end sits on the bridge. Every rank's
# link is shaped in both directions with a token bucket (tc tbf) at RATE: its own egress on eth0
# and its ingress on the hub end. Latency is the kernel's (microseconds): netem is not available.
#
#   netlab.sh up RANKS RATE     make it (RATE as tc says it: 500mbit, 1gbit, 4gbit); replaces a
#                               netlab that exists
#   netlab.sh down              remove every namespace and link netlab made (always safe)
#   netlab.sh exec RANK CMD...  run CMD in rank RANK's namespace (root; CMD inherits the env)
#   netlab.sh addr RANK         print rank RANK's address
#   netlab.sh check             exit 0 when namespaces, veth pairs and tbf can be made here,
#                               else 77 with the reason on stderr (what tests treat as skip)
#   netlab.sh show              the namespaces and each link's qdisc
#
# Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2; nothing outside the mwlab-*
# namespaces is touched.
set -euo pipefail

readonly prefix=mwlab
readonly hub=$prefix-hub
readonly subnet=10.77.0

die() {
  echo "netlab: $*" >&2
  exit 1
}

addr() { echo "$subnet.$(($1 + 1))"; }

# The token bucket's burst at RATE: 2 ms of traffic (a larger bucket lets whole megabyte
# messages through at veth speed, which is not what a NIC of RATE does, and fools the trainer's
# link calibration), and at least 64 KiB so that TCP segments with offloads (up to 64 KiB) pass.
burst_for() {
  local rate=$1 bits
  bits=$(python3 - "$rate" <<'EOF'
import re, sys
m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", sys.argv[1].lower())
if not m:
    sys.exit(1)
print(int(float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]))
EOF
  ) || die "RATE '$rate': expected a number and kbit, mbit or gbit (e.g. 500mbit, 1gbit)"
  local bytes=$((bits / 8 / 500))
  ((bytes < 65536)) && bytes=65536
  echo "$bytes"
}

down() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$prefix-" || true); do
    ip netns del "$ns" 2>/dev/null || true  # deleting a namespace deletes its veth ends
  done
}

shape() {  # shape NS DEV RATE BURST
  tc -n "$1" qdisc replace dev "$2" root tbf rate "$3" burst "$4" latency 100ms
}

up() {
  local ranks=$1 rate=$2 burst r ns
  [[ $ranks =~ ^[0-9]+$ ]] && ((ranks >= 1 && ranks <= 200)) || die "RANKS '$ranks': expected 1 to 200"
  burst=$(burst_for "$rate")
  down
  trap 'down' ERR
  ip netns add "$hub"
  ip -n "$hub" link set lo up
  ip -n "$hub" link add br0 type bridge
  ip -n "$hub" link set br0 up
  for ((r = 0; r < ranks; r++)); do
    ns=$prefix-$r
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip link add "$prefix-e$r" netns "$ns" type veth peer name "h$r" netns "$hub"
    ip -n "$ns" link set "$prefix-e$r" name eth0
    ip -n "$ns" addr add "$(addr "$r")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$hub" link set "h$r" master br0
    ip -n "$hub" link set "h$r" up
    shape "$ns" eth0 "$rate" "$burst"   # what rank r sends
    shape "$hub" "h$r" "$rate" "$burst"  # what rank r receives
  done
  trap - ERR
}

check() {
  local why=""
  if [[ $(id -u) -ne 0 ]]; then
    why="needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN); running as uid $(id -u)"
  elif ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
    why="needs iproute2 (ip, tc)"
  elif ! ip netns add "$prefix-check" 2>/tmp/netlab-check.$$; then
    why="cannot make a network namespace: $(cat /tmp/netlab-check.$$)"
  elif ! ip -n "$prefix-check" link add name mwc0 type veth peer name mwc1 2>/tmp/netlab-check.$$; then
    why="cannot make a veth pair: $(cat /tmp/netlab-check.$$)"
  elif ! tc -n "$prefix-check" qdisc add dev mwc0 root tbf rate 1gbit burst 128kb latency 100ms 2>/tmp/netlab-check.$$; then
    why="cannot shape a link with tc tbf: $(cat /tmp/netlab-check.$$)"
  fi
  ip netns del "$prefix-check" 2>/dev/null || true
  rm -f /tmp/netlab-check.$$
  if [[ -n $why ]]; then
    echo "netlab: unavailable here: $why" >&2
    exit 77
  fi
}

show() {
  local ns
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$prefix-" | sort); do
    echo "== $ns"
    ip -n "$ns" -brief addr
    tc -n "$ns" qdisc show | grep tbf || true
  done
}

cmd=${1:-}
shift || true
case "$cmd" in
  up) [[ $# -eq 2 ]] || die "usage: netlab.sh up RANKS RATE"; up "$1" "$2" ;;
  down) down ;;
  exec)
    [[ $# -ge 2 ]] || die "usage: netlab.sh exec RANK CMD..."
    r=$1
    shift
    ip netns list | grep -qE "^$prefix-$r( |$)" || die "no rank $r: run 'netlab.sh up' first"
    exec ip netns exec "$prefix-$r" "$@"
    ;;
  addr) [[ $# -eq 1 ]] || die "usage: netlab.sh addr RANK"; addr "$1" ;;
  check) check ;;
  show) show ;;
  *) die "usage: netlab.sh up RANKS RATE | down | exec RANK CMD... | addr RANK | check | show" ;;
esac
