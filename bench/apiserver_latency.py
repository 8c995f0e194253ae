#!/usr/bin/env python3
"""p50 and p99 of kube-apiserver's request latency from its /metrics text.

usage: apiserver_latency.py METRICS_FILE

Reads apiserver_request_duration_seconds_bucket, sums the buckets over every label but the verb
class (reads: GET, LIST; writes: POST, PUT, PATCH, DELETE, DELETECOLLECTION; WATCH and CONNECT
are long-running and left out), and interpolates each quantile linearly within its bucket, as
Prometheus' histogram_quantile does. Prints one line: "reads p50 X ms, p99 Y ms (N requests);
writes ...".
"""
import collections
import re
import sys

READS = {"GET", "LIST"}
WRITES = {"POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION"}
LINE = re.compile(r'^apiserver_request_duration_seconds_bucket\{(?P<labels>[^}]*)\} (?P<value>[0-9.e+-]+)$')


def quantile(q, buckets):
    """buckets: sorted [(upper_bound, cumulative_count)], the last +Inf."""
    total = buckets[-1][1]
    if total == 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return lower  # beyond the largest finite bucket: its lower bound, as Prometheus
            return lower + (upper - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = upper, count
    return lower


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2])
        return 2
    sums = {"reads": collections.Counter(), "writes": collections.Counter()}
    try:
        text = open(argv[1]).read()
    except OSError as e:
        print(f"no metrics: {e}")
        return 1
    for line in text.splitlines():
        m = LINE.match(line.strip())
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group("labels")))
        verb = labels.get("verb", "")
        kind = "reads" if verb in READS else "writes" if verb in WRITES else None
        if kind is None:
            continue
        le = float("inf") if labels.get("le") == "+Inf" else float(labels["le"])
        sums[kind][le] += float(m.group("value"))
    parts = []
    for kind in ("reads", "writes"):
        buckets = sorted(sums[kind].items())
        if not buckets:
            parts.append(f"{kind}: none")
            continue
        p50, p99 = quantile(0.5, buckets), quantile(0.99, buckets)
        parts.append(f"{kind} p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms ({int(buckets[-1][1])} requests)")
    print("; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
