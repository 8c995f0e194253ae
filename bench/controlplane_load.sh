#!/usr/bin/env bash
# Load on the local control plane (issue 5): 1,000 ConfigMaps created one after another through
# Meshwork's own client while 10, 40 and 100 watches stay open (a fresh control plane for each).
# Records create latency percentiles, the delay from a create's answer to each watcher's ADDED
# event, and the control plane's memory.
# Writes bench/results/controlplane_load.md. Needs a build (scripts/setup.sh).
# usage: bench/controlplane_load.sh [build-dir] [objects] [watches]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
objects="${2:-1000}"
watches="${3:-100}"
server_bin="$build/controlplane/apiserver/meshwork-controlplane"
load_bin="$build/bench/controlplane/meshwork-controlplane-load"
out="$root/bench/results/controlplane_load.md"
tmp="$(mktemp -d)"
server=""
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"

echo "| objects | watches | creates/s | create p50 | p90 | p99 | max | watch delay p50 | p90 | p99 | max | events missing | RSS before | RSS after | peak RSS | data dir |" >"$tmp/table.md"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |" >>"$tmp/table.md"
for w in $(printf '%s\n' 10 40 "$watches" | sort -nu); do
rm -rf "$tmp/data"
"$server_bin" --data-dir "$tmp/data" >"$tmp/server.log" 2>&1 &
server=$!
for _ in $(seq 1 100); do grep -q "serving on" "$tmp/server.log" && break; sleep 0.1; done
grep -q "serving on" "$tmp/server.log" || { cat "$tmp/server.log" >&2; exit 1; }
rss_before="$(awk '/VmRSS/ {print $2}' "/proc/$server/status")"

echo "[bench] $objects creates, $w watches" >&2
"$load_bin" --kubeconfig "$tmp/data/kubeconfig" --objects "$objects" --watches "$w" >"$tmp/load.json"
rss_after="$(awk '/VmRSS/ {print $2}' "/proc/$server/status")"
hwm="$(awk '/VmHWM/ {print $2}' "/proc/$server/status")"
wal="$(du -sk "$tmp/data" | cut -f1)"
kill "$server" && wait "$server" 2>/dev/null || true
server=""

python3 - "$tmp/load.json" "$rss_before" "$rss_after" "$hwm" "$wal" >>"$tmp/table.md" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
before, after, hwm, disk = (int(x) / 1024 for x in sys.argv[2:6])
c, w = r["create_latency"], r["watch_event_delay"]
print(f"| {r['objects']} | {r['watches']} | {r['creates_per_second']:.0f} | {c['p50_ms']:.2f} ms | {c['p90_ms']:.2f} ms | "
      f"{c['p99_ms']:.2f} ms | {c['max_ms']:.2f} ms | {w['p50_ms']:.2f} ms | {w['p90_ms']:.2f} ms | {w['p99_ms']:.2f} ms | "
      f"{w['max_ms']:.2f} ms | {r['watch_events_missing']} | {before:.1f} MiB | {after:.1f} MiB | {hwm:.1f} MiB | {disk:.1f} MiB |")
PY
done

{
  echo "# Local control plane under load"
  echo
  bench_command_line bench/controlplane_load.sh "$root"
  echo
  echo "Machine: $(bench_machine). Server: meshwork-controlplane (HTTPS, bearer token, fsync on"
  echo "every write), client: meshwork-controlplane-load (Meshwork's k8s client, cpprestsdk), both"
  echo "on this machine. Creates are sequential (one in flight); each watch is a separate HTTPS"
  echo "stream. Create latency is request sent to answer parsed; watch delay is a create's answer"
  echo "to the ADDED event parsed by a watcher (0 when the event came first), over every watcher."
  echo
  cat "$tmp/table.md"
} >"$tmp/result.md"
mkdir -p "$(dirname "$out")"
cp "$tmp/result.md" "$out"
cat "$out"
