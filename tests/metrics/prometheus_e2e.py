#!/usr/bin/env python3
"""JSON work for prometheus_e2e.sh: Prometheus file_sd targets from `kubectl get pods -o json`,
and every Grafana dashboard query (panel targets and query variables) evaluated against a live
Prometheus, each of which must return data.

  prometheus_e2e.py file-sd OUT.json < pods.json
  prometheus_e2e.py check --prometheus URL --dashboards DIR --stage running|succeeded \
      --namespace NS --job NAME --world-size N --scrape-interval S --range S [--time UNIX]
"""
import argparse
import json
import math
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request


# ---- file_sd: the labels kubernetes_sd_configs (role: pod) would give --------------------------

def sanitize(name):
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def pod_targets(pods):
    """One target per declared container port, labelled like Prometheus' kubernetes_sd role
    `pod`, so that the same relabel_configs work for both discovery methods."""
    groups = []
    for pod in pods.get("items", []):
        meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
        ip = status.get("podIP")
        if not ip:
            continue
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in status.get("conditions", []))
        common = {
            "__meta_kubernetes_namespace": meta.get("namespace", ""),
            "__meta_kubernetes_pod_name": meta.get("name", ""),
            "__meta_kubernetes_pod_uid": meta.get("uid", ""),
            "__meta_kubernetes_pod_ip": ip,
            "__meta_kubernetes_pod_phase": status.get("phase", ""),
            "__meta_kubernetes_pod_ready": "true" if ready else "false",
            "__meta_kubernetes_pod_node_name": spec.get("nodeName", ""),
            "__meta_kubernetes_pod_host_ip": status.get("hostIP", ""),
        }
        for kind in ("label", "annotation"):
            for k, v in (meta.get(kind + "s") or {}).items():
                common[f"__meta_kubernetes_pod_{kind}_{sanitize(k)}"] = v
                common[f"__meta_kubernetes_pod_{kind}present_{sanitize(k)}"] = "true"
        for c in spec.get("containers", []):
            for port in c.get("ports") or []:
                labels = dict(common)
                labels.update({
                    "__meta_kubernetes_pod_container_name": c.get("name", ""),
                    "__meta_kubernetes_pod_container_image": c.get("image", ""),
                    "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                    "__meta_kubernetes_pod_container_port_number": str(port.get("containerPort", "")),
                    "__meta_kubernetes_pod_container_port_protocol": port.get("protocol", "TCP"),
                })
                groups.append({"targets": [f"{ip}:{port.get('containerPort')}"], "labels": labels})
    return groups


def file_sd(out):
    groups = pod_targets(json.load(sys.stdin))
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(groups, f, indent=1)
    os.replace(tmp, out)  # Prometheus watches the file: never let it read half of one
    print(len(groups))
    return 0


# ---- Prometheus HTTP API -----------------------------------------------------------------------

class Prometheus:
    def __init__(self, url, at):
        self.url = url.rstrip("/")
        self.at = at  # evaluation time (Unix seconds)

    def get(self, path, params):
        query = urllib.parse.urlencode(params, doseq=True)
        req = urllib.request.Request(self.url + path + "?" + query)
        try:
            with urllib.request.urlopen(req, timeout=20) as r:
                body = r.read().decode()
        except urllib.error.HTTPError as e:
            body = e.read().decode()
        except OSError as e:  # URLError, timeouts: Prometheus is not answering
            return {"status": "error", "error": f"GET {path}: {e}"}
        try:
            return json.loads(body)
        except ValueError:
            return {"status": "error", "error": "not JSON: " + body[:500]}

    def query(self, expr):
        return self.get("/api/v1/query", {"query": expr, "time": f"{self.at:.3f}"})

    def label_values(self, label, match, seconds):
        params = {"start": f"{self.at - seconds:.3f}", "end": f"{self.at:.3f}"}
        if match is not None:
            params["match[]"] = [match]
        return self.get(f"/api/v1/label/{label}/values", params)


# ---- dashboards --------------------------------------------------------------------------------

METRIC = re.compile(r"\bmeshwork_[a-z0-9_]+")
VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::[a-z]+)?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
LABEL_VALUES = re.compile(r"\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*", re.S)


