#!/usr/bin/env python3
"""The benchmark protocol the bench scripts share: per-step records in, medians over repeats out.

A script runs its configurations interleaved (A B C A B C ..., bench_interleave in lib.sh) and
hands every run to `record`, which keeps the run's per-step JSONL (the trainer's logging.jsonl)
and the facts of its log in one raw file (JSON lines). A run's figure is the median over its
measured steps (the steps after `--skip`); a configuration's is the median, min and max of its
runs' figures. `table` prints them, `title` a title that says how many repeats and measured steps
the table rests on (and warns below 5 x 20), `finish` gzips the raw file under bench/results/raw/.

  protocol.py record RAW --tag K=V... --skip N --steps JSONL [--log LOG] [--status failed --reason WHY]
  protocol.py get RAW FIELD --where K=V...   one field of the first ok run that matches
  protocol.py title RAW TEXT                 "# TEXT: R interleaved repeats x M measured steps ..."
  protocol.py table RAW --group K1,K2        a markdown table, one row per group
  protocol.py paired RAW --by K --base A --other B
                                             config B against config A, round by round, at each K
  protocol.py finish RAW DEST.jsonl.gz
"""
import argparse
import gzip
import json
import math
import os
import re
import statistics
import sys

MIN_REPEATS = 5
MIN_MEASURED = 20
MIB = 1 << 20


# --- one run --------------------------------------------------------------------------------

def measured_steps(steps, skip):
    """The steps after the first `skip` (warm-up, and for compiled FSDP the steps before its plan
    settles); steps are numbered from 1 as in logging.jsonl."""
    return [s for s in steps if s["step"] > skip]


def run_figures(steps, skip):
    """A run's figures over its measured steps: the median step and exposed communication (s), and
    the most tensor memory one step held (MiB; the trainer's "step peak tensors")."""
    late = measured_steps(steps, skip)
    if not late:
        return {"measured_steps": 0}
    out = {
        "measured_steps": len(late),
        "step_s": statistics.median(s["step_seconds"] for s in late),
    }
    # A peer that does not measure it (bench/peers/pipeline_peer.py) has none, not zero.
    if any("exposed_comm_seconds" in s for s in late):
        out["exposed_s"] = statistics.median(s.get("exposed_comm_seconds", 0.0) for s in late)
    peaks = [s["peak_tensor_bytes"] for s in late if s.get("peak_tensor_bytes", 0) > 0]
    if peaks:
        out["step_peak_mib"] = max(peaks) / MIB
    return out


def _num(pattern, text, group=1, cast=float):
    m = re.search(pattern, text)
    return cast(m.group(group)) if m else None


def parse_trainer_log(text):
    """What a bench compares from rank 0's meshwork-train log: the done line, the parameters per
    rank, the communication summary, the compiled plan's line and choices, the re-plan."""
    facts = {}
    done = next((l for l in text.splitlines() if l.startswith("done:")), "")
    if done:
        facts["tokens_per_second"] = _num(r"\| ([0-9.]+) tok/s", done)
        facts["peak_rss_mib"] = _num(r"peak mem ([0-9]+) MiB", done)
        facts["done_step_peak_mib"] = _num(r"step peak tensors ([0-9]+) MiB", done)
        facts["final_loss"] = _num(r"final loss ([0-9.]+)", done)
    facts["params_mib"] = _num(r"parameters on this rank ([0-9.]+) MiB", text)
    comm = next((l for l in text.splitlines() if l.startswith("communication")), "")
    facts["exposed_run_s"] = _num(r"exposed ([0-9.]+) s", comm)
    plan = next((l for l in text.splitlines() if l.startswith("compiled plan:")), "")
    if plan:
        facts["plan_line"] = plan
        m = re.search(r"predicted step ([0-9.]+) s \(eager ([0-9.]+)\)", plan)
        if m:
            facts["predicted_compiled_s"] = float(m.group(1))
            facts["fitted_eager_s"] = float(m.group(2))  # fitted to this run's eager steps: not a prediction
        m = re.search(r"peak dynamic ([0-9]+) MiB \(eager ([0-9]+) MiB\) \+ static ([0-9]+) MiB", plan)
        if m:
            dyn_c, dyn_e, static = (int(g) for g in m.groups())
            facts["predicted_peak_mib"] = dyn_c + static
            facts["predicted_eager_peak_mib"] = dyn_e + static
            facts["static_mib"] = static
        facts["budget_mib"] = _num(r"budget ([0-9]+) MiB", plan, cast=int)
        facts["collectives"] = _num(r"; ([0-9]+) collectives/step", plan, cast=int)
    chose = [l[len("compiled plan chose: "):] for l in text.splitlines() if l.startswith("compiled plan chose:")]
    if chose:
        facts["plan_choices"] = chose
    replan = next((l for l in text.splitlines() if l.startswith("re-plan:")), "")
    if replan:
        facts["replan_line"] = replan
        facts["replan_new_plan"] = "a new plan" in replan
    oom = re.search(r"out of device memory[^\n(]*", text)
    if oom:
        facts["oom"] = oom.group(0).strip()
    return {k: v for k, v in facts.items() if v is not None}


