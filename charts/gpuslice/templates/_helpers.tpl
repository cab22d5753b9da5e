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

{{/* kube-scheduler's HTTPS port: scheduler.kubeScheduler.securePort, absent after helm upgrade
--reuse-values from a chart without it (0 would turn kube-scheduler's HTTPS off). */}}
{{- define "gpuslice.kubeSchedulerPort" -}}
{{- .Values.scheduler.kubeScheduler.securePort | default 10259 | int64 -}}
{{- end -}}

{{/* Names of the components' objects. */}}
{{- define "gpuslice.devicePluginName" -}}{{ include "gpuslice.fullname" . }}-device-plugin{{- end -}}
{{- define "gpuslice.schedulerName" -}}{{ include "gpuslice.fullname" . }}-scheduler{{- end -}}
{{- define "gpuslice.webhookName" -}}{{ include "gpuslice.fullname" . }}-webhook{{- end -}}

{{/* imagePullSecrets block of a pod spec, or nothing. Callers indent it only when it is not empty
(with include ... | nindent), so that no blank line is left behind. */}}
{{- define "gpuslice.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets -}}
imagePullSecrets:
{{ toYaml . | indent 2 }}
{{- end -}}
{{- end -}}

{{/* Stop rendering with the message (a string naming the value, what it is and what is allowed).
`helm lint` runs templates in lint mode, where fail only logs and rendering goes on: the include
of a template that does not exist then stops lint too, with an error that carries the message. */}}
{{- define "gpuslice.fail" -}}
{{- fail . -}}
{{- include (printf "invalid values: %s" .) dict -}}
{{- end -}}

{{/* Fail early on values the schema cannot express. Rendered by templates/validate.yaml. */}}
{{- define "gpuslice.validate" -}}
{{- $names := dict -}}
{{- range $i, $c := .Values.devicePlugin.nodeConfigs -}}
{{- if hasKey $names $c.name -}}
{{- include "gpuslice.fail" (printf "devicePlugin.nodeConfigs[%d].name=%s: already used by devicePlugin.nodeConfigs[%d]; each node configuration needs its own name" $i $c.name (get $names $c.name)) -}}
{{- end -}}
{{- $_ := set $names $c.name $i -}}
{{- end -}}
{{- $s := .Values.scheduler -}}
{{- if eq $s.schedulerName "default-scheduler" -}}
{{- include "gpuslice.fail" "scheduler.schedulerName=default-scheduler: must not be the stock profile; GPU pods must reach the profile that calls the gpuslice extender (e.g. gpuslice-scheduler)" -}}
{{- end -}}
{{- if and $s.podDisruptionBudget.enabled (gt (int $s.replicas) 1) (ge (int $s.podDisruptionBudget.minAvailable) (int $s.replicas)) -}}
{{- include "gpuslice.fail" (printf "scheduler.podDisruptionBudget.minAvailable=%v: must be from 0 to scheduler.replicas-1 (%d), or no node could ever be drained" $s.podDisruptionBudget.minAvailable (sub (int $s.replicas) 1)) -}}
{{- end -}}
{{- if lt (float64 $s.extender.kubeAPIQPS) (float64 $s.kubeScheduler.clientQPS) -}}
{{- include "gpuslice.fail" (printf "scheduler.extender.kubeAPIQPS=%v: must be at least scheduler.kubeScheduler.clientQPS (%v); the extender binds every GPU pod kube-scheduler schedules, one API request each" $s.extender.kubeAPIQPS $s.kubeScheduler.clientQPS) -}}
{{- end -}}
{{- if lt (int64 $s.extender.kubeAPIBurst) (int64 $s.kubeScheduler.clientBurst) -}}
{{- include "gpuslice.fail" (printf "scheduler.extender.kubeAPIBurst=%v: must be at least scheduler.kubeScheduler.clientBurst (%v); the extender binds every GPU pod kube-scheduler schedules, one API request each" $s.extender.kubeAPIBurst $s.kubeScheduler.clientBurst) -}}
{{- end -}}
{{- $ksPort := include "gpuslice.kubeSchedulerPort" . | int64 -}}
{{- if or (eq $ksPort (int64 $s.extender.port)) (eq $ksPort (add $s.extender.port 1 | int64)) -}}
{{- include "gpuslice.fail" (printf "scheduler.kubeScheduler.securePort=%d: the extender uses scheduler.extender.port (%v) and its health port (port + 1) in the same pod network; choose another port" $ksPort $s.extender.port) -}}
{{- end -}}
{{- if and (not $s.leaderElection.enabled) (gt (int $s.replicas) 1) -}}
{{- include "gpuslice.fail" (printf "scheduler.leaderElection.enabled=false: needs scheduler.replicas=1 (got %v); schedulers without leader election would all schedule and bind the same pods" $s.replicas) -}}
{{- end -}}
{{- with .Values.webhook.certManager -}}
{{- if and .enabled .issuerRef (not .issuerRef.name) -}}
{{- include "gpuslice.fail" "webhook.certManager.issuerRef.name: required when issuerRef is set (the name of an existing Issuer or ClusterIssuer); leave issuerRef empty ({}) for a self-signed Issuer" -}}
{{- end -}}
{{- end -}}
{{- with .Values.webhook.tls -}}
{{- if and (or .caCert .cert .key) (not (and .caCert .cert .key)) -}}
{{- include "gpuslice.fail" "webhook.tls: set caCert, cert and key together (PEM text of the CA, the serving certificate and its key), or none of them" -}}
{{- end -}}
{{- if and .cert $.Values.webhook.certManager.enabled -}}
{{- include "gpuslice.fail" "webhook.tls and webhook.certManager.enabled=true: choose one source of the webhook's certificate" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The webhook binary's configuration file (webhook.ServerConfig). */}}
{{- define "gpuslice.webhookConfig" -}}
address: ":{{ .Values.webhook.port }}"
tlsCertFile: /etc/gpuslice/tls/tls.crt
tlsKeyFile: /etc/gpuslice/tls/tls.key
schedulerName: {{ .Values.scheduler.schedulerName }}
excludedNamespaces: {{ include "gpuslice.webhookExcludedNamespaces" . }}
{{- if .Values.webhook.hamiCompat }}
hamiCompat: true
{{- end }}
{{- if include "gpuslice.webhookDRA" . }}
dra:
  enabled: true
  deviceClassName: {{ include "gpuslice.draDriverName" . }}
  {{- with .Values.dra.webhook.namespaces }}
  namespaces: {{ toJson . }}
  {{- end }}
  {{- if .Values.scheduler.enabled }}
  # Converted pods go to the gpuslice profile, whose extender ranks their nodes.
  score: true
  {{- if .Values.dra.webhook.steerClaims }}
  # So do pods with claims of their own (dra.webhook.steerClaims).
  steerClaims: true
  {{- end }}
  {{- end }}
{{- end }}
{{- end -}}

{{/* "true" when the webhook steers pods with claims of their own to the gpuslice profile, else empty. */}}
{{- define "gpuslice.webhookSteerClaims" -}}
{{- if and (include "gpuslice.webhookDRA" .) .Values.scheduler.enabled .Values.dra.webhook.steerClaims }}true{{ end -}}
{{- end -}}

{{/* "true" when the webhook turns hami.io pods bound for the DRA pool into claims, else empty. */}}
{{- define "gpuslice.webhookDRA" -}}
{{- if and .Values.webhook.enabled .Values.dra.enabled .Values.dra.webhook.enabled }}true{{ end -}}
{{- end -}}

{{/* Namespaces the webhook never sees, as a JSON list: the configured ones and the release's own. */}}
{{- define "gpuslice.webhookExcludedNamespaces" -}}
{{- toJson (uniq (append (.Values.webhook.excludedNamespaces | default list) .Release.Namespace)) -}}
{{- end -}}

{{/* The device plugin's hostLibVGPU: the value given, else where libvgpu.image copies it. Takes a devicePlugin values map. */}}
{{- define "gpuslice.hostLibVGPU" -}}
{{- if .hostLibVGPU }}{{ .hostLibVGPU }}{{ else if .libvgpu.image }}{{ printf "%s/libvgpu.so" .libvgpu.hostDir }}{{ end -}}
{{- end -}}

{{/* The NVIDIA toolkit's CDI spec patterns the device plugin reads, as a JSON list. Takes a devicePlugin values map. */}}
{{- define "gpuslice.nvidiaCDISpecs" -}}
{{- $out := list }}
{{- range uniq (list .nvidiaCDISpecDir .cdiSpecDir) }}
{{- $out = append (append $out (printf "%s/nvidia*.yaml" .)) (printf "%s/nvidia*.json" .) }}
{{- end }}
{{- toJson $out -}}
{{- end -}}

{{- define "gpuslice.draPluginName" -}}{{ include "gpuslice.fullname" . }}-dra-plugin{{- end -}}

{{/* The DRA driver's name: its ResourceSlices' driver and its DeviceClass (dra.DefaultDriverName). */}}
{{- define "gpuslice.draDriverName" -}}gpuslice.hami.io{{- end -}}

{{/* Policy variables otherConditions and statusKept of a Node status update: statusKept is true when
the update changes no status field and no condition but GPUSliceRegistered (vgpu.ConditionRegistered).
Include with nindent at the variables' indentation. */}}
{{- define "gpuslice.nodeStatusKept" -}}
- name: otherConditions
  expression: >-
    (has(object.status.conditions) ? object.status.conditions.filter(c, c.type != 'GPUSliceRegistered') : []) ==
    (has(oldObject.status.conditions) ? oldObject.status.conditions.filter(c, c.type != 'GPUSliceRegistered') : [])
- name: statusKept
  expression: >-
    variables.otherConditions &&
    object.status.?capacity == oldObject.status.?capacity &&
    object.status.?allocatable == oldObject.status.?allocatable &&
    object.status.?phase == oldObject.status.?phase &&
    object.status.?addresses == oldObject.status.?addresses &&
    object.status.?daemonEndpoints == oldObject.status.?daemonEndpoints &&
    object.status.?nodeInfo == oldObject.status.?nodeInfo &&
    object.status.?images == oldObject.status.?images &&
    object.status.?volumesInUse == oldObject.status.?volumesInUse &&
    object.status.?volumesAttached == oldObject.status.?volumesAttached &&
    object.status.?config == oldObject.status.?config &&
    object.status.?runtimeHandlers == oldObject.status.?runtimeHandlers &&
    object.status.?features == oldObject.status.?features &&
    object.status.?declaredFeatures == oldObject.status.?declaredFeatures
{{- end -}}
