#!/usr/bin/env bash
# Copies what the Helm chart ships from its sources of truth into charts/meshwork-operator/:
# the CRDs (crds/; trainingruntime.yaml is first generated from trainingjob.yaml), the alert rules (metrics/alerts/) and the dashboards (metrics/dashboards/), and
# regenerates the chart README's values table. Helm cannot read files outside a chart, hence the
# copies; ctest helm_chart fails when they drift. Run it after changing any of those.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
chart=$root/charts/meshwork-operator
mkdir -p "$chart/crds" "$chart/files/dashboards"
python3 "$root/scripts/gen_runtime_crd.py"
cp "$root/crds/trainingjob.yaml" "$chart/crds/trainingjob.yaml"
cp "$root/crds/trainingruntime.yaml" "$chart/crds/trainingruntime.yaml"
cp "$root/metrics/alerts/meshwork-alerts.yaml" "$chart/files/meshwork-alerts.yaml"
rm -f "$chart"/files/dashboards/*.json
cp "$root"/metrics/dashboards/*.json "$chart/files/dashboards/"
python3 "$root/scripts/chart_readme.py" --write "$chart"
echo "sync-chart: $chart is up to date"