def load_jsonl(path):
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def read_text(path):
    if not path or not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        return f.read()


def parse_tags(pairs):
    tags = {}
    for p in pairs or []:
        if "=" not in p:
            raise SystemExit(f"protocol.py: a tag is KEY=VALUE, got '{p}'")
        k, v = p.split("=", 1)
        tags[k] = int(v) if re.fullmatch(r"-?[0-9]+", v) else v
    return tags


def record(raw, tags, skip, steps_path, log_path=None, status="ok", reason="", attach=None):
    """Appends one run record and its step records to `raw`; returns the run record."""
    steps = load_jsonl(steps_path)
    log = read_text(log_path)
    run = {"kind": "run", **tags, "skip": skip, "status": status}
    run.update(run_figures(steps, skip))
    if status == "ok" and run["measured_steps"] == 0:
        run["status"], reason = "failed", reason or f"no step after the first {skip} in the step log"
    if reason:
        run["reason"] = reason
    facts = parse_trainer_log(log)
    if status != "ok" and "oom" in facts and not reason:
        run["reason"] = facts["oom"]
    run["facts"] = facts
    for name, path in (attach or {}).items():
        if path and os.path.exists(path):
            run[name] = read_text(path)
    with open(raw, "a") as f:
        f.write(json.dumps(run, sort_keys=True) + "\n")
        for s in steps:
            f.write(json.dumps({"kind": "step", **tags, "measured": s["step"] > skip, **s}, sort_keys=True) + "\n")
    return run


# --- over repeats ---------------------------------------------------------------------------

def load_runs(raw):
    opener = gzip.open if raw.endswith(".gz") else open
    with opener(raw, "rt") as f:
        return [r for r in (json.loads(l) for l in f if l.strip()) if r.get("kind") == "run"]


def matches(run, where):
    return all(str(run.get(k)) == str(v) for k, v in where.items())


def spread(values):
    """median, min, max of the values (None when there are none)."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


def summarize(runs, where=None):
    """Over the ok runs that match: how many, the fewest measured steps of one, and the spread of
    each per-run figure; failed runs are counted with their reasons."""
    chosen = [r for r in runs if matches(r, where or {})]
    ok = [r for r in chosen if r["status"] == "ok"]
    return {
        "runs": len(ok),
        "failed": [r.get("reason", "failed") for r in chosen if r["status"] != "ok"],
        "measured_steps": min((r["measured_steps"] for r in ok), default=0),
        "step_s": spread(r.get("step_s") for r in ok),
        "exposed_s": spread(r.get("exposed_s") for r in ok),
        "step_peak_mib": spread(r.get("step_peak_mib") for r in ok),
    }


def fmt_spread(s, digits=3):
    if s is None:
        return "-"
    med, lo, hi = s
    if round(lo, digits) == round(hi, digits):
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def groups_in_order(runs, keys):
    """The distinct values of `keys` in the order the runs first show them."""
    seen = []
    for r in runs:
        g = tuple(r.get(k) for k in keys)
        if g not in seen:
            seen.append(g)
    return seen


def title(runs, text, want_repeats=MIN_REPEATS, want_measured=MIN_MEASURED, group_keys=("config",)):
    """A title that says what the table rests on: the fewest ok repeats of any group and the fewest
    measured steps of any run, with a warning below the protocol's minimum."""
    groups = groups_in_order(runs, list(group_keys))
    repeats = min((summarize(runs, dict(zip(group_keys, g)))["runs"] for g in groups), default=0)
    measured = min((r["measured_steps"] for r in runs if r["status"] == "ok"), default=0)
    line = f"# {text}: {repeats} interleaved repeats x {measured} measured steps"
    short = []
    if repeats < want_repeats:
        short.append(f"{repeats} repeats")
    if measured < want_measured:
        short.append(f"{measured} measured steps")
    if short:
        line += (f" (FEWER than the protocol's {want_repeats} repeats x {want_measured} measured steps: "
                 f"{' and '.join(short)}; not a result to quote)")
    return line


