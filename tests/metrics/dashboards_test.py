#!/usr/bin/env python3
"""Checks the Grafana dashboards in metrics/dashboards: structure, data sources, that every
metric they query is documented in docs/metrics.md, and that every PromQL expression parses
(promtool check rules). Usage: dashboards_test.py [REPO_ROOT]"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(__file__), "..", ".."))
DASHBOARD_DIR = os.path.join(ROOT, "metrics", "dashboards")
DOCS = os.path.join(ROOT, "docs", "metrics.md")
DATASOURCE_UID = "${datasource}"
PANEL_TYPES = {"timeseries", "stat", "table"}

# Grafana's built-in interval variables first, then any $var / ${var} / ${var:format}.
BUILTINS = [("$__rate_interval", "5m"), ("${__rate_interval}", "5m"), ("$__interval", "1m"),
            ("${__interval}", "1m"), ("$__range", "1h"), ("${__range}", "1h")]
VARIABLE = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::[a-z]+)?\}|\$[A-Za-z_][A-Za-z0-9_]*")
METRIC = re.compile(r"meshwork_[a-z0-9_]+")


def substitute(expr):
    for var, value in BUILTINS:
        expr = expr.replace(var, value)
    return VARIABLE.sub("x", expr)


def documented_metrics():
    with open(DOCS) as f:
        return set(re.findall(r"`(meshwork_[a-z0-9_]+)`", f.read()))


def variable_query(var):
    """The PromQL inside a query variable (label_values(EXPR, label), query_result(EXPR)), or None."""
    q = var.get("query")
    if isinstance(q, dict):
        q = q.get("query")
    if not isinstance(q, str):
        return None
    m = re.fullmatch(r"\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*", q, re.S)
    if m:
        return m.group(1)
    m = re.fullmatch(r"\s*query_result\((.*)\)\s*", q, re.S)
    if m:
        return m.group(1)
    return None  # label_values(label), label_names(): no expression


def references_datasource_variable(ds):
    if isinstance(ds, dict):
        return ds.get("uid") in (DATASOURCE_UID, "$datasource")
    return ds in (DATASOURCE_UID, "$datasource")


def check_dashboard(path, docs):
    """Returns (errors, [(where, expr)])."""
    name = os.path.basename(path)
    errors, exprs = [], []
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        return [f"{name}: cannot parse JSON: {e}"], []
    for key in ("uid", "title"):
        if not isinstance(d.get(key), str) or not d[key]:
            errors.append(f"{name}: missing {key}")
    if d.get("schemaVersion") != 39:
        errors.append(f"{name}: schemaVersion is {d.get('schemaVersion')!r}, want 39")
    variables = d.get("templating", {}).get("list", [])
    var_names = {v.get("name") for v in variables}
    if not any(v.get("name") == "datasource" and v.get("type") == "datasource"
               and v.get("query") == "prometheus" for v in variables):
        errors.append(f"{name}: no Prometheus template variable named 'datasource'")
    for v in variables:
        if v.get("type") != "query":
            continue
        where = f"{name}: variable '{v.get('name')}'"
        if not references_datasource_variable(v.get("datasource")):
            errors.append(f"{where}: datasource is {v.get('datasource')!r}, want uid {DATASOURCE_UID}")
        expr = variable_query(v)
        if expr is None:
            errors.append(f"{where}: no PromQL in query {v.get('query')!r}")
        else:
            exprs.append((where, expr))
    panels = d.get("panels")
    if not isinstance(panels, list) or not panels:
        errors.append(f"{name}: no panels")
        panels = []
    seen_ids = {}
    for p in panels:
        where = f"{name}: panel {p.get('id')} '{p.get('title')}'"
        pid = p.get("id")
        if not isinstance(pid, int):
            errors.append(f"{where}: id missing or not an integer")
        elif pid in seen_ids:
            errors.append(f"{where}: id {pid} also used by panel '{seen_ids[pid]}'")
        else:
            seen_ids[pid] = p.get("title")
        if not p.get("title"):
            errors.append(f"{where}: no title")
        if p.get("type") not in PANEL_TYPES:
            errors.append(f"{where}: type {p.get('type')!r} not one of {sorted(PANEL_TYPES)}")
        g = p.get("gridPos")
        if not isinstance(g, dict) or not all(isinstance(g.get(k), int) for k in ("x", "y", "w", "h")):
            errors.append(f"{where}: gridPos missing or incomplete: {g!r}")
        if not references_datasource_variable(p.get("datasource")):
            errors.append(f"{where}: datasource is {p.get('datasource')!r}, want uid {DATASOURCE_UID}")
        targets = p.get("targets") or []
        if not targets:
            errors.append(f"{where}: no targets")
        for t in targets:
            twhere = f"{where} target {t.get('refId')}"
            if "datasource" in t and not references_datasource_variable(t["datasource"]):
                errors.append(f"{twhere}: datasource is {t['datasource']!r}, want uid {DATASOURCE_UID}")
            expr = t.get("expr")
            if not isinstance(expr, str) or not expr.strip():
                errors.append(f"{twhere}: no expr")
                continue
            exprs.append((twhere, expr))
    for where, expr in exprs:
        for var in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", expr):
            if not var.startswith("__") and var not in var_names:
                errors.append(f"{where}: uses undefined variable ${var}: {expr}")
        for metric in METRIC.findall(expr):
            base = re.sub(r"_(bucket|sum|count)$", "", metric)
            if metric not in docs and base not in docs:
                errors.append(f"{where}: metric {metric} is not in docs/metrics.md: {expr}")
    return errors, exprs


def promtool_check(promtool, exprs):
    """Runs promtool check rules on all expressions as recording rules; returns (ok, output)."""
    lines = ["groups:", "  - name: dashboard_expressions", "    rules:"]
    for i, (_, expr) in enumerate(exprs):
        lines.append(f"      - record: dashboard:expr_{i}")
        lines.append(f"        expr: {json.dumps(substitute(expr))}")  # JSON strings are valid YAML
    with tempfile.TemporaryDirectory() as tmp:
        rules = os.path.join(tmp, "rules.yml")
        with open(rules, "w") as f:
            f.write("\n".join(lines) + "\n")
        r = subprocess.run([promtool, "check", "rules", rules], capture_output=True, text=True)
    # Keep promtool's findings, not its "Checking <temp file>" preamble.
    out = [l.replace(rules + ": ", "") for l in (r.stdout + r.stderr).splitlines()
           if l.strip() and not l.startswith("Checking ") and l.strip() != "FAILED:"]
    return r.returncode == 0, "\n    ".join(out)


def main():
    docs = documented_metrics()
    if not docs:
        print(f"FAIL: no metric names found in {DOCS}")
        return 1
    paths = sorted(os.path.join(DASHBOARD_DIR, f) for f in os.listdir(DASHBOARD_DIR) if f.endswith(".json"))
    if not paths:
        print(f"FAIL: no dashboards in {DASHBOARD_DIR}")
        return 1
    promtool = shutil.which("promtool")
    if not promtool:
        print("FAIL: promtool not found on PATH; it checks that every dashboard expression parses. "
              "Install Debian's 'prometheus' package (apt-get install -y prometheus).")
        return 1
    # The parser check must be able to fail: a broken expression has to be rejected.
    ok, _ = promtool_check(promtool, [("self-test", "sum by (job) (rate(meshwork_x[5m])")])
    if ok:
        print("FAIL: promtool accepted a malformed expression; the parse check is not working")
        return 1
    failures = 0
    for path in paths:
        errors, exprs = check_dashboard(path, docs)
        if exprs:
            ok, out = promtool_check(promtool, exprs)
            if not ok:
                # Check each expression alone to name the ones that do not parse.
                for where, expr in exprs:
                    one_ok, one_out = promtool_check(promtool, [(where, expr)])
                    if not one_ok:
                        errors.append(f"{where}: promtool rejects {substitute(expr)!r}:\n    {one_out}")
                if not errors:
                    errors.append(f"{os.path.basename(path)}: promtool check rules failed:\n    {out}")
        status = "FAIL" if errors else "ok"
        print(f"{status}: {os.path.relpath(path, ROOT)} ({len(exprs)} expressions)")
        for e in errors:
            print("  " + e)
        failures += len(errors)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
