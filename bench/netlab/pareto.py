#!/usr/bin/env python3
"""The netlab comparison as (step time, peak memory) points: one row per (rate, configuration) from
the protocol's raw records (bench/protocol.py), then per rate whether every compiled point
dominates every eager point, and the targets the comparison is held to.

usage: pareto.py RAW.jsonl[.gz]

A point dominates another when its median step and its median step peak tensors are both no
larger and one is smaller (peaks within PEAK_TOLERANCE_MIB count as equal); "beyond the spread"
when its slowest run is faster than the other's fastest and its largest peak no larger than the
other's smallest.
"""
import os
import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import protocol  # noqa: E402

# The targets (issue 43): at these rates (bits/s), against the best eager configuration (the fastest median step).
TARGET_RATES = (500e6, 1e9)
SCHEDULE_ONLY_EXPOSED = 0.5
FULL_STEP = 0.85
# Step peaks this close count as equal: the same configuration's step peak moves by a few hundred
# KiB from run to run (Gloo's and the allocator's bookkeeping); the tables print the difference.
PEAK_TOLERANCE_MIB = 1.0


def bits_per_second(rate):
    """A tc rate (500mbit, 1gbit) in bits per second."""
    m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", str(rate).lower())
    if not m:
        raise ValueError(f"not a tc rate: {rate}")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def mib_diff(d):
    """A difference of MiB: to 0.1 MiB where it is small, so that +0.3 does not print as +0."""
    return f"{d:+.1f} MiB" if abs(d) < 10 else f"{d:+.0f} MiB"


def points(runs):
    """{(rate, config): summary} with the mode and the budget, in the order the runs show them."""
    out = {}
    for rate, config in protocol.groups_in_order(runs, ["rate", "config"]):
        where = {"rate": rate, "config": config}
        s = protocol.summarize(runs, where)
        first = next(r for r in runs if protocol.matches(r, where))
        s["mode"] = first.get("mode")
        s["faces"] = first.get("faces")
        budgets = sorted({r.get("budget_mib") or r.get("budget") for r in runs
                          if protocol.matches(r, where) and (r.get("budget_mib") or r.get("budget"))})
        s["budget_mib"] = budgets
        s["peak_rss_mib"] = protocol.spread(r["facts"].get("peak_rss_mib") for r in runs
                                            if protocol.matches(r, where) and r["status"] == "ok")
        out[(rate, config)] = s
    return out


def dominance(c, e):
    """Whether point c dominates point e, in words: 'yes', 'yes, beyond the spread' or 'no: why'."""
    if not c["step_s"] or not e["step_s"] or not c["step_peak_mib"] or not e["step_peak_mib"]:
        return "n/a (no runs)"
    cs, ce = c["step_s"], e["step_s"]
    cp, ep = c["step_peak_mib"], e["step_peak_mib"]
    slower = cs[0] > ce[0]
    larger = cp[0] > ep[0] + PEAK_TOLERANCE_MIB
    if not slower and not larger and (cs[0] < ce[0] or cp[0] < ep[0] - PEAK_TOLERANCE_MIB):
        clear = cs[2] < ce[1] and cp[2] <= ep[1] + PEAK_TOLERANCE_MIB
        return "yes, beyond the spread" if clear else "yes (medians; the spreads overlap)"
    why = []
    if slower:
        why.append(f"step {100 * (cs[0] / ce[0] - 1):+.1f}%")
    if larger:
        why.append(f"peak {mib_diff(cp[0] - ep[0])}")
    if not why:
        why.append("equal")
    return "no: " + ", ".join(why)


def ratio(a, b):
    return a / b if b else float("nan")


