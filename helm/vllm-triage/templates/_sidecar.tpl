{{/*
The vllm-triage sidecar container, for this chart and for charts that add it to their own vLLM pods.
Call it with a dict:
  values    this chart's values (image, triage, profiler): `.Values` here, `index .Values "vllm-triage"` in a
            parent chart (Helm merges this chart's defaults in)
  vllmUrl   the vLLM to watch, e.g. http://127.0.0.1:8000
  native    true to render it for initContainers (a native sidecar, Kubernetes >= 1.29)
  standalone true when the pod has no vLLM (the sidecar watches a remote one): only then has it a
            readinessProbe. Beside vLLM it has a livenessProbe only, so that nothing it does (failing,
            starting slowly, being OOM-killed) delays vLLM's start or takes vLLM's pod out of its Service.
  maxNumSeqs vLLM's --max-num-seqs where its arguments give it (the sidecar also reads it from vLLM's command line)
  startupSeconds how long vLLM may load before its first answer (the pod's startup probe budget): no page before it
  gpusFile  a file in a shared emptyDir where vLLM's container lists its GPUs (this chart: see deployment.yaml)
  appVersion the image tag when values.image.tag is empty (this chart passes its appVersion)
The pod also needs the volume from "vllm-triage.sidecarVolumes", and, beside vLLM with triage.processView or the
profiler on, shareProcessNamespace: true ("vllm-triage.sharesProcesses" says whether).
*/}}
{{- define "vllm-triage.sidecar" -}}
{{- $v := .values }}
{{- $image := $v.image }}
{{- $triage := $v.triage }}
{{- $gpu := $triage.gpu }}
{{- /* auto: the GPU view beside vLLM, none standalone (a remote vLLM's GPUs are on another node) */}}
{{- $gpuOn := eq (toString $gpu.enabled) "true" }}
{{- if eq (toString $gpu.enabled) "auto" }}{{ $gpuOn = not .standalone }}{{ end }}
{{- $profiler := $v.profiler }}
{{- $port := $triage.port }}
{{- $processes := and (not .standalone) (or $triage.processView $profiler.enabled) }}
{{- $sources := list "vllm" }}
{{- if $processes }}{{ $sources = append $sources "process" }}{{ end }}
{{- if $gpuOn }}{{ $sources = append $sources "gpu" }}{{ end }}
{{- if and $processes $profiler.enabled }}{{ $sources = append $sources "gil" }}{{ end }}
- name: vllm-triage
  image: {{ include "vllm-triage.imageRef" (dict "image" $image "appVersion" .appVersion) | quote }}
  imagePullPolicy: {{ $image.pullPolicy }}
  {{- if .native }}
  restartPolicy: Always
  {{- end }}
  args:
    - serve
    - --vllm-url={{ required "the vLLM URL to watch is required" .vllmUrl }}
    - --listen=0.0.0.0:{{ $port }}
    - --sources={{ join "," $sources }}
    - --log-level={{ $triage.logLevel }}
    - --log-format={{ $triage.logFormat }}
    {{- with .maxNumSeqs }}
    - --max-num-seqs={{ . }}
    {{- end }}
    {{- with .startupSeconds }}
    - --vllm-startup-seconds={{ . }}
    {{- end }}
    {{- with $gpu.devices }}
    - --gpus={{ join "," . }}
    {{- end }}
    {{- with .gpusFile }}
    - --gpus-file={{ . }}
    {{- end }}
    {{- if $profiler.enabled }}
    - --gil-interval-seconds={{ $profiler.intervalSeconds }}
    - --gil-window-seconds={{ $profiler.windowSeconds }}
    - --gil-rate={{ $profiler.rate }}
    {{- end }}
    {{- if $triage.bundles.enabled }}
    - --bundle-dir=/var/lib/vllm-triage/bundles
    - --envelope-file=/var/lib/vllm-triage/bundles/envelope.json
    {{- end }}
    {{- if $triage.config }}
    - --config=/etc/vllm-triage/config.yaml
    {{- end }}
    {{- if $triage.webConfig.secretName }}
    - --web-config-file=/etc/vllm-triage-web/web.yml
    {{- end }}
  ports:
    - name: triage
      containerPort: {{ $port }}
      protocol: TCP
  env:
    # Who this pod is: with gpu_source: dcgm the sidecar reads the GPUs dcgm-exporter attributes to it.
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    - name: POD_NAMESPACE
      valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
    {{- if $gpuOn }}
    # NVML from the NVIDIA runtime without requesting a GPU: see values.yaml, triage.gpu.
    - name: NVIDIA_VISIBLE_DEVICES
      value: all
    - name: NVIDIA_DRIVER_CAPABILITIES
      value: utility
    {{- end }}
    {{- with $triage.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  livenessProbe:
    httpGet: {path: /healthz, port: triage{{ if $triage.webConfig.tls }}, scheme: HTTPS{{ end }}}
    initialDelaySeconds: 10
    periodSeconds: 15
    timeoutSeconds: 3
  {{- if .standalone }}
  readinessProbe:
    httpGet: {path: /readyz, port: triage{{ if $triage.webConfig.tls }}, scheme: HTTPS{{ end }}}
    periodSeconds: 10
    timeoutSeconds: 3
  {{- end }}
  resources:
    {{- toYaml $triage.resources | nindent 4 }}
  {{- $security := deepCopy ($triage.securityContext | default dict) }}
  {{- if and $processes $profiler.enabled }}
  {{- /* py-spy gets CAP_SYS_PTRACE from its file capability, which no_new_privs would ignore. */}}
  {{- $capabilities := deepCopy ($security.capabilities | default dict) }}
  {{- $_ := set $capabilities "add" (append ($capabilities.add | default list) "SYS_PTRACE" | uniq) }}
  {{- $_ := set $security "capabilities" $capabilities }}
  {{- $_ := set $security "allowPrivilegeEscalation" true }}
  {{- else if not (hasKey $security "allowPrivilegeEscalation") }}
  {{- $_ := set $security "allowPrivilegeEscalation" false }}
  {{- end }}
  securityContext:
    {{- toYaml $security | nindent 4 }}
  volumeMounts:
    - name: vllm-triage-tmp
      mountPath: /tmp
    {{- if $triage.bundles.enabled }}
    - name: vllm-triage-bundles
      mountPath: /var/lib/vllm-triage/bundles
    {{- end }}
    {{- if $triage.config }}
    - name: vllm-triage-config
      mountPath: /etc/vllm-triage
      readOnly: true
    {{- end }}
    {{- with .gpusFile }}
    - name: vllm-triage-run
      mountPath: {{ dir . }}
      readOnly: true
    {{- end }}
    {{- if $triage.webConfig.secretName }}
    - name: vllm-triage-web
      mountPath: /etc/vllm-triage-web
      readOnly: true
    {{- end }}
{{- end }}

{{/* "true" where the pod must share its process namespace for the sidecar (called with this chart's values): beside
vLLM, with the process view (on by default) or the profiler. Reading vLLM's processes in /proc needs no capability. */}}
{{- define "vllm-triage.sharesProcesses" -}}
{{- or .triage.processView .profiler.enabled -}}
{{- end }}

{{/* The sidecar's volumes: a writable /tmp (py-spy's output), with gpusFile the shared directory vLLM's container
lists its GPUs in, and, with triage.config, its config file from the ConfigMap named `configMap` (render it with
"vllm-triage.configMap"). */}}
{{- define "vllm-triage.sidecarVolumes" -}}
{{- if and .values.triage.config (not .configMap) }}
{{- fail "vllm-triage: triage.config is set, so the sidecar mounts its config file: pass \"configMap\" (a name) to vllm-triage.sidecarVolumes and render that ConfigMap with vllm-triage.configMap (chart README: Adding the sidecar to your own vLLM chart)" }}
{{- end }}
- name: vllm-triage-tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if .values.triage.bundles.enabled }}
- name: vllm-triage-bundles
  {{- /* 10 bundles of at most 5 MiB, the one being written, and the envelope file (under 16 MiB): 96Mi leaves room */}}
  {{- toYaml (.values.triage.bundles.volume | default (dict "emptyDir" (dict "sizeLimit" "96Mi"))) | nindent 2 }}
{{- end }}
{{- if .gpusFile }}
- name: vllm-triage-run
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- end }}
{{- if and .configMap .values.triage.config }}
- name: vllm-triage-config
  configMap:
    name: {{ .configMap }}
{{- end }}
{{- with .values.triage.webConfig.secretName }}
- name: vllm-triage-web
  secret:
    secretName: {{ . }}
{{- end }}
{{- end }}

{{/* The sidecar's config file (triage.config) as a ConfigMap named `name`: this chart's own, or a parent chart's. */}}
{{- define "vllm-triage.configMap" -}}
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .name }}
  {{- with .labels }}
  labels:
    {{- toYaml . | nindent 4 }}
  {{- end }}
data:
  config.yaml: |
    {{- toYaml .values.triage.config | nindent 4 }}
{{- end }}

{{/* For vLLM's container, `command` first: list this container's GPUs (their UUIDs) in `gpusFile` for the sidecar,
then run `command` (vLLM's, as the image would). Without it the sidecar cannot tell this pod's GPUs from its
neighbours' on a shared node. Mount "vllm-triage.gpusFileMount" in vLLM's container too. */}}
{{- define "vllm-triage.gpusFileCommand" -}}
- /bin/sh
- -c
- nvidia-smi --query-gpu=uuid --format=csv,noheader > {{ .gpusFile }} 2>/dev/null || true; exec "$0" "$@"
{{- toYaml .command | nindent 0 }}
{{- end }}

{{- define "vllm-triage.gpusFileMount" -}}
- name: vllm-triage-run
  mountPath: {{ dir .gpusFile }}
{{- end }}
