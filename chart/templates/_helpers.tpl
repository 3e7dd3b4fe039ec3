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

{{/* An image value as a dict {repository, tag, digest, pullPolicy}: our
table form, or (Go-era files, the tt-operator umbrella chart) one string
"repo[:tag][@digest]". A ":" after the last "/" starts the tag, so a registry
port (host:5000/repo) stays in the repository. */}}
{{- define "ttdm.imageDict" -}}
{{- $v := .image }}
{{- $out := dict "repository" "" "tag" "" "digest" "" "pullPolicy" "" }}
{{- if kindIs "string" $v }}
{{- $ref := $v }}
{{- if contains "@" $ref }}
{{- $parts := splitn "@" 2 $ref }}
{{- $ref = $parts._0 }}
{{- $_ := set $out "digest" $parts._1 }}
{{- end }}
{{- $slash := splitList "/" $ref }}
{{- $last := last $slash }}
{{- if contains ":" $last }}
{{- $nt := splitn ":" 2 $last }}
{{- $_ := set $out "tag" $nt._1 }}
{{- $ref = join "/" (append (initial $slash) $nt._0) }}
{{- end }}
{{- $_ := set $out "repository" $ref }}
{{- else if $v }}
{{- range $k, $x := $v }}
{{- $_ := set $out $k $x }}
{{- end }}
{{- end }}
{{- if not $out.pullPolicy }}
{{- $_ := set $out "pullPolicy" (.pullPolicy | default "IfNotPresent") }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/* The Go operator's controller images: replaced by ours (they do not run
this chart's flags). */}}
{{- define "ttdm.goControllerRepos" -}}
{{- list "ghcr.io/tenstorrent/tt-k8s-driver-manager" "ghcr.io/tenstorrent/tt-k8s-driver-manager-controller" | toJson }}
{{- end }}

{{/* The controller image as a dict, with "replaced" set to the Go image it
stands in for ("" when none): a Go controller repository, or a bare Go
release tag (v<semver>; ours are <semver>) on our repository, becomes our
image at the chart's appVersion. controller.imagePullPolicy is the Go
chart's first form of the pull policy. */}}
{{- define "ttdm.controller.imageDict" -}}
{{- $img := include "ttdm.imageDict" (dict "image" .Values.controller.image "pullPolicy" .Values.controller.imagePullPolicy) | fromYaml }}
{{- $ours := "ghcr.io/tenstorrent/tt-k8s-driver-manager-rs/controller" }}
{{- $repo := trimSuffix "/" (toString $img.repository) }}
{{- $replaced := "" }}
{{- if has $repo (include "ttdm.goControllerRepos" . | fromJsonArray) }}
{{- $replaced = (empty $img.tag) | ternary $repo (printf "%s:%s" $repo (toString $img.tag)) }}
{{- else if and (eq $repo $ours) (regexMatch "^v[0-9]+\\." (toString $img.tag)) }}
{{- $replaced = printf "%s:%s" $repo $img.tag }}
{{- end }}
{{- if $replaced }}
{{- $_ := set $img "repository" $ours }}
{{- $_ := set $img "tag" "" }}
{{- $_ := set $img "digest" "" }}
{{- end }}
{{- $_ := set $img "replaced" $replaced }}
{{- toYaml $img }}
{{- end }}

{{- define "ttdm.controller.image" -}}
{{- include "ttdm.image" (dict "image" (include "ttdm.controller.imageDict" . | fromYaml) "appVersion" .Chart.AppVersion) }}
{{- end }}

{{/* An image as a dict, a Go project image replaced: when its repository is
`go` (the Go chart's image for that component, which does not speak to this
chart's programs), it becomes `ours` at the chart's appVersion, "replaced"
naming the Go image ("" when nothing was replaced). Arguments: image, go, ours. */}}
{{- define "ttdm.replacedImageDict" -}}
{{- $img := include "ttdm.imageDict" (dict "image" .image) | fromYaml }}
{{- $repo := trimSuffix "/" (toString $img.repository) }}
{{- $replaced := "" }}
{{- if eq $repo .go }}
{{- $replaced = (empty $img.tag) | ternary $repo (printf "%s:%s" $repo (toString $img.tag)) }}
{{- $_ := set $img "repository" .ours }}
{{- $_ := set $img "tag" "" }}
{{- $_ := set $img "digest" "" }}
{{- end }}
{{- $_ := set $img "replaced" $replaced }}
{{- toYaml $img }}
{{- end }}

