#!/usr/bin/env python3
"""Checks charts/meshwork-operator with the real helm and promtool.

    helm_chart_test.py SOURCE_DIR [MESHWORK_OPERATOR]

- `helm lint --strict` with the default values and with each file in the chart's ci/ folder;
- `helm template` of each, and what the rendered objects must hold: the Deployment's security
  context, probes and flags; RBAC equal to docs/operator.md's ClusterRole (so the chart and the
  docs cannot drift); a Role instead of a ClusterRole when one namespace is watched; the
  ServiceMonitor, PodMonitor (honorLabels), PrometheusRule (the alerts file's groups, checked by
  `promtool check rules`) and dashboard ConfigMaps (the dashboards' JSON, the sidecar label);
- value combinations (leader election off, no RBAC, an existing ServiceAccount, long release
  names, overrides) render what they should;
- with MESHWORK_OPERATOR given, the operator accepts every flag list the chart renders;
- bad values fail, and the message names the value;
- the chart's copies of the CRD, alerts and dashboards equal the repository's, and the README's
  values table equals what scripts/chart_readme.py generates from values.yaml.

Prints one line per check; exits 1 when any fails, 2 when helm or promtool is missing.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

SRC = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../.."))
CHART = os.path.join(SRC, "charts/meshwork-operator")
KUBE_VERSION = "1.29.0"  # the oldest release the chart supports (kubeVersion: >= 1.29: CEL with the quantity library)
failures = []


def find_helm():
    """The helm scripts/kube-build.sh built (helm.sh/helm/v3, tools/helm/go.mod)."""
    kube_bin = os.environ.get("MESHWORK_KUBE_BIN") or os.path.join(SRC, ".meshwork/kube/bin")
    local = os.path.join(kube_bin, "helm")
    if not os.access(local, os.X_OK):
        print(f"FATAL: helm not found at {local}: run scripts/setup.sh")
        sys.exit(2)
    return local


HELM = find_helm()
OPERATOR = sys.argv[2] if len(sys.argv) > 2 else None
PROMTOOL = shutil.which("promtool")
if not PROMTOOL:
    print("FATAL: promtool not found: run scripts/setup.sh (Debian package prometheus)")
    sys.exit(2)


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + ("" if ok or not detail else f"\n     {detail}"))
    if not ok:
        failures.append(name)


def helm(*args):
    return subprocess.run([HELM, *args], capture_output=True, text=True)


def render(*args, namespace="meshwork-system"):
    r = helm("template", "meshwork", CHART, "-n", namespace, "--kube-version", KUBE_VERSION, *args)
    if r.returncode != 0:
        return None, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d], ""


def objects(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def one(docs, kind):
    found = objects(docs, kind)
    return found[0] if len(found) == 1 else None


def docs_rbac_rules(kind="ClusterRole"):
    """The rules of the ClusterRole (or the leader-election Role) in docs/operator.md's RBAC section."""
    text = open(os.path.join(SRC, "docs/operator.md"), encoding="utf-8").read()
    section = text.split("## RBAC", 1)[1]
    block = section.split("```yaml", 1)[1].split("```", 1)[0]
    return [d for d in yaml.safe_load_all(block) if d["kind"] == kind][0]["rules"]


def normalize(rules):
    return sorted(json.dumps({k: sorted(v) for k, v in r.items()}, sort_keys=True) for r in rules)


def check_flags_parse(label, dep):
    """The operator parses flags in order and exits 2 on a bad one, before it reaches --help."""
    if not OPERATOR or dep is None:
        return
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    r = subprocess.run([OPERATOR, *args, "--help"], capture_output=True, text=True)
    check(f"{label}: meshwork-operator accepts the rendered flags", r.returncode == 0,
          f"exit {r.returncode}: {r.stderr.strip().splitlines()[:2]}")


