#!/usr/bin/env python3
"""The quality half of bench/pipemare.sh: per configuration, the held-out loss after training, the
last 20 steps' training loss and each rank's measured bubble (idle seconds of its program per second
of its forwards and backwards over the measured steps, against the schedule's formula); then each
PipeMare configuration's held-out loss against 1F1B's, paired by seed (the same initial weights and
batches): 1F1B at the same micro-batches, or at 2 for a PipeMare configuration of 1 (which 1F1B
cannot run at pp 2; the same tokens a step).

usage: pipemare_quality.py RAW.jsonl[.gz] --skip N
"""
import argparse
import gzip
import json
import math
import statistics


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def spread(values, fmt="{:.4f}"):
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "-"
    return (fmt + " [" + fmt + ", " + fmt + "]").format(statistics.median(values), min(values), max(values))


def formula(schedule, pp, m):
    return (pp - 1) / (3 * m) if schedule.startswith("pipemare") else (pp - 1) / m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("raw")
    ap.add_argument("--skip", type=int, default=5)
    args = ap.parse_args()
    records = load(args.raw)
    runs = {(r["config"], r["seed"]): r for r in records if r.get("kind") == "run" and r.get("status") == "ok"}
    steps = {}
    for s in records:
        if s.get("kind") == "step" and (s["config"], s["seed"]) in runs:
            steps.setdefault((s["config"], s["seed"]), []).append(s)
    configs = sorted({c for c, _ in runs}, key=lambda c: (int(c.rsplit("-m", 1)[1]), c))
    pp = 2
    print("| configuration | seeds | held-out loss after training | training loss, last 20 steps | "
          + " | ".join(f"rank {r} bubble" for r in range(pp)) + " | formula |")
    print("| --- | --- | --- | --- | " + " | ".join("---" for _ in range(pp)) + " | --- |")
    held = {}
    for c in configs:
        seeds = sorted(s for cc, s in runs if cc == c)
        evals = [float(runs[(c, s)].get("eval_loss", "nan")) for s in seeds]
        held[c] = dict(zip(seeds, evals))
        last = [statistics.mean(x["loss"] for x in sorted(steps[(c, s)], key=lambda x: x["step"])[-20:]) for s in seeds]
        bubbles = [[] for _ in range(pp)]
        for s in seeds:
            measured = [x for x in steps[(c, s)] if x["step"] > args.skip and "pipeline_seconds" in x]
            for r in range(pp):
                busy = sum(x["pipeline_busy_seconds"][r] for x in measured)
                idle = sum(x["pipeline_seconds"][r] - x["pipeline_busy_seconds"][r] for x in measured)
                bubbles[r].append(idle / busy if busy > 0 else float("nan"))
        schedule, m = c.rsplit("-m", 1)
        print(f"| {c} | {len(seeds)} | {spread(evals)} | {spread(last)} | "
              + " | ".join(spread(b, "{:.3f}") for b in bubbles) + f" | {formula(schedule, pp, int(m)):.3f} |")
    print()
    print("PipeMare's held-out loss against 1F1B's on the same seed ((PipeMare - 1F1B) / 1F1B, median [min, max]")
    print("over the seeds; the issue's target: within 3%):")
    print()
    print("| PipeMare configuration | against | seeds | held-out loss difference |")
    print("| --- | --- | --- | --- |")
    for c in configs:
        if not c.startswith("pipemare"):
            continue
        m = int(c.rsplit("-m", 1)[1])
        base = f"1f1b-m{max(m, pp)}"
        if base not in held:
            continue
        pairs = [(held[c][s], held[base][s]) for s in held[c] if s in held[base]]
        diffs = [100 * (a - b) / b for a, b in pairs if not (math.isnan(a) or math.isnan(b))]
        print(f"| {c} | {base} | {len(diffs)} | {spread(diffs, '{:+.2f}%')} |")


if __name__ == "__main__":
    main()