def regex_escape(value):
    # Grafana's Prometheus data source escapes regex metacharacters in a variable's values,
    # doubled because the regex sits in a PromQL string literal.
    return re.sub(r"[$^*{}\[\]'+?.()|\\]", lambda m: "\\\\" + m.group(0), value)


def format_values(values):
    escaped = [regex_escape(v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def substitute(expr, values):
    def one(m):
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(name)
        return values[name]
    return VARIABLE.sub(one, expr)


def variable_query(var):
    q = var.get("query")
    if isinstance(q, dict):
        q = q.get("query")
    return q if isinstance(q, str) else None


class Checker:
    def __init__(self, prom, args):
        self.prom, self.args = prom, args
        self.failures, self.checked = [], 0

    def fail(self, where, expr, answer, why):
        self.failures.append(f"{where}\n    why: {why}\n    expr: {expr}\n    answer: "
                             + json.dumps(answer)[:1500])

    def builtins(self):
        s = self.args.scrape_interval
        # Grafana's $__rate_interval is max($__interval + scrape interval, 4 x scrape interval);
        # use a window of 15 scrapes so that rate() sees enough samples while the job runs.
        return {"__rate_interval": f"{15 * s}s", "__interval": f"{s}s",
                "__range": f"{self.args.range}s", "__range_s": str(self.args.range)}

    def resolve_variables(self, name, dashboard):
        """Evaluates the query variables in order, each with the values the earlier ones found;
        returns two selections: every value found (multi-select) and Grafana's All (allValue)."""
        chosen, all_ = self.builtins(), self.builtins()
        for var in dashboard.get("templating", {}).get("list", []):
            vname = var.get("name")
            if var.get("type") == "datasource":
                chosen[vname] = all_[vname] = "prometheus"
                continue
            if var.get("type") != "query":
                continue
            q = variable_query(var)
            where = f"{name}: variable '{vname}'"
            m = LABEL_VALUES.fullmatch(q or "")
            if not m:
                self.fail(where, q, None, "not a label_values(EXPR, LABEL) query")
                continue
            expr = substitute(m.group(1), chosen)
            answer = self.prom.label_values(m.group(2), expr, 60)
            self.checked += 1
            values = answer.get("data") or []
            if answer.get("status") != "success" or not values:
                self.fail(where, expr, answer, f"label_values(..., {m.group(2)}) returned no values")
                chosen[vname] = all_[vname] = var.get("allValue") or ".*"
                continue
            print(f"  {where}: {values}")
            expected = self.expected_variable(vname)
            if expected is not None and not expected <= set(values):
                self.fail(where, expr, answer, f"values lack {sorted(expected - set(values))}")
            chosen[vname] = format_values(values)
            all_[vname] = (var.get("allValue") or ".*") if var.get("includeAll") else format_values(values)
        return [("selected", chosen), ("All", all_)]

    def expected_variable(self, vname):
        a = self.args
        return {"namespace": {a.namespace}, "job": {a.job},
                "rank": {str(r) for r in range(a.world_size)}}.get(vname)

    def expectation(self, uid, title, result):
        """What 'returns data' means beyond a non-empty answer, per panel; None when met."""
        a = self.args
        values = [float(r["value"][1]) for r in result]
        labels = [r["metric"] for r in result]
        if "per rank" in title:
            ranks = sorted({l.get("rank") for l in labels if l.get("job") == a.job})
            if ranks != sorted(str(r) for r in range(a.world_size)):
                return f"want one series per rank 0..{a.world_size - 1} of job {a.job}, got ranks {ranks}"
        if title in ("Tokens/s (job)", "Tokens/s per job", "Steps/s", "Tokens/s per rank") and min(values) <= 0:
            return "want a rate above 0 while the job trains"
        if title == "Progress" and not all(0 < v <= 1 for v in values):
            return "want progress in (0, 1]"
        if title == "Run" and not any(l.get("world_size") == str(a.world_size) for l in labels):
            return f"want a run with world_size {a.world_size}"
        if title == "Leaders" and values != [1.0]:
            return "want exactly 1 leader"
        if title.startswith("TrainingJobs by phase"):
            phase = "Running" if a.stage == "running" else "Succeeded"
            got = {l.get("phase"): v for l, v in zip(labels, values)}
            if got.get(phase) != 1.0:
                return f"want 1 job in phase {phase}, got {got}"
        return None

    def check_target(self, where, uid, title, expr, selections):
        for sel_name, values in selections:
            try:
                sent = substitute(expr, values)
            except KeyError as e:
                self.fail(where, expr, None, f"undefined variable ${e.args[0]}")
                return
            answer = self.prom.query(sent)
            self.checked += 1
            result = (answer.get("data") or {}).get("result")
            if answer.get("status") != "success":
                self.fail(f"{where} [{sel_name}]", sent, answer, "query failed")
            elif not isinstance(result, list) or not result:
                self.fail(f"{where} [{sel_name}]", sent, answer, "no data")
            elif not any(math.isfinite(float(r["value"][1])) for r in result):
                self.fail(f"{where} [{sel_name}]", sent, answer, "only NaN/Inf samples")
            else:
                why = self.expectation(uid, title, result)
                if why:
                    self.fail(f"{where} [{sel_name}]", sent, answer, why)
                elif sel_name == "selected":
                    shown = ", ".join(f"{r['value'][1]}" for r in result[:4])
                    print(f"  ok: {where}: {len(result)} series ({shown}{', ...' if len(result) > 4 else ''})")

    def check_dashboard(self, path):
        name = os.path.basename(path)
        with open(path) as f:
            d = json.load(f)
        print(f"{name}:")
        selections = self.resolve_variables(name, d)
        metrics = set()
        for p in d.get("panels", []):
            for t in p.get("targets") or []:
                expr = t.get("expr") or ""
                metrics.update(METRIC.findall(expr))
                where = f"{name}: panel {p.get('id')} '{p.get('title')}' target {t.get('refId')}"
                self.check_target(where, d.get("uid"), p.get("title", ""), expr, selections)
        for var in d.get("templating", {}).get("list", []):
            metrics.update(METRIC.findall(variable_query(var) or ""))
        return metrics

    def check_metric_names(self, metrics):
        answer = self.prom.label_values("__name__", None, 60)
        live = set(answer.get("data") or [])
        self.checked += 1
        missing = sorted(metrics - live)
        if missing:
            self.fail("metric names the dashboards query", "/api/v1/label/__name__/values", sorted(
                n for n in live if n.startswith("meshwork_")), f"not in the live scrape: {missing}")
        else:
            print(f"  all {len(metrics)} metric names the dashboards query are in the live scrape")


def check(args):
    prom = Prometheus(args.prometheus, args.time if args.time else time.time())
    checker = Checker(prom, args)
    paths = sorted(os.path.join(args.dashboards, f) for f in os.listdir(args.dashboards) if f.endswith(".json"))
    if args.stage == "succeeded":
        # The trainers are gone: only the operator's series are live.
        paths = [p for p in paths if "operator" in os.path.basename(p)]
    # The check must be able to fail: a query for a metric nobody exports has to be reported.
    checker.check_target("self-test", "", "self-test", 'meshwork_no_such_metric{job=~"$job"}',
                         [("selected", {"job": ".*"})])
    if len(checker.failures) != 1:
        print("FAIL: a query without data was not reported; the check is not working")
        return 1
    checker.failures, checker.checked = [], 0
    metrics = set()
    for path in paths:
        metrics |= checker.check_dashboard(path)
    if args.stage == "running":
        checker.check_metric_names(metrics)
    for f in checker.failures:
        print("FAIL: " + f)
    print(f"{args.stage}: {checker.checked} queries, {len(checker.failures)} failed")
    return 1 if checker.failures else 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("file-sd")
    f.add_argument("out")
    c = sub.add_parser("check")
    c.add_argument("--prometheus", required=True)
    c.add_argument("--dashboards", required=True)
    c.add_argument("--stage", choices=["running", "succeeded"], required=True)
    c.add_argument("--namespace", required=True)
    c.add_argument("--job", required=True)
    c.add_argument("--world-size", type=int, required=True)
    c.add_argument("--scrape-interval", type=int, default=1)
    c.add_argument("--range", type=int, required=True)
    c.add_argument("--time", type=float, default=0, help="evaluate at this Unix time (default: now)")
    args = ap.parse_args()
    return file_sd(args.out) if args.cmd == "file-sd" else check(args)


if __name__ == "__main__":
    sys.exit(main())