{{/* The installer (agent) image as a dict. A Go-era values file names the Go
builder image (ghcr.io/tenstorrent/tt-k8s-driver-manager-builder): replaced by
this chart's agent image. */}}
{{- define "ttdm.installer.imageDict" -}}
{{- include "ttdm.replacedImageDict" (dict "image" .Values.driver.image "go" "ghcr.io/tenstorrent/tt-k8s-driver-manager-builder" "ours" "ghcr.io/tenstorrent/tt-k8s-driver-manager-rs/agent") }}
{{- end }}

{{- define "ttdm.installer.image" -}}
{{- include "ttdm.image" (dict "image" (include "ttdm.installer.imageDict" . | fromYaml) "appVersion" .Chart.AppVersion) }}
{{- end }}

{{/* controller.requireTenstorrentLabel: a bool, or the Go chart's strings
"true"/"false"; "true" or "false" out. */}}
{{- define "ttdm.requireTenstorrentLabel" -}}
{{- $v := .Values.controller.requireTenstorrentLabel }}
{{- if kindIs "invalid" $v }}true{{ else }}{{ (ne (lower (toString $v)) "false") | ternary "true" "false" }}{{ end }}
{{- end }}

{{/* metrics.service.enabled (the Go chart's key): default true. */}}
{{- define "ttdm.metricsService.enabled" -}}
{{- $svc := .Values.metrics.service | default dict }}
{{- if hasKey $svc "enabled" }}{{ $svc.enabled | ternary "true" "false" }}{{ else }}true{{ end }}
{{- end }}