def report(runs):
    pts = points(runs)
    rates = [r for (r,) in protocol.groups_in_order(runs, ["rate"])]
    lines = ["| link | configuration | fsdp.memory_budget (MiB) | runs | step (s) | exposed comm per step (s) "
             "| step peak tensors (MiB) | peak RSS rank 0 (MiB) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (rate, config), s in pts.items():
        ran = str(s["runs"]) + (f" ({len(s['failed'])} failed: {s['failed'][0]})" if s["failed"] else "")
        budget = ", ".join(str(b) for b in s["budget_mib"]) or "-"
        lines.append(f"| {rate} | {config} | {budget} | {ran} | {protocol.fmt_spread(s['step_s'])} | "
                     f"{protocol.fmt_spread(s['exposed_s'])} | {protocol.fmt_spread(s['step_peak_mib'], 0)} | "
                     f"{protocol.fmt_spread(s['peak_rss_mib'], 0)} |")
    lines += ["", "### Does every compiled point dominate every eager point?", ""]
    for rate in rates:
        eager = [(c, s) for (r, c), s in pts.items() if r == rate and s["mode"] == "eager"]
        compiled = [(c, s) for (r, c), s in pts.items() if r == rate and s["mode"] == "compiled"]
        if not eager or not compiled:
            lines.append(f"- {rate}: nothing to compare (eager: {len(eager)}, compiled: {len(compiled)} configurations)")
            continue
        misses = []
        cells = []
        for c, cs in compiled:
            row = []
            for e, es in eager:
                d = dominance(cs, es)
                row.append(d)
                if not d.startswith("yes"):
                    misses.append(f"{c} against {e} ({d})")
            cells.append((c, row))
        lines.append(f"**{rate}**: " + ("every compiled point dominates every eager point." if not misses else
                                          "**not everywhere**: " + "; ".join(misses) + "."))
        lines.append("")
        lines.append("| compiled \\ eager | " + " | ".join(e for e, _ in eager) + " |")
        lines.append("|" + " --- |" * (len(eager) + 1))
        for c, row in cells:
            lines.append(f"| {c} | " + " | ".join(row) + " |")
        lines.append("")
    lines += ["### Targets", "",
              f"Against the best eager configuration at each rate (the fastest median step), with the compiled "
              f"configurations whose budget is its peak. Targets at 0.5 and 1 Gbit/s: schedule-only exposes "
              f"<= {SCHEDULE_ONLY_EXPOSED}x its communication at no more peak; full steps <= {FULL_STEP}x its step at "
              f"no more peak (within {PEAK_TOLERANCE_MIB:g} MiB). Other rates are shown without a target.", "",
              "| link | best eager | schedule-only exposed comm / best eager's | its peak - best eager's | target met | "
              "full step / best eager's | its peak - best eager's | target met |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for rate in rates:
        eager = [(c, s) for (r, c), s in pts.items() if r == rate and s["mode"] == "eager" and s["step_s"]]
        if not eager:
            lines.append(f"| {rate} | no eager runs | | | | | | |")
            continue
        best, bs = min(eager, key=lambda cs: cs[1]["step_s"][0])
        kind = best[len("eager-"):]
        row = [rate, f"{best} ({bs['step_s'][0]:.3f} s, exposed {bs['exposed_s'][0]:.3f} s)"]
        targeted = any(abs(bits_per_second(rate) - t) < 1 for t in TARGET_RATES)
        for prefix, figure, target in (("sched-vs-", "exposed_s", SCHEDULE_ONLY_EXPOSED),
                                       ("full-vs-", "step_s", FULL_STEP)):
            config = prefix + kind
            s = pts.get((rate, config))
            if not s or not s[figure] or not s["step_peak_mib"] or not bs["step_peak_mib"]:
                # None faced the best eager configuration: the best of the same kind that faced another
                # and still held no more than its peak answers the same question (at no more memory).
                within = [(c, cs) for (r, c), cs in pts.items()
                          if r == rate and c.startswith(prefix) and cs[figure] and cs["step_peak_mib"]
                          and bs["step_peak_mib"] and cs["step_peak_mib"][0] <= bs["step_peak_mib"][0] + PEAK_TOLERANCE_MIB]
                if not within:
                    row += [f"{config}: no runs, and none of its kind within {best}'s peak", "", ""]
                    continue
                config, s = min(within, key=lambda cs: cs[1][figure][0])
                config += f", facing another; none faced {best}"
            x = ratio(s[figure][0], bs[figure][0])
            dpeak = s["step_peak_mib"][0] - bs["step_peak_mib"][0]
            met = x <= target and dpeak <= PEAK_TOLERANCE_MIB
            verdict = ("**met**" if met else "**not met**") if targeted else "(no target)"
            row += [f"{x:.3f}x ({config})", mib_diff(dpeak), verdict]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv):
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    print(report(protocol.load_runs(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
