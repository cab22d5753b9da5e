{{/* Chart name, truncated to leave room for suffixes. */}}
{{- define "gpuslice.name" -}}
{{- .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-scoped base name of every object: <release> when it contains the chart name, else <release>-<chart>. */}}
{{- define "gpuslice.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "gpuslice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "gpuslice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpuslice
{{- end -}}

{{/* Selector labels of one component; call with (dict "ctx" . "component" "name"). */}}
{{- define "gpuslice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuslice.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The gpuslice image. */}}
{{- define "gpuslice.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The kube-scheduler image: the configured tag, else the cluster's version without build metadata. */}}
{{- define "gpuslice.kubeSchedulerImage" -}}
{{- $tag := .Values.scheduler.kubeScheduler.tag -}}
{{- if not $tag -}}
{{- $tag = printf "v%s.%s.%s" (.Capabilities.KubeVersion.Major | trimSuffix "+") (.Capabilities.KubeVersion.Minor | trimSuffix "+") ((semver .Capabilities.KubeVersion.Version).Patch | toString) -}}
{{- end -}}
{{- printf "%s:%s" .Values.scheduler.kubeScheduler.image $tag -}}
{{- end -}}

{{/* Names of the components' objects. */}}
{{- define "gpuslice.devicePluginName" -}}{{ include "gpuslice.fullname" . }}-device-plugin{{- end -}}
{{- define "gpuslice.schedulerName" -}}{{ include "gpuslice.fullname" . }}-scheduler{{- end -}}
{{- define "gpuslice.webhookName" -}}{{ include "gpuslice.fullname" . }}-webhook{{- end -}}

{{/* imagePullSecrets block of a pod spec. */}}
{{- define "gpuslice.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Fail early on values the schema cannot express. */}}
{{- define "gpuslice.validate" -}}
{{- $names := dict -}}
{{- range .Values.devicePlugin.nodeConfigs -}}
{{- if hasKey $names .name -}}
{{- fail (printf "devicePlugin.nodeConfigs: name %q is used twice; each node configuration needs its own name" .name) -}}
{{- end -}}
{{- $_ := set $names .name true -}}
{{- end -}}
{{- if eq .Values.scheduler.schedulerName "default-scheduler" -}}
{{- fail "scheduler.schedulerName=default-scheduler: must not be the stock profile; GPU pods must reach the profile that calls the gpuslice extender (e.g. gpuslice-scheduler)" -}}
{{- end -}}
{{- if and .Values.scheduler.podDisruptionBudget.enabled (ge (int .Values.scheduler.podDisruptionBudget.minAvailable) (int .Values.scheduler.replicas)) (gt (int .Values.scheduler.replicas) 1) -}}
{{- fail (printf "scheduler.podDisruptionBudget.minAvailable=%v: must be below scheduler.replicas=%v, or no node could ever be drained" .Values.scheduler.podDisruptionBudget.minAvailable .Values.scheduler.replicas) -}}
{{- end -}}
{{- end -}}

{{/* Namespaces the webhook never sees, as a JSON list: the configured ones and the release's own. */}}
{{- define "gpuslice.webhookExcludedNamespaces" -}}
{{- toJson (uniq (append (.Values.webhook.excludedNamespaces | default list) .Release.Namespace)) -}}
{{- end -}}
