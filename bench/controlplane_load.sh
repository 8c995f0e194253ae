#!/usr/bin/env bash
# Load on the local cluster's API server: 1,000 ConfigMaps created one after another through
# Meshwork's own client while 10, 40 and 100 watches stay open (a fresh meshwork-cluster for
# each: the real kube-apiserver 1.37 and etcd 3.6, docs/cluster.md). Records create latency
# percentiles, the delay from a create's answer to each watcher's ADDED event, and the memory of
# kube-apiserver, etcd and the cluster's other components. The rows the home-made
# meshwork-controlplane measured before it was retired (issue 19) stay in the table, marked as
# such, for comparison.
# Writes bench/results/controlplane_load.md. Needs a build (scripts/setup.sh).
# usage: bench/controlplane_load.sh [build-dir] [objects] [watches]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
objects="${2:-1000}"
watches="${3:-100}"
cluster_bin="$build/controlplane/cluster/meshwork-cluster"
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
[ -x "$cluster_bin" ] || { echo "no $cluster_bin: build first (scripts/setup.sh)" >&2; exit 1; }

# kib FIELD PID: VmRSS / VmHWM of a process, in KiB (0 when it is gone).
kib() { awk -v f="$1:" '$1 == f {print $2}' "/proc/$2/status" 2>/dev/null || echo 0; }
# component NAME: the pid of the cluster's child whose command (comm, cut at 15 characters) is NAME.
component() { pgrep -P "$server" -x "$1" | head -1; }

header="| server | objects | watches | creates/s | create p50 | p90 | p99 | max | watch delay p50 | p90 | p99 | max | events missing | RSS before | RSS after | peak RSS | data dir |"
echo "$header" >"$tmp/table.md"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |" >>"$tmp/table.md"
: >"$tmp/memory.md"
for w in $(printf '%s\n' 10 40 "$watches" | sort -nu); do
  rm -rf "$tmp/data"
  "$cluster_bin" --data-dir "$tmp/data" >"$tmp/server.log" 2>&1 &
  server=$!
  for _ in $(seq 1 1800); do grep -q "serving on" "$tmp/server.log" && break; sleep 0.1; done
  grep -q "serving on" "$tmp/server.log" || { cat "$tmp/server.log" >&2; exit 1; }
  api="$(component kube-apiserver)"
  etcd="$(component etcd)"
  rss_before=$(($(kib VmRSS "$api") + $(kib VmRSS "$etcd")))

  echo "[bench] $objects creates, $w watches" >&2
  "$load_bin" --kubeconfig "$tmp/data/kubeconfig" --objects "$objects" --watches "$w" >"$tmp/load.json"
  rss_after=$(($(kib VmRSS "$api") + $(kib VmRSS "$etcd")))
  hwm=$(($(kib VmHWM "$api") + $(kib VmHWM "$etcd")))
  {
    printf '| %s |' "$w"
    for c in kube-apiserver etcd kube-controller kube-scheduler meshwork-node-a; do  # comm: 15 chars
      p="$(component "$c")"
      awk -v r="$(kib VmRSS "$p")" -v h="$(kib VmHWM "$p")" 'BEGIN {printf " %.1f / %.1f MiB |", r / 1024, h / 1024}'
    done
    echo
  } >>"$tmp/memory.md"
  disk="$(du -sk "$tmp/data/etcd" | cut -f1)"
  kill "$server" && wait "$server" 2>/dev/null || true
  server=""

  python3 - "$tmp/load.json" "$rss_before" "$rss_after" "$hwm" "$disk" >>"$tmp/table.md" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
before, after, hwm, disk = (int(x) / 1024 for x in sys.argv[2:6])
c, w = r["create_latency"], r["watch_event_delay"]
print(f"| meshwork-cluster: kube-apiserver 1.37.2 + etcd 3.6.16 | {r['objects']} | {r['watches']} | {r['creates_per_second']:.0f} | "
      f"{c['p50_ms']:.2f} ms | {c['p90_ms']:.2f} ms | {c['p99_ms']:.2f} ms | {c['max_ms']:.2f} ms | {w['p50_ms']:.2f} ms | "
      f"{w['p90_ms']:.2f} ms | {w['p99_ms']:.2f} ms | {w['max_ms']:.2f} ms | {r['watch_events_missing']} | "
      f"{before:.1f} MiB | {after:.1f} MiB | {hwm:.1f} MiB | {disk:.1f} MiB |")
PY
done

# The home-made server's rows from the results this replaces (its last measurement), kept for
# comparison: rows of the old format get the server column.
bench_home_made_rows "$out" 16 >"$tmp/home.md"

{
  echo "# The local cluster's API server under load"
  echo
  bench_command_line bench/controlplane_load.sh "$root"
  echo
  echo "Machine: $(bench_machine). Server: meshwork-cluster (kube-apiserver 1.37.2 with TLS client"
  echo "certificates, RBAC and an audit log at Metadata level; etcd 3.6.16, one member, fsync on every"
  echo "commit), client: meshwork-controlplane-load (Meshwork's k8s client, cpprestsdk, the admin"
  echo "certificate), all on this machine. Creates are sequential (one in flight); each watch is a"
  echo "separate HTTPS stream. Create latency is request sent to answer parsed; watch delay is a"
  echo "create's answer to the ADDED event parsed by a watcher (0 when the event came first), over"
  echo "every watcher. RSS is kube-apiserver's plus etcd's; data dir is etcd's."
  echo "The home-made rows are the retired meshwork-controlplane's last measurement (HTTPS, bearer"
  echo "token, its own store with fsync on every write; RSS its one process), on the same machine."
  echo
  cat "$tmp/table.md"
  cat "$tmp/home.md"
  echo
  echo "Each component's RSS / peak RSS at the end of the run, by watches:"
  echo
  echo "| watches | kube-apiserver | etcd | kube-controller-manager | kube-scheduler | meshwork-node-agent |"
  echo "| --- | --- | --- | --- | --- | --- |"
  cat "$tmp/memory.md"
} >"$tmp/result.md"
mkdir -p "$(dirname "$out")"
cp "$tmp/result.md" "$out"
cat "$out"