{{/* Name of the metrics Service: the Go chart's <fullname>-metrics. */}}
{{- define "ttdm.metricsService.name" -}}
{{- printf "%s-metrics" (include "ttdm.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- /*
Go-era values (tt-k8s-driver-manager's chart), mapped onto ours; see
docs/migrating-from-go-operator.md.
*/ -}}

{{/* controller.leaderElection as a table: the Go chart's bool form
(`controller.leaderElection: false`) becomes {enabled: <bool>} with our
defaults for the rest. */}}
{{- define "ttdm.leaderElection" -}}
{{- $le := .Values.controller.leaderElection }}
{{- $defaults := dict "enabled" true "leaseName" "tt-k8s-driver-manager" "leaseDurationSeconds" 15 }}
{{- if kindIs "bool" $le }}
{{- $_ := set $defaults "enabled" $le }}
{{- else }}
{{- /* set, not merge: merge would take a false for empty */}}
{{- range $k, $v := ($le | default dict) }}
{{- $_ := set $defaults $k $v }}
{{- end }}
{{- end }}
{{- toYaml $defaults }}
{{- end }}

{{/* Replicas: the Go chart ran one controller; its bool
`leaderElection: false` means one replica here too. */}}
{{- define "ttdm.replicas" -}}
{{- if and (kindIs "bool" .Values.controller.leaderElection) (not .Values.controller.leaderElection) }}1{{ else }}{{ int .Values.controller.replicas }}{{ end }}
{{- end }}

{{/* Admin (metrics) container port: the Go chart's metrics.port when set. */}}
{{- define "ttdm.adminPort" -}}
{{- int (.Values.metrics.port | default .Values.controller.adminPort) }}
{{- end }}

{{/* Metrics Service port: the Go chart's metrics.port when set. */}}
{{- define "ttdm.servicePort" -}}
{{- int (.Values.metrics.port | default .Values.controller.service.port) }}
{{- end }}

{{/* Top-level imagePullSecrets (the Go chart's), as a list of {name: ...};
plain strings are accepted too. Attached to both ServiceAccounts. */}}
{{- define "ttdm.imagePullSecrets" -}}
{{- $out := list }}
{{- range .Values.imagePullSecrets }}
{{- if kindIs "string" . }}
{{- $out = append $out (dict "name" .) }}
{{- else }}
{{- $out = append $out . }}
{{- end }}
{{- end }}
{{- if $out }}
imagePullSecrets:
{{- toYaml $out | nindent 2 }}
{{- end }}
{{- end }}

{{/* controller.extraEnv: a list of EnvVar, or (Go-era files) a map of
name: value. */}}
{{- define "ttdm.extraEnv" -}}
{{- $e := .Values.controller.extraEnv }}
{{- if kindIs "map" $e }}
{{- range $k, $v := $e }}
- name: {{ $k }}
  value: {{ $v | toString | quote }}
{{- end }}
{{- else if $e }}
{{- toYaml $e }}
{{- end }}
{{- end }}

{{/* Fails the install with a message naming the API and the value to turn off
when the cluster does not serve a kind the chart would create: better than the
API server's "no matches for kind" after part of the release is applied.
Only against a cluster: helm's offline capabilities (helm template, lint)
list group/versions without kinds ("v1/Pod" is there only from discovery), so
an offline render is not refused; `kubeVersion` in Chart.yaml covers it.
Arguments: dict "ctx" $ "api" "<group/version/Kind>" "what" "<purpose>" "off" "<value to set>". */}}
{{- define "ttdm.requireApi" -}}
{{- if and (.ctx.Capabilities.APIVersions.Has "v1/Pod") (not (.ctx.Capabilities.APIVersions.Has .api)) }}
{{- fail (printf "this cluster (Kubernetes %s) does not serve %s, which %s needs: %s" .ctx.Capabilities.KubeVersion.Version .api .what .off) }}
{{- end }}
{{- end }}

{{/* The kubectl image of the CRD upgrade Job and of `helm test`. */}}
{{- define "ttdm.kubectl.image" -}}
{{- include "ttdm.image" (dict "image" .Values.kubectl.image "appVersion" "latest") }}
{{- end }}

{{/*
driver.sourceCommits ({"2.8.0": "<commit>"}) as the controller's
VERSION=COMMIT,... list, sorted by version key.
*/}}
{{- define "ttdm.sourceCommits" -}}
{{- $out := list }}
{{- range $v, $c := . }}
{{- $out = append $out (printf "%s=%s" $v $c) }}
{{- end }}
{{- join "," $out }}
{{- end }}

{{/* The VFIO binder's objects: <fullname>-vfio, as the Go chart names them. */}}
{{- define "ttdm.vfio.name" -}}
{{- printf "%s-vfio" (include "ttdm.fullname" .) }}
{{- end }}

{{/* Selector of the VFIO binder's pods: the Go chart's, since a DaemonSet's
selector is immutable and `helm upgrade` from the Go chart keeps the object. */}}
{{- define "ttdm.vfio.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ttdm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: vfio-manage
{{- end }}

{{/* The binder image; the Go chart's vfio-manage image (which does not take
this chart's flags) is replaced by ours. */}}
{{- define "ttdm.vfio.imageDict" -}}
{{- include "ttdm.replacedImageDict" (dict "image" .Values.vfioManager.image "go" "ghcr.io/tenstorrent/tt-k8s-driver-manager-vfio" "ours" "ghcr.io/tenstorrent/tt-k8s-driver-manager-rs/vfio") }}
{{- end }}

{{- define "ttdm.vfio.image" -}}
{{- include "ttdm.image" (dict "image" (include "ttdm.vfio.imageDict" . | fromYaml) "appVersion" .Chart.AppVersion) }}
{{- end }}

{{/* The flasher image of the flash Jobs; the Go chart's flasher and tools
images (a shell entrypoint this controller does not drive) are replaced by ours. */}}
{{- define "ttdm.flasher.imageDict" -}}
{{- include "ttdm.replacedImageDict" (dict "image" .Values.flasher.image "go" "ghcr.io/tenstorrent/tt-k8s-driver-manager-flasher" "ours" "ghcr.io/tenstorrent/tt-k8s-driver-manager-rs/flasher") }}
{{- end }}

{{- define "ttdm.flasher.image" -}}
{{- include "ttdm.image" (dict "image" (include "ttdm.flasher.imageDict" . | fromYaml) "appVersion" .Chart.AppVersion) }}
{{- end }}
