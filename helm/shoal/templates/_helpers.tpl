{{/* Names, labels and the pieces the workloads share. */}}

{{- define "shoal.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-qualified name; the release name alone when it already contains the chart's. */}}
{{- define "shoal.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "shoal.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "shoal.labels" -}}
helm.sh/chart: {{ include "shoal.chart" . }}
app.kubernetes.io/name: {{ include "shoal.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: include "shoal.selectorLabels" (dict "ctx" . "component" "node") */}}
{{- define "shoal.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shoal.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "shoal.nodeName" -}}{{ include "shoal.fullname" . }}-node{{- end -}}
{{- define "shoal.headlessName" -}}{{ include "shoal.fullname" . }}-node-headless{{- end -}}
{{- define "shoal.routerName" -}}{{ include "shoal.fullname" . }}-router{{- end -}}

{{- define "shoal.secretName" -}}
{{- default (include "shoal.fullname" .) .Values.auth.existingSecret -}}
{{- end -}}

{{- define "shoal.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "shoal.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "shoal.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/*
The routers' node list: node-<i>=tcp://<fullname>-node-<i>.<headless>.<ns>.svc.<domain>:<port>
for every i below nodes.replicaCount, one --node flag each. Node ids are the pods' ordinals
(the image's entry point maps pod <fullname>-node-3 to node id node-3).
*/}}
{{- define "shoal.routerNodeArgs" -}}
{{- $node := include "shoal.nodeName" . -}}
{{- $svc := include "shoal.headlessName" . -}}
{{- range $i := until (int .Values.nodes.replicaCount) }}
- --node
- {{ printf "node-%d=tcp://%s-%d.%s.%s.svc.%s:%d" $i $node $i $svc $.Release.Namespace $.Values.clusterDomain (int $.Values.nodes.containerPorts.zmq) }}
{{- end }}
{{- end -}}

{{/* Every node of the StatefulSet as a peer (quorum queues' Raft links, design.md section 8);
     a node skips its own id. */}}
{{- define "shoal.nodePeerArgs" -}}
{{- $node := include "shoal.nodeName" . -}}
{{- $svc := include "shoal.headlessName" . -}}
{{- range $i := until (int .Values.nodes.replicaCount) }}
- --peer
- {{ printf "node-%d=tcp://%s-%d.%s.%s.svc.%s:%d" $i $node $i $svc $.Release.Namespace $.Values.clusterDomain (int $.Values.nodes.containerPorts.zmq) }}
{{- end }}
{{- end -}}

{{/* Pod anti-affinity preset: include "shoal.antiAffinity" (dict "ctx" . "component" "node" "preset" "soft") */}}
{{- define "shoal.antiAffinity" -}}
{{- if eq .preset "hard" }}
podAntiAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels: {{- include "shoal.selectorLabels" (dict "ctx" .ctx "component" .component) | nindent 10 }}
{{- else if eq .preset "soft" }}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels: {{- include "shoal.selectorLabels" (dict "ctx" .ctx "component" .component) | nindent 12 }}
{{- end }}
{{- end -}}

{{/* A probe from values: include "shoal.probe" (dict "probe" .Values.nodes.livenessProbe "port" "zmq"),
     an HTTP GET of "path" on "port" when the dict has a "path" */}}
{{- define "shoal.probe" -}}
{{- if .path }}
httpGet:
  path: {{ .path }}
  port: {{ .port }}
{{- else }}
tcpSocket:
  port: {{ .port }}
{{- end }}
initialDelaySeconds: {{ .probe.initialDelaySeconds }}
periodSeconds: {{ .probe.periodSeconds }}
timeoutSeconds: {{ .probe.timeoutSeconds }}
failureThreshold: {{ .probe.failureThreshold }}
successThreshold: {{ .probe.successThreshold }}
{{- end -}}

{{- define "shoal.podSecurityContext" -}}
{{- if .Values.podSecurityContext.enabled }}
securityContext: {{- omit .Values.podSecurityContext "enabled" | toYaml | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "shoal.containerSecurityContext" -}}
{{- if .Values.containerSecurityContext.enabled }}
securityContext: {{- omit .Values.containerSecurityContext "enabled" | toYaml | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "shoal.metricsEnabled" -}}
{{- if or .Values.metrics.enabled .Values.metrics.serviceMonitor.enabled -}}true{{- end -}}
{{- end -}}
