#!/usr/bin/env python3
"""Pipeline bubbles measured from netlab runs (bench/netlab_pipeline.sh), against the formula.

Each step record of a pipeline run holds, per pipeline rank, the seconds its forwards and
backwards ran (`pipeline_busy_seconds`) and the seconds its program took (`pipeline_seconds`;
trainer/train/pipeline_engine.cpp). A rank's bubble over a run is sum(seconds - busy) /
sum(busy) over the measured steps: idle time per unit of compute, the quantity (p - 1) / m
describes for GPipe and 1F1B (and (p - 1) / (v m) for interleaved 1F1B). Zero-bubble's formula
is its own (Qi et al.), so it gets none here; the issue's target compares it with 1F1B's.
PipeMare's (asynchronous, no flush) is (p - 1) / (3 m): between the trainer's steps (a barrier:
the loss reduced over the ranks) the last rank waits for the step's first activation, one forward
(a third of a forward and backward) on each earlier stage (compiler::pipeline::ScheduleBubble).

usage: pipeline_bubble.py RAW.jsonl[.gz] --pp P
"""
import argparse
import gzip
import json
import statistics


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def formula(schedule, pp, microbatches, virtual):
    if schedule in ("gpipe", "1f1b"):
        return (pp - 1) / microbatches
    if schedule == "interleaved-1f1b":
        return (pp - 1) / (virtual * microbatches)
    if schedule == "pipemare":
        return (pp - 1) / (3 * microbatches)
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("raw")
    ap.add_argument("--pp", type=int, required=True)
    args = ap.parse_args()
    records = load(args.raw)
    runs = {}
    for r in records:
        if r.get("kind") == "run" and r.get("status") == "ok":
            runs[(r["config"], r["repeat"])] = r
    # Per configuration and repeat: every rank's bubble over the measured steps.
    per_run = {}
    for s in records:
        if s.get("kind") != "step" or not s.get("measured") or "pipeline_seconds" not in s:
            continue
        key = (s["config"], s["repeat"])
        if key not in runs:
            continue
        acc = per_run.setdefault(key, [[0.0, 0.0] for _ in range(args.pp)])
        for rank in range(args.pp):
            acc[rank][0] += s["pipeline_seconds"][rank] - s["pipeline_busy_seconds"][rank]
            acc[rank][1] += s["pipeline_busy_seconds"][rank]
    configs = sorted({k[0] for k in per_run}, key=lambda c: (c.split("-m")[0], int(c.split("-m")[1])))
    print("| configuration | runs | " + " | ".join(f"rank {r} bubble" for r in range(args.pp)) +
          " | worst rank | formula ((p-1)/m; pipemare (p-1)/3m) | worst - formula (points) |")
    print("| --- | --- | " + " | ".join("---" for _ in range(args.pp)) + " | --- | --- | --- |")
    for config in configs:
        schedule, m = config.rsplit("-m", 1)
        m = int(m)
        bubbles = [[idle / busy for idle, busy in acc] for (c, _), acc in per_run.items() if c == config]
        cells = []
        for rank in range(args.pp):
            values = [b[rank] for b in bubbles]
            cells.append(f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]")
        worst = statistics.median(max(b) for b in bubbles)
        f = formula(schedule, args.pp, m, 1)
        print(f"| {config} | {len(bubbles)} | " + " | ".join(cells) + f" | {worst:.3f} | " +
              (f"{f:.3f} | {100 * (worst - f):+.1f}" if f is not None else "- | -") + " |")


if __name__ == "__main__":
    main()
