{{- define "vllm-triage.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "vllm-triage.fullname" -}}
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

{{- define "vllm-triage.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vllm-triage.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "vllm-triage.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "vllm-triage.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "vllm-triage.monitoringLabels" -}}
{{ include "vllm-triage.labels" . }}
{{- with .Values.monitoring.additionalLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "vllm-triage.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "vllm-triage.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag of the sidecar image; (dict "image" <values.image> "appVersion" <tag when image.tag is empty>). */}}
{{- define "vllm-triage.imageRef" -}}
{{- printf "%s:%s" .image.repository (.image.tag | default .appVersion | required "set the vllm-triage image tag (values image.tag)") }}
{{- end }}

{{/* true when the sidecar runs as a native sidecar (initContainers, restartPolicy: Always). */}}
{{- define "vllm-triage.native" -}}
{{- $mode := toString .Values.triage.nativeSidecar }}
{{- if eq $mode "auto" }}
{{- semverCompare ">=1.29-0" .Capabilities.KubeVersion.Version }}
{{- else }}
{{- eq $mode "true" }}
{{- end }}
{{- end }}

{{/* Scrape endpoints of vLLM (job "vllm") and the sidecar (job "vllm-triage"), the jobs the alerts use.
Called with (dict "root" $ "monitor" .Values.monitoring.podMonitor-or-serviceMonitor). */}}
{{- define "vllm-triage.scrapeEndpoints" -}}
{{- $ports := list "triage" }}
{{- $vllmPort := "http" }}
{{- if .root.Values.monitoringOnly.enabled }}
{{- $vllmPort = .root.Values.monitoringOnly.vllmPort }}
{{- if $vllmPort }}{{ $ports = list $vllmPort "triage" }}{{ end }}
{{- else if .root.Values.vllm.enabled }}
{{- $ports = list "http" "triage" }}
{{- end }}
{{- range $ports }}
- port: {{ . }}
  path: /metrics
  interval: {{ $.monitor.interval }}
  scrapeTimeout: {{ $.monitor.scrapeTimeout }}
  relabelings:
    - action: replace
      targetLabel: job
      replacement: {{ ternary $.root.Values.monitoring.jobs.vllm $.root.Values.monitoring.jobs.triage (eq . $vllmPort) }}
    - action: replace
      targetLabel: vllm_triage_release
      replacement: {{ include "vllm-triage.releaseLabel" $.root }}
  {{- if and (eq . "triage") $.root.Values.monitoring.triageEndpoint }}
  {{- toYaml $.root.Values.monitoring.triageEndpoint | nindent 2 }}
  {{- end }}
{{- end }}
{{- end }}

{{/*
The release's own label on what its scrape objects collect (monitoring.prometheusRule.scope: release): namespace/name.
*/}}
{{- define "vllm-triage.releaseLabel" -}}
{{- printf "%s/%s" .Release.Namespace .Release.Name }}
{{- end }}

{{/*
A dashboard's uid for this release: its generated uid and a hash of the release's namespace and name, so
that two releases' dashboards (and the files Grafana's sidecar writes for them) never collide, and
uninstalling one release removes only its own. Call with (dict "root" $ "uid" "vllm-triage-overview").
*/}}
{{- define "vllm-triage.dashboardUid" -}}
{{- printf "%s-%s" .uid (printf "%s/%s" .root.Release.Namespace .root.Release.Name | sha256sum | trunc 8) }}
{{- end }}
