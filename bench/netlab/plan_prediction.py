#!/usr/bin/env python3
"""The plan search's predictions against the measured steps of bench/netlab_plans.sh's runs.

  plan_prediction.py fitted-mfu RAW --rate R --config pNN --repeat K
      the achieved MFU the trainer's plan advice refitted in that run ("" when it gave none)
  plan_prediction.py report RAW --plans RATE=FILE... [--refit RATE=FILE=MFU...]
      per rate: every plan, predicted against measured; Spearman's rank correlation and the
      median error at the profile's compute rate and at the refitted one; the search's choice
      (the plans file's first line) against the best measured plan

A plans file holds `meshwork-simulate --auto --exhaustive`'s lines, fastest first:
"plan: DESCRIPTION | step S s | peak G GiB | keys: ...". Run configs pNN are its lines, from 1.
"""
import argparse
import os
import re
import statistics
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import protocol  # noqa: E402

ADVICE = re.compile(r"measured ([0-9.]+) s a step, predicted ([0-9.]+) s at the profile's MFU ([0-9.]+); "
                    r"refitted MFU ([0-9.]+)")


def read_plans(path):
    plans = []
    with open(path) as f:
        for line in f:
            m = re.match(r"plan: (.*?) \| step ([0-9.eE+-]+) s \|", line)
            if m:
                plans.append((m.group(1), float(m.group(2))))
    return plans


def mesh_and_schedule(description):
    """The plan without its activation checkpointing, which the search picks per compute rate."""
    return re.sub(r", (no checkpointing|every .*|checkpointing: .*)$", "", description)


def advice_of(run):
    m = ADVICE.search(run.get("advice", ""))
    return None if not m else {"measured": float(m.group(1)), "predicted": float(m.group(2)),
                               "fitted_mfu": float(m.group(4))}


def ranks(values):
    order = sorted(range(len(values)), key=lambda i: values[i])
    r = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2
        i = j + 1
    return r


def spearman(a, b):
    if len(a) < 3:
        return float("nan")
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra)
    vb = sum((y - mb) ** 2 for y in rb)
    return cov / (va * vb) ** 0.5 if va > 0 and vb > 0 else float("nan")


def fmt(v, digits=3):
    return "-" if v is None or v != v else f"{v:.{digits}f}"


def cmd_fitted_mfu(a):
    for run in protocol.load_runs(a.raw):
        if (run.get("status") == "ok" and str(run.get("rate")) == a.rate and run.get("config") == a.config
                and str(run.get("repeat")) == str(a.repeat)):
            adv = advice_of(run)
            if adv:
                print(f"{adv['fitted_mfu']:.6g}")
            return 0
    return 0


def cmd_report(a):
    runs = [r for r in protocol.load_runs(a.raw) if r.get("status") == "ok"]
    refits = {}
    for spec in a.refit:
        rate, path, mfu = spec.split("=", 2)
        refits[rate] = ({mesh_and_schedule(d): s for d, s in read_plans(path)}, float(mfu))
    for spec in a.plans:
        rate, path = spec.split("=", 1)
        plans = read_plans(path)
        rows = []
        for i, (desc, predicted) in enumerate(plans, 1):
            config = f"p{i:02d}"
            mine = [r for r in runs if str(r.get("rate")) == rate and r.get("config") == config and "step_s" in r]
            steps = [r["step_s"] for r in mine]
            fitted = [adv["fitted_mfu"] for adv in (advice_of(r) for r in mine) if adv]
            refit = refits.get(rate, ({}, 0))[0].get(mesh_and_schedule(desc))
            rows.append({"config": config, "plan": desc, "predicted": predicted, "refit": refit,
                         "measured": protocol.spread(steps), "runs": len(steps),
                         "fitted": statistics.median(fitted) if fitted else None})
        print(f"### {rate}")
        print()
        refit_mfu = refits.get(rate, (None, None))[1]
        print("| config | plan | predicted step (s) | predicted at the refitted MFU (s) | measured step (s) |"
              " measured / predicted | runs | MFU the run's advice refitted |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in rows:
            m = r["measured"]
            cell = "-" if not m else f"{m[0]:.3f} [{m[1]:.3f}, {m[2]:.3f}]"
            ratio = "-" if not m else f"{m[0] / r['predicted']:.2f}"
            print(f"| {r['config']} | {r['plan']} | {r['predicted']:.4f} | {fmt(r['refit'], 4)} | {cell} | {ratio} |"
                  f" {r['runs']} | {fmt(r['fitted'], 4)} |")
        measured_rows = [r for r in rows if r["measured"]]
        print()
        if len(measured_rows) < 2:
            print("Too few plans measured to compare.")
            print()
            continue
        meas = [r["measured"][0] for r in measured_rows]
        pred = [r["predicted"] for r in measured_rows]
        err = [abs(p - m) / m for p, m in zip(pred, meas)]
        best = min(measured_rows, key=lambda r: r["measured"][0])
        chosen = rows[0]
        order = sorted(measured_rows, key=lambda r: r["measured"][0])
        print(f"- At the profile's compute rate: Spearman's rank correlation of predicted and measured "
              f"steps {fmt(spearman(pred, meas))} over {len(meas)} plans; median |predicted - measured| / measured "
              f"{fmt(statistics.median(err))}.")
        with_refit = [r for r in measured_rows if r["refit"] is not None and r["config"] != "p01"]
        if with_refit and refit_mfu:
            rm = [r["measured"][0] for r in with_refit]
            rp = [r["refit"] for r in with_refit]
            rerr = [abs(p - m) / m for p, m in zip(rp, rm)]
            print(f"- At the MFU {refit_mfu:.4g} refitted on p01's round 1 (the other {len(with_refit)} plans, out of "
                  f"sample): Spearman {fmt(spearman(rp, rm))}; median error {fmt(statistics.median(rerr))}.")
        if chosen["measured"]:
            rank = order.index(chosen) + 1
            print(f"- The search's choice at the profile, {chosen['plan']} (p01), measured "
                  f"{chosen['measured'][0]:.3f} s: #{rank} of {len(order)}, x{chosen['measured'][0] / best['measured'][0]:.3f} "
                  f"the best measured plan's step ({best['config']}, {best['plan']}, {best['measured'][0]:.3f} s).")
        fitted = [r["fitted"] for r in measured_rows if r["fitted"]]
        if fitted:
            print(f"- The compute rate each run's own advice refitted: median MFU {statistics.median(fitted):.4f}, "
                  f"from {min(fitted):.4f} to {max(fitted):.4f} over the plans (one rate would explain every plan "
                  f"if compute alone were off).")
        print()
    return 0


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fitted-mfu")
    f.add_argument("raw")
    f.add_argument("--rate", required=True)
    f.add_argument("--config", required=True)
    f.add_argument("--repeat", required=True)
    r = sub.add_parser("report")
    r.add_argument("raw")
    r.add_argument("--plans", action="append", default=[])
    r.add_argument("--refit", action="append", default=[])
    a = p.parse_args(argv)
    return cmd_fitted_mfu(a) if a.cmd == "fitted-mfu" else cmd_report(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