def table(runs, keys):
    head = keys + ["runs", "step (s): median [min, max] over repeats",
                   "exposed comm per step (s)", "step peak tensors (MiB)"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for g in groups_in_order(runs, keys):
        s = summarize(runs, dict(zip(keys, g)))
        ran = str(s["runs"]) + (f" ({len(s['failed'])} failed: {s['failed'][0]})" if s["failed"] else "")
        lines.append("| " + " | ".join([str(v) for v in g] + [ran, fmt_spread(s["step_s"]),
                     fmt_spread(s["exposed_s"]), fmt_spread(s["step_peak_mib"], 0)]) + " |")
    return "\n".join(lines)


def paired(runs, by, base, other):
    """Config `other` against config `base`, round by round (the same repeat: the runs that ran
    next to each other), at each value of `by`: the step time ratio other/base and the share of
    base's exposed communication that other hides, 1 - exposed(other) / exposed(base); each the
    median [min, max] over the rounds where both ran."""
    ok = [r for r in runs if r["status"] == "ok"]
    lines = [f"| {by} | rounds | step {other} / {base} | exposed comm {other} / {base} | "
             f"share of {base}'s exposed comm hidden by {other} |", "|" + " --- |" * 5]
    for (value,) in groups_in_order(ok, [by]):
        ratios, exposed = [], []
        for a in (r for r in ok if r.get(by) == value and r.get("config") == base):
            b = next((r for r in ok if r.get(by) == value and r.get("config") == other
                      and r.get("repeat") == a.get("repeat")), None)
            if b is None or not a.get("step_s"):
                continue
            ratios.append(b["step_s"] / a["step_s"])
            if a.get("exposed_s") and "exposed_s" in b:
                exposed.append(b.get("exposed_s", 0.0) / a["exposed_s"])
        hidden = spread(1 - e for e in exposed)
        pct = None if hidden is None else tuple(100 * h for h in hidden)
        lines.append(f"| {value} | {len(ratios)} | x{fmt_spread(spread(ratios))} | x{fmt_spread(spread(exposed))} | "
                     f"{fmt_spread(pct, 1)}{' %' if pct else ''} |")
    return "\n".join(lines)


def losses(raw, base, other):
    """How far config `other`'s losses are from `base`'s, step by step in the same round: the
    largest relative difference over each round's steps (median [min, max] over the rounds)."""
    opener = gzip.open if raw.endswith(".gz") else open
    with opener(raw, "rt") as f:
        steps = [r for r in (json.loads(l) for l in f if l.strip()) if r.get("kind") == "step"]
    by = {}
    for s in steps:
        by.setdefault((s.get("rate"), s.get("repeat"), s.get("config")), {})[s["step"]] = s["loss"]
    worst = []
    for (rate, repeat, config), a in by.items():
        b = by.get((rate, repeat, other))
        if config != base or not b:
            continue
        common = sorted(set(a) & set(b))
        if common:
            worst.append(max(abs(b[k] - a[k]) / abs(a[k]) for k in common))
    if not worst:
        return f"Losses: no round ran both {base} and {other}."
    med, lo, hi = spread(worst)
    return (f"Losses, {other} against {base}: the largest relative difference over a run's steps, "
            f"{med:.1e} [{lo:.1e}, {hi:.1e}] over {len(worst)} rounds (median [min, max]).")


def get_field(run, field):
    value = run
    for part in field.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("raw")
    r.add_argument("--tag", action="append", default=[])
    r.add_argument("--skip", type=int, required=True)
    r.add_argument("--steps", required=True)
    r.add_argument("--log")
    r.add_argument("--status", default="ok")
    r.add_argument("--reason", default="")
    r.add_argument("--attach", action="append", default=[], help="NAME=FILE: keep FILE's text in the run record")
    g = sub.add_parser("get")
    g.add_argument("raw")
    g.add_argument("field")
    g.add_argument("--where", action="append", default=[])
    t = sub.add_parser("title")
    t.add_argument("raw")
    t.add_argument("text")
    t.add_argument("--group", default="config")
    tb = sub.add_parser("table")
    tb.add_argument("raw")
    tb.add_argument("--group", default="config")
    pa = sub.add_parser("paired")
    pa.add_argument("raw")
    pa.add_argument("--by", required=True)
    pa.add_argument("--base", required=True)
    pa.add_argument("--other", required=True)
    lo = sub.add_parser("losses")
    lo.add_argument("raw")
    lo.add_argument("--base", required=True)
    lo.add_argument("--other", required=True)
    f = sub.add_parser("finish")
    f.add_argument("raw")
    f.add_argument("dest")
    a = p.parse_args(argv)

    if a.cmd == "record":
        run = record(a.raw, parse_tags(a.tag), a.skip, a.steps, a.log, a.status, a.reason,
                     dict(x.split("=", 1) for x in a.attach))
        print(f"{run['status']}: {run['measured_steps']} measured steps, step {run.get('step_s', math.nan):.3f} s, "
              f"exposed {run.get('exposed_s', math.nan):.3f} s, step peak {run.get('step_peak_mib', math.nan):.0f} MiB"
              + (f" ({run['reason']})" if run.get("reason") else ""), file=sys.stderr)
    elif a.cmd == "get":
        where = parse_tags(a.where)
        run = next((x for x in load_runs(a.raw) if x["status"] == "ok" and matches(x, where)), None)
        value = get_field(run, a.field) if run else None
        if value is None:
            return 1
        print(value)
    elif a.cmd == "title":
        print(title(load_runs(a.raw), a.text, group_keys=a.group.split(",")))
    elif a.cmd == "table":
        print(table(load_runs(a.raw), a.group.split(",")))
    elif a.cmd == "paired":
        print(paired(load_runs(a.raw), a.by, a.base, a.other))
    elif a.cmd == "losses":
        print(losses(a.raw, a.base, a.other))
    elif a.cmd == "finish":
        os.makedirs(os.path.dirname(os.path.abspath(a.dest)), exist_ok=True)
        with open(a.raw, "rb") as src, gzip.open(a.dest, "wb") as dst:
            dst.write(src.read())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
