#!/usr/bin/env python3
"""The table of bench/operator_vs_job.sh from its runs.txt: per jobs x Pods and kind, median [min, max]
over the runs that finished; "-" marks a figure a run did not record.

usage: operator_vs_job_table.py RUNS_TXT
"""
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])][1:]
def med(xs):
    xs = [float(x) for x in xs if x != "-"]
    if not xs: return "-", None
    return f"{statistics.median(xs):.1f} [{min(xs):.1f}, {max(xs):.1f}]", statistics.median(xs)
print("| jobs x Pods | kind | runs ok | all Pods created (s) | Pods/s | all finished (s) | API requests / job | controller CPU (s) | controller peak RSS (MiB) | control plane CPU (s) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
by = {}
for kind, jobs, pods, rep, t_pods, t_done, req, ctl, hwm, cp, status in rows:
    by.setdefault((int(jobs), int(pods)), {}).setdefault(kind, []).append((t_pods, t_done, req, ctl, hwm, cp, status))
ratios = []
for (jobs, pods), kinds in sorted(by.items()):
    rate = {}
    for kind in ["tj", "job"] + sorted(k for k in kinds if k.startswith("job-qps")):
        runs = kinds.get(kind, [])
        if not runs:
            continue  # not run for this row (SKIP)
        ok = [r for r in runs if r[6] == "ok"]
        rates = [jobs * pods / float(r[0]) for r in ok if r[0] != "-" and float(r[0]) > 0]
        rate[kind] = statistics.median(rates) if rates else None
        name = "TrainingJob" if kind == "tj" else "Indexed Job" if kind == "job" else f"Indexed Job (kube-api-qps {kind[7:]})"
        cells = [med([r[i] for r in ok])[0] for i in (0,)]
        rate_cell = f"{statistics.median(rates):.1f} [{min(rates):.1f}, {max(rates):.1f}]" if rates else "-"
        per_job = [float(r[2]) / jobs for r in ok if r[2] != "-"]
        print(f"| {jobs} x {pods} | {name} | {len(ok)} of {len(runs)} | {cells[0]} | {rate_cell} | {med([r[1] for r in ok])[0]} | "
              f"{med(per_job)[0]} | {med([r[3] for r in ok])[0]} | {med([r[4] for r in ok])[0]} | {med([r[5] for r in ok])[0]} |")
    if rate.get("tj"):
        against = [(k, rate[k]) for k in rate if k != "tj" and rate[k]]
        if against:
            ratios.append(f"{jobs} x {pods}: " + ", ".join(f"x{rate['tj'] / r:.2f} against {k}" for k, r in against))
print()
print("TrainingJobs' Pods/s over the Job controller's (medians): " + ("; ".join(ratios) if ratios else "none"))
failed = [" ".join(r) for r in rows if r[-1] != "ok"]
if failed:
    print()
    print("Runs that did not finish: " + "; ".join(failed))