def check_deployment(label, docs, replicas):
    dep = one(docs, "Deployment")
    check(f"{label}: one Deployment", dep is not None)
    if dep is None:
        return None
    spec = dep["spec"]["template"]["spec"]
    c = spec["containers"][0]
    psc, csc = spec.get("securityContext", {}), c.get("securityContext", {})
    check(f"{label}: replicas {replicas}", dep["spec"]["replicas"] == replicas, dep["spec"]["replicas"])
    check(f"{label}: Pod runs as non-root with seccomp RuntimeDefault",
          psc.get("runAsNonRoot") is True and psc.get("runAsUser", 0) != 0
          and psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", psc)
    check(f"{label}: container: read-only root fs, no privilege escalation, no capabilities",
          csc.get("readOnlyRootFilesystem") is True and csc.get("allowPrivilegeEscalation") is False
          and csc.get("capabilities", {}).get("drop") == ["ALL"], csc)
    check(f"{label}: probes on /healthz and /readyz at the metrics port",
          c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
          and c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"})
    args = c["args"]
    check(f"{label}: leader election on, Lease in the Pod's namespace",
          "--leader-elect=true" in args and "--leader-election-namespace=$(POD_NAMESPACE)" in args, args)
    check(f"{label}: each Pod's identity is its name", "--identity=$(POD_NAME)" in args, args)
    check(f"{label}: the ServiceAccount the chart creates is the one the Pods use",
          spec["serviceAccountName"] in [o["metadata"]["name"] for o in objects(docs, "ServiceAccount")],
          spec["serviceAccountName"])
    selector = dep["spec"]["selector"]["matchLabels"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    check(f"{label}: the selector matches the Pod labels",
          all(labels.get(k) == v for k, v in selector.items()), (selector, labels))
    check_flags_parse(label, dep)
    return dep


def main():
    version = helm("version", "--short").stdout.strip()
    print(f"helm {version} ({HELM}), promtool {PROMTOOL}")
    ci_files = sorted(f for f in os.listdir(os.path.join(CHART, "ci")) if f.endswith(".yaml"))
    check("the chart has ci/ values files", len(ci_files) >= 3, ci_files)

    for values in [None] + ci_files:
        args = [] if values is None else ["-f", os.path.join(CHART, "ci", values)]
        label = values or "defaults"
        r = helm("lint", "--strict", CHART, *args)
        check(f"helm lint --strict ({label})", r.returncode == 0, r.stdout + r.stderr)
        docs, err = render(*args)
        check(f"helm template ({label})", docs is not None, err)

    # Defaults: cluster-wide RBAC, no monitoring objects.
    docs, _ = render()
    if docs:
        check_deployment("defaults", docs, 1)
        cr = one(docs, "ClusterRole")
        check("defaults: a ClusterRole and no namespaced Role for the jobs",
              cr is not None and [r["metadata"]["name"] for r in objects(docs, "Role")] == ["meshwork-meshwork-operator-leader-election"])
        if cr:
            check("defaults: the ClusterRole's rules are docs/operator.md's, exactly",
                  normalize(cr["rules"]) == normalize(docs_rbac_rules()),
                  f"chart {cr['rules']} vs docs {docs_rbac_rules()}")
            verbs = {v for r in cr["rules"] for v in r["verbs"]}
            pod_verbs = {v for r in cr["rules"] if "pods" in r["resources"] for v in r["verbs"]}
            # Pods are patched only to remove the gang admission gate (docs/operator.md).
            check("defaults: no wildcard; Pods are never updated or deleted as a collection (least privilege)",
                  "*" not in verbs and all("*" not in r["resources"] for r in cr["rules"])
                  and pod_verbs and not pod_verbs & {"update", "deletecollection"}, cr["rules"])
        le = [r for r in objects(docs, "Role") if r["metadata"]["name"].endswith("-leader-election")]
        check("defaults: the Lease Role is docs/operator.md's, in the release namespace",
              len(le) == 1 and le[0]["metadata"]["namespace"] == "meshwork-system"
              and normalize(le[0]["rules"]) == normalize(docs_rbac_rules("Role")))
        crb = one(docs, "ClusterRoleBinding")
        check("defaults: the ClusterRoleBinding binds the ServiceAccount in the release namespace",
              crb is not None and crb["subjects"] == [{"kind": "ServiceAccount", "name": "meshwork-meshwork-operator",
                                                       "namespace": "meshwork-system"}])
        svc = one(docs, "Service")
        check("defaults: the metrics Service targets the metrics port",
              svc is not None and svc["spec"]["ports"][0]["targetPort"] == "metrics")
        kinds = {d["kind"] for d in docs}
        check("defaults: no ServiceMonitor, PodMonitor, PrometheusRule or dashboards",
              not kinds & {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"}, kinds)
        hook = [d for d in docs if d["kind"] == "Pod"]
        check("defaults: a helm test hook Pod",
              len(hook) == 1 and hook[0]["metadata"]["annotations"].get("helm.sh/hook") == "test")
        for d in docs:
            if d["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
                check(f"defaults: {d['kind']} {d['metadata']['name']} has a namespace",
                      d["metadata"].get("namespace") == "meshwork-system", d["metadata"])

    # One watched namespace: Role there, --namespace.
    docs, _ = render("-f", os.path.join(CHART, "ci/namespaced-values.yaml"))
    if docs:
        dep = check_deployment("namespaced", docs, 1)
        cluster_roles = objects(docs, "ClusterRole")
        cluster_scoped = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]},
                          {"apiGroups": ["meshwork.dev"], "resources": ["trainingruntimes"], "verbs": ["get"]},
                          {"apiGroups": ["kueue.x-k8s.io"], "resources": ["resourceflavors", "workloadpriorityclasses"],
                           "verbs": ["get"]},
                          {"apiGroups": ["scheduling.k8s.io"], "resources": ["priorityclasses"], "verbs": ["get"]}]
        check("namespaced: one ClusterRole, which only lists Nodes (gang admission), gets TrainingRuntimes, ResourceFlavors and priority classes, "
              "and its binding",
              [r["metadata"]["name"] for r in cluster_roles] == ["meshwork-meshwork-operator-cluster-scoped"]
              and cluster_roles[0]["rules"] == cluster_scoped
              and [b["metadata"]["name"] for b in objects(docs, "ClusterRoleBinding")]
              == ["meshwork-meshwork-operator-cluster-scoped"],
              [r["metadata"]["name"] for r in cluster_roles])
        roles = {r["metadata"]["namespace"] + "/" + r["metadata"]["name"]: r for r in objects(docs, "Role")}
        jobs_role = roles.get("ml-jobs/meshwork-meshwork-operator")
        namespaced_rules = [r for r in docs_rbac_rules() if r not in cluster_scoped]
        check("namespaced: a Role in the watched namespace with docs/operator.md's rules (less the cluster-scoped)",
              jobs_role is not None and normalize(jobs_role["rules"]) == normalize(namespaced_rules), sorted(roles))
        binding = [b for b in objects(docs, "RoleBinding") if b["metadata"]["namespace"] == "ml-jobs"]
        check("namespaced: the RoleBinding there binds the ServiceAccount from the release namespace",
              len(binding) == 1 and binding[0]["subjects"][0]["namespace"] == "meshwork-system"
              and binding[0]["subjects"][0]["name"] == "meshwork-operator")
        if dep:
            args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
            check("namespaced: --namespace=ml-jobs, the grace period and the report interval",
                  {"--namespace=ml-jobs", "--pod-delete-grace-s=5", "--report-interval-s=5"} <= set(args), args)
        pm = render("-f", os.path.join(CHART, "ci/namespaced-values.yaml"), "--set", "trainerPodMonitor.enabled=true")[0]
        pm = pm and one(pm, "PodMonitor")
        check("namespaced: the trainer PodMonitor looks in the watched namespace only",
              pm is not None and pm["spec"]["namespaceSelector"] == {"matchNames": ["ml-jobs"]})

    # Monitoring: ServiceMonitor, PodMonitor, PrometheusRule, dashboards, two replicas.
    docs, _ = render("-f", os.path.join(CHART, "ci/monitoring-values.yaml"))
    if docs:
        dep = check_deployment("monitoring", docs, 2)
        if dep:
            check("monitoring: two replicas are spread by a preferred anti-affinity",
                  "podAntiAffinity" in dep["spec"]["template"]["spec"].get("affinity", {}))
        sm = one(docs, "ServiceMonitor")
        check("monitoring: a ServiceMonitor for the metrics Service with the release label",
              sm is not None and sm["spec"]["endpoints"][0]["port"] == "metrics"
              and sm["metadata"]["labels"].get("release") == "kube-prometheus-stack")
        alerts_text = open(os.path.join(SRC, "metrics/alerts/meshwork-alerts.yaml"), encoding="utf-8").read()
        job = [r.get("replacement") for r in (sm or {"spec": {"endpoints": [{}]}})["spec"]["endpoints"][0].get("relabelings", [])
               if r.get("targetLabel") == "job"]
        check("monitoring: the ServiceMonitor's scrape job is the one MeshworkOperatorDown selects",
              job == ["meshwork-operator"] and 'up{job="meshwork-operator"}' in alerts_text, job)
        pm = one(docs, "PodMonitor")
        endpoint = pm["spec"]["podMetricsEndpoints"][0] if pm else {}
        keep = [r for r in endpoint.get("relabelings", []) if r.get("action") == "keep"
                and r.get("sourceLabels") == ["__meta_kubernetes_pod_container_port_name"]]
        check("monitoring: a PodMonitor for trainer Pods (label meshwork.dev/job, every namespace), honorLabels",
              pm is not None and pm["spec"]["selector"]["matchExpressions"][0] == {"key": "meshwork.dev/job", "operator": "Exists"}
              and endpoint.get("honorLabels") is True and "port" not in endpoint
              and pm["spec"]["namespaceSelector"] == {"any": True}, pm and pm["spec"])
        # Prometheus anchors relabel regexes. The operator names local rank i's port metrics-i
        # (operator/controller/desired.cpp; operator_controller_test checks the names).
        regex = keep[0]["regex"] if keep else "(?!)"
        check("monitoring: the PodMonitor keeps ports metrics, metrics-1 ... metrics-63 and drops rendezvous",
              all(re.fullmatch(regex, n) for n in ["metrics", "metrics-1", "metrics-63"])
              and not any(re.fullmatch(regex, n) for n in ["rendezvous", "metricsx", "metrics-"]), regex)
        rule = one(docs, "PrometheusRule")
        alerts = yaml.safe_load(open(os.path.join(SRC, "metrics/alerts/meshwork-alerts.yaml"), encoding="utf-8"))
        check("monitoring: the PrometheusRule holds metrics/alerts/meshwork-alerts.yaml's groups",
              rule is not None and rule["spec"]["groups"] == alerts["groups"])
        if rule:
            with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
                yaml.safe_dump({"groups": rule["spec"]["groups"]}, f)
            r = subprocess.run([PROMTOOL, "check", "rules", f.name], capture_output=True, text=True)
            os.unlink(f.name)
            check("monitoring: promtool check rules passes on the PrometheusRule's groups",
                  r.returncode == 0, r.stdout + r.stderr)
        maps = objects(docs, "ConfigMap")
        sources = sorted(f for f in os.listdir(os.path.join(SRC, "metrics/dashboards")) if f.endswith(".json"))
        check("monitoring: one dashboard ConfigMap per dashboard",
              sorted(k for m in maps for k in m["data"]) == sources, [m["metadata"]["name"] for m in maps])
        for m in maps:
            name = m["metadata"]["name"]
            check(f"monitoring: {name} is in namespace monitoring, labelled grafana_dashboard=1, with the folder annotation",
                  m["metadata"]["namespace"] == "monitoring" and m["metadata"]["labels"].get("grafana_dashboard") == "1"
                  and m["metadata"].get("annotations", {}).get("grafana_folder") == "Meshwork")
            for key, text in m["data"].items():
                want = json.load(open(os.path.join(SRC, "metrics/dashboards", key), encoding="utf-8"))
                check(f"monitoring: {name}/{key} is the dashboard's JSON", json.loads(text) == want)

    # Combinations of values.
    docs, err = render("--set", "operator.leaderElection.enabled=false")
    if docs:
        dep = one(docs, "Deployment")
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        check("leader election off: Recreate rollouts (never two operators at once), no Lease Role, no lease flags",
              dep["spec"].get("strategy") == {"type": "Recreate"} and "--leader-elect=false" in args
              and not any(a.startswith("--leader-election") for a in args)
              and not [r for r in objects(docs, "Role") if r["metadata"]["name"].endswith("-leader-election")], args)
        check_flags_parse("leader election off", dep)
    docs, _ = render()
    check("leader election on: a rolling update one Pod at a time, the old one first (no surge Pod on a taken port)",
          docs is not None and one(docs, "Deployment")["spec"].get("strategy")
          == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}})
    for value, want in [("0", "--pod-delete-grace-s=0"), ("null", None), ("", None)]:
        docs, err = render("--set", f"operator.podDeleteGraceSeconds={value}")
        args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"] if docs else []
        grace = [a for a in args if a.startswith("--pod-delete-grace-s")]
        shown = value or '""'
        check(f"podDeleteGraceSeconds={shown} renders {want or 'no flag'}",
              docs is not None and grace == ([want] if want else []), err or grace)
    # --set types only integers and booleans (2.5 would be a string): a fraction goes by --set-json.
    for values, want in [((), []), (("--set", "operator.kubeApiQps=50"), ["--kube-api-qps=50"]),
                         (("--set-json", "operator.kubeApiQps=2.5", "--set", "operator.kubeApiBurst=4"),
                          ["--kube-api-qps=2.5", "--kube-api-burst=4"]),
                         (("--set", "operator.kubeApiBurst=4"), [])]:
        docs, err = render(*values)
        dep = one(docs, "Deployment") if docs else None
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"] if dep else []
        got = [a for a in args if a.startswith("--kube-api-")]
        check(f"{' '.join(values) or 'default values'}: renders {' '.join(want) or 'no client rate limit flag'}",
              docs is not None and got == want, err or got)
        check_flags_parse(' '.join(values) or "default values", dep)
    docs, err = render("--set", "rbac.create=false")
    check("rbac.create=false: no Role, RoleBinding, ClusterRole or ClusterRoleBinding",
          docs is not None and not {d["kind"] for d in docs} & {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}, err)
    docs, err = render("--set", "serviceAccount.create=false", "--set", "serviceAccount.name=platform-sa")
    if docs:
        crb = one(docs, "ClusterRoleBinding")
        check("an existing ServiceAccount: none created, the Pods and bindings use it",
              not objects(docs, "ServiceAccount")
              and one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "platform-sa"
              and crb["subjects"][0]["name"] == "platform-sa")
    else:
        check("an existing ServiceAccount renders", False, err)
    docs, err = render("--set", "service.enabled=false")
    check("service.enabled=false: no Service and no helm test Pod",
          docs is not None and not objects(docs, "Service") and not objects(docs, "Pod"), err)
    docs, err = render("--set", "fullnameOverride=mw", "--set", "operator.leaderElection.id=custom-lease")
    if docs:
        args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        check("fullnameOverride names every object; leaderElection.id names the Lease",
              one(docs, "Deployment")["metadata"]["name"] == "mw" and one(docs, "Service")["metadata"]["name"] == "mw-metrics"
              and "--leader-election-id=custom-lease" in args)
    docs, _ = render()
    if docs:
        args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        check("by default the Lease is named after the release, so two releases never share one",
              "--leader-election-id=meshwork-meshwork-operator" in args, args)
    docs, err = render("--set", "podLabels.app\\.kubernetes\\.io/name=other", "--set", "podLabels.team=ml")
    if docs:
        dep = one(docs, "Deployment")
        labels = dep["spec"]["template"]["metadata"]["labels"]
        check("podLabels cannot override the selector's labels",
              labels.get("app.kubernetes.io/name") == "meshwork-operator" and labels.get("team") == "ml", labels)
    else:
        check("podLabels renders", False, err)
    long_release = "r" * 53  # Helm's limit for release names
    r = helm("template", long_release, CHART, "-n", "ns", "--kube-version", KUBE_VERSION,
             "-f", os.path.join(CHART, "ci/monitoring-values.yaml"))
    docs = [d for d in yaml.safe_load_all(r.stdout) if d] if r.returncode == 0 else None
    if docs:
        dns_label_kinds = {"Service", "Deployment", "Pod"}  # names that become DNS labels or hostnames
        too_long = [f"{d['kind']}/{d['metadata']['name']}" for d in docs
                    if d["kind"] in dns_label_kinds and len(d["metadata"]["name"]) > 63]
        long_labels = [f"{d['kind']}: {k}={v}" for d in docs for k, v in d["metadata"].get("labels", {}).items()
                       if len(str(v)) > 63]
        check("a 53-character release: Service, Deployment and Pod names and label values fit 63 characters",
              not too_long and not long_labels, too_long + long_labels)
    else:
        check("a 53-character release renders", False, r.stderr)
    docs, _ = render()
    if docs:
        hook = [d for d in docs if d["kind"] == "Pod"][0]
        dep = one(docs, "Deployment")
        selector = dep["spec"]["selector"]["matchLabels"]
        check("the helm test Pod does not carry the operator's selector labels",
              not all(hook["metadata"]["labels"].get(k) == v for k, v in selector.items()), hook["metadata"]["labels"])

    # Bad values fail with a message naming the value.
    bad = [
        (["--set", "operator.workers=0"], "operator.workers"),
        (["--set", "operator.kubeApiQps=-1"], "operator.kubeApiQps"),
        (["--set", "replicaCount=2", "--set", "operator.leaderElection.enabled=false"], "replicaCount"),
        (["--set", "replicaz=2"], "replicaz"),
        (["--set", "operator.leaderElection.renewDeadlineSeconds=20"], "leaseDurationSeconds"),
        (["--set", "operator.leaderElection.retryPeriodSeconds=9"], "renewDeadlineSeconds"),
        (["--set", "serviceMonitor.enabled=true", "--set", "service.enabled=false"], "serviceMonitor.enabled"),
        (["--set", "serviceAccount.create=false"], "serviceAccount.name"),
        (["--set", "metricsPort=70000"], "metricsPort"),
        (["--set", "operator.watchNamespace=Not_A_Namespace"], "operator.watchNamespace"),
        (["--set", "image.pullPolicy=Sometimes"], "image.pullPolicy"),
    ]
    for args, field in bad:
        docs, err = render(*args)
        # helm 3.22's schema errors name the value as a JSON pointer ("at '/operator/workers'").
        named = field in err or "'/" + field.replace(".", "/") + "'" in err
        check(f"bad values {' '.join(args)} fail naming {field}", docs is None and named,
              "rendered" if docs is not None else err.strip().splitlines()[-1] if err.strip() else "no message")

    # The chart's copies and README.
    def same(a, b):
        return open(a, "rb").read() == open(b, "rb").read()
    fix = " (run scripts/sync-chart.sh)"
    for crd in ("trainingjob.yaml", "trainingruntime.yaml"):
        check(f"crds/{crd} in the chart equals the repository's" + fix,
              same(os.path.join(CHART, "crds", crd), os.path.join(SRC, "crds", crd)))
    r = subprocess.run([sys.executable, os.path.join(SRC, "scripts/gen_runtime_crd.py"), "--check"],
                       capture_output=True, text=True)
    check("crds/trainingruntime.yaml is generated from crds/trainingjob.yaml" + fix, r.returncode == 0, r.stderr.strip())
    check("files/meshwork-alerts.yaml equals metrics/alerts/meshwork-alerts.yaml" + fix,
          same(os.path.join(CHART, "files/meshwork-alerts.yaml"), os.path.join(SRC, "metrics/alerts/meshwork-alerts.yaml")))
    chart_dash = sorted(os.listdir(os.path.join(CHART, "files/dashboards")))
    check("files/dashboards/ holds exactly metrics/dashboards/*.json" + fix, chart_dash == sources, chart_dash)
    for f in sources:
        if f in chart_dash:
            check(f"files/dashboards/{f} equals metrics/dashboards/{f}" + fix,
                  same(os.path.join(CHART, "files/dashboards", f), os.path.join(SRC, "metrics/dashboards", f)))
    r = subprocess.run([sys.executable, os.path.join(SRC, "scripts/chart_readme.py"), "--check", CHART],
                       capture_output=True, text=True)
    check("the chart README's values table is generated from values.yaml" + fix, r.returncode == 0, r.stderr)
    chart = yaml.safe_load(open(os.path.join(CHART, "Chart.yaml"), encoding="utf-8"))
    cmake = open(os.path.join(SRC, "CMakeLists.txt"), encoding="utf-8").read()
    check("Chart.yaml appVersion is the project's version",
          f"VERSION {chart['appVersion']} " in cmake, chart["appVersion"])

    print(f"{len(failures)} failed" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
