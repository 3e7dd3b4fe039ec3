{{/* Chart name, overridable. */}}
{{- define "ttdm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name prefix of every object: the release name when it already contains the
chart name (e.g. release "tt-k8s-driver-manager"), else "<release>-<chart>".
Truncated so that the longest suffix ("-controller") still fits 63 characters.
*/}}
{{- define "ttdm.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "ttdm.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels shared by every object. */}}
{{- define "ttdm.labels" -}}
helm.sh/chart: {{ include "ttdm.chart" . }}
app.kubernetes.io/name: {{ include "ttdm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tt-k8s-driver-manager
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of the controller pods (and of its metrics Service). */}}
{{- define "ttdm.controller.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ttdm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "ttdm.controller.name" -}}
{{- printf "%s-controller" (include "ttdm.fullname" .) }}
{{- end }}

{{- define "ttdm.controller.serviceAccountName" -}}
{{- if .Values.controller.serviceAccount.create }}
{{- default (include "ttdm.controller.name" .) .Values.controller.serviceAccount.name }}
{{- else }}
{{- required "controller.serviceAccount.name is required when controller.serviceAccount.create is false" .Values.controller.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "ttdm.agent.name" -}}
{{- printf "%s-agent" (include "ttdm.fullname" .) }}
{{- end }}

{{- define "ttdm.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create }}
{{- default (include "ttdm.agent.name" .) .Values.agent.serviceAccount.name }}
{{- else }}
{{- required "agent.serviceAccount.name is required when agent.serviceAccount.create is false" .Values.agent.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag (or @digest), tag defaulting to the chart's appVersion. */}}
{{- define "ttdm.image" -}}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository (default .appVersion .image.tag) }}
{{- end }}
{{- end }}

{{- define "ttdm.controller.image" -}}
{{- include "ttdm.image" (dict "image" .Values.controller.image "appVersion" .Chart.AppVersion) }}
{{- end }}

{{- define "ttdm.installer.image" -}}
{{- include "ttdm.image" (dict "image" .Values.driver.image "appVersion" .Chart.AppVersion) }}
{{- end }}
