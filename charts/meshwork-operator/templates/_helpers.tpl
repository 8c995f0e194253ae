{{/* The chart's name, or nameOverride. */}}
{{- define "meshwork-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release name + chart name (once, when the release name already holds it), at most 63 characters. */}}
{{- define "meshwork-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "meshwork-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "meshwork-operator.labels" -}}
helm.sh/chart: {{ include "meshwork-operator.chart" . }}
{{ include "meshwork-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: meshwork
{{- end }}

{{/* Labels that select the operator's Pods; never change them (Deployment selectors are immutable). */}}
{{- define "meshwork-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "meshwork-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "meshwork-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "meshwork-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name: set it to an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The metrics Service's name: the full name cut so that "-metrics" still fits in 63 characters. */}}
{{- define "meshwork-operator.metricsServiceName" -}}
{{- printf "%s-metrics" (include "meshwork-operator.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{/* The Lease's name: operator.leaderElection.id, else the full name. */}}
{{- define "meshwork-operator.leaseName" -}}
{{- default (include "meshwork-operator.fullname" .) .Values.operator.leaderElection.id }}
{{- end }}

{{/* Labels for objects that are not the operator's Pods (the helm test Pod): no selector labels. */}}
{{- define "meshwork-operator.nonSelectorLabels" -}}
helm.sh/chart: {{ include "meshwork-operator.chart" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: meshwork
{{- end }}

{{- define "meshwork-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The RBAC rules for TrainingJobs and their children: exactly the calls the operator makes (docs/operator.md, "RBAC"). */}}
{{- define "meshwork-operator.rules" -}}
- apiGroups: [meshwork.dev]
  resources: [trainingjobs]
  verbs: [list, watch, delete]
- apiGroups: [meshwork.dev]
  resources: [trainingjobs/status, trainingjobs/finalizers]
  verbs: [update]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete, patch]
- apiGroups: [""]
  resources: [pods/log]
  verbs: [get]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, update]
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [scheduling.k8s.io, scheduling.volcano.sh, scheduling.x-k8s.io]
  resources: [podgroups]
  verbs: [get, create, update]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get, create, delete]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [update]
{{- end }}

{{/* Gang admission reads the Nodes' capacity: cluster-scoped, so a ClusterRole even when the
operator watches one namespace. */}}
{{- define "meshwork-operator.clusterScopedRules" -}}
- apiGroups: [""]
  resources: [nodes]
  verbs: [list, watch]
- apiGroups: [meshwork.dev]
  resources: [trainingruntimes]
  verbs: [get]
- apiGroups: [kueue.x-k8s.io]
  resources: [resourceflavors, workloadpriorityclasses]
  verbs: [get]
- apiGroups: [scheduling.k8s.io]
  resources: [priorityclasses]
  verbs: [get]
{{- end }}

{{/* Checks on values that the schema cannot express; each names the value. */}}
{{- define "meshwork-operator.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.operator.leaderElection.enabled) }}
{{- fail (printf "replicaCount: %d replicas need operator.leaderElection.enabled=true, or two operators reconcile the same jobs" (int .Values.replicaCount)) }}
{{- end }}
{{- $le := .Values.operator.leaderElection }}
{{- if not (gt (int $le.leaseDurationSeconds) (int $le.renewDeadlineSeconds)) }}
{{- fail (printf "operator.leaderElection.leaseDurationSeconds: %v must be greater than renewDeadlineSeconds (%v)" $le.leaseDurationSeconds $le.renewDeadlineSeconds) }}
{{- end }}
{{- if not (gt (mulf (float64 $le.renewDeadlineSeconds) 1.0) (mulf (float64 $le.retryPeriodSeconds) 1.2)) }}
{{- fail (printf "operator.leaderElection.renewDeadlineSeconds: %v must be greater than 1.2 x retryPeriodSeconds (%v)" $le.renewDeadlineSeconds $le.retryPeriodSeconds) }}
{{- end }}
{{- end }}
