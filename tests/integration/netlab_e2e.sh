#!/usr/bin/env bash
# bench/netlab: the shaped-link testbed comes up with every link shaped in both directions, ranks
# in their namespaces reach each other, eager and compiled FSDP train over it side by side (the
# benchmark script itself, on `tiny`), bad input is refused, and nothing is left behind.
# Skips (77) where network namespaces cannot be made, saying why. Asserts no timings.
# usage: netlab_e2e.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1
build=$2
netlab="$src/bench/netlab/netlab.sh"
tmp=$(mktemp -d)
trap '"$netlab" down; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

if ! "$netlab" check 2>"$tmp/check"; then
  echo "SKIP: $(cat "$tmp/check")"
  exit 77
fi

# Bad input: the argument and the value are named, exit 1, nothing made.
if "$netlab" up 2 fast 2>"$tmp/err"; then fail "up with RATE 'fast' succeeded"; fi
grep -q "RATE 'fast'" "$tmp/err" || fail "unclear error for a bad rate: $(cat "$tmp/err")"
if "$netlab" up 0 1gbit 2>"$tmp/err"; then fail "up with 0 ranks succeeded"; fi
grep -q "RANKS '0'" "$tmp/err" || fail "unclear error for 0 ranks: $(cat "$tmp/err")"
if ip netns list | grep -q '^mwlab-'; then fail "a refused 'up' left namespaces behind"; fi

"$netlab" up 3 500mbit
[ "$(ip netns list | grep -c '^mwlab-')" -eq 4 ] || fail "expected 3 rank namespaces and the hub: $(ip netns list)"
for r in 0 1 2; do
  tc -n mwlab-$r qdisc show dev eth0 | grep -q 'tbf .*rate 500Mbit' || fail "rank $r's egress is not shaped"
  tc -n mwlab-hub qdisc show dev h$r | grep -q 'tbf .*rate 500Mbit' || fail "rank $r's ingress is not shaped"
  [ "$("$netlab" exec $r ip -brief addr show eth0 | awk '{print $3}')" = "10.77.0.$((r + 1))/24" ] ||
    fail "rank $r has the wrong address"
done
# Rank 2 reaches rank 0 through the bridge (a TCP connection to a listener in rank 0's namespace).
"$netlab" exec 0 python3 -c '
import socket; s = socket.socket(); s.bind(("10.77.0.1", 5599)); s.listen(1); s.settimeout(20)
c, _ = s.accept(); c.sendall(b"pong")' &
listener=$!
sleep 0.5
reply=$("$netlab" exec 2 python3 -c '
import socket, time
for _ in range(50):
    try:
        print(socket.create_connection(("10.77.0.1", 5599), timeout=5).recv(4).decode()); break
    except ConnectionRefusedError:
        time.sleep(0.1)')
wait $listener
[ "$reply" = pong ] || fail "rank 2 could not reach rank 0: '$reply'"
"$netlab" up 2 1gbit  # replaces the running netlab
[ "$(ip netns list | grep -c '^mwlab-')" -eq 3 ] || fail "up did not replace the old netlab: $(ip netns list)"

# The benchmark, small (one repeat of each configuration): every configuration trains over the
# shaped link and fills its row, the compiled ones within the eager plan's predicted peak (the
# default BUDGET=model), the title says the protocol was cut short, the raw records are written.
OUT="$tmp/table.md" RATES=1gbit PRESET=tiny SEQ=64 REPEATS=1 MEASURED=2 bash "$src/bench/netlab_compiled_vs_eager.sh" "$build" \
  >"$tmp/bench.log" 2>&1 || { cat "$tmp/bench.log"; fail "the netlab benchmark failed"; }
for config in eager-reshard eager-keep; do
  grep -qE "^\| 1gbit \| $config \| - \| 1 \| [0-9.]+ \|" "$tmp/table.md" || { cat "$tmp/table.md"; fail "no $config row"; }
done
for config in sched-vs-reshard full-vs-reshard sched-vs-keep full-vs-keep; do
  grep -qE "^\| 1gbit \| $config \| eager-plan \| 1 \| [0-9.]+ \|" "$tmp/table.md" ||
    { cat "$tmp/table.md"; fail "no $config row with its fsdp.memory_budget"; }
done
grep -q '^# .*: 1 interleaved repeats x 2 measured steps (FEWER' "$tmp/table.md" ||
  { head -1 "$tmp/table.md"; fail "the title does not say the protocol was cut short"; }
grep -qE '^\*\*1gbit\*\*: ' "$tmp/table.md" || { cat "$tmp/table.md"; fail "no dominance verdict for 1gbit"; }
grep -qE '^\| compiled, its own run \(in sample\) \| 4 \|' "$tmp/table.md" ||
  { cat "$tmp/table.md"; fail "the compiled runs' predictions are not in the simulator section"; }
[ "$(zcat "$tmp"/raw/netlab_compiled_vs_eager/*.jsonl.gz | grep -c '"kind": "run"')" -eq 6 ] ||
  fail "the raw records do not hold the 6 runs"
if ip netns list | grep -q '^mwlab-'; then fail "the benchmark left namespaces behind"; fi

"$netlab" down
"$netlab" down  # twice is fine
if ip netns list | grep -q '^mwlab-'; then fail "down left namespaces behind"; fi
echo "PASS: netlab"
