{{/* The chart's name, or nameOverride: the app.kubernetes.io/name label. */}}
{{- define "relay.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The name of every object: fullnameOverride, else the release name, plus the
chart's name (or nameOverride) unless the release name contains it.
*/}}
{{- define "relay.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "relay.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "relay.selectorLabels" -}}
app.kubernetes.io/name: {{ include "relay.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "relay.labels" -}}
{{ include "relay.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "relay.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "relay.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "relay.secretName" -}}
{{- default (include "relay.fullname" .) .Values.existingSecret -}}
{{- end -}}

{{/*
The relay's config file: .Values.config with http.listen on every
interface at service.port (probes and scrapes come from outside the pod)
and shutdown_timeout from shutdownTimeoutSeconds, so that
terminationGracePeriodSeconds stays above it.
*/}}
{{- define "relay.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $http := dict -}}
{{- if hasKey $cfg "http" -}}{{- $http = get $cfg "http" -}}{{- end -}}
{{- $_ := set $http "listen" (printf "0.0.0.0:%d" (int .Values.service.port)) -}}
{{- $_ := set $cfg "http" $http -}}
{{- $_ := set $cfg "shutdown_timeout" (printf "%ds" (int .Values.shutdownTimeoutSeconds)) -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/*
The image: global.imageRegistry (when set) before image.repository, and
image.tag, else the chart's appVersion, the version the release builds.
*/}}
{{- define "relay.image" -}}
{{- $registry := "" -}}
{{- with .Values.global }}{{ $registry = .imageRegistry | default "" }}{{ end -}}
{{- $repo := .Values.image.repository -}}
{{- if $registry }}{{ $repo = printf "%s/%s" (trimSuffix "/" $registry) $repo }}{{ end -}}
"{{ $repo }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
{{- end -}}

{{/* The pull secrets: global.imagePullSecrets, then imagePullSecrets. */}}
{{- define "relay.imagePullSecrets" -}}
{{- $secrets := list -}}
{{- with .Values.global }}{{ $secrets = .imagePullSecrets | default list }}{{ end -}}
{{- $secrets = concat $secrets (.Values.imagePullSecrets | default list) -}}
{{- with $secrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end -}}

{{/*
The pod's scheduling settings, shared by the relay and its init Job: the
node selector and tolerations.
*/}}
{{- define "relay.nodePlacement" -}}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end -}}
{{- end -}}

{{/*
The relay's affinity: .Values.affinity when set, else a pod anti-affinity
per podAntiAffinity ("soft": prefer one replica per node; "hard": require
it; "": none).
*/}}
{{- define "relay.affinity" -}}
{{- if .Values.affinity -}}
{{- toYaml .Values.affinity -}}
{{- else if eq .Values.podAntiAffinity "soft" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "relay.selectorLabels" . | nindent 12 }}
{{- else if eq .Values.podAntiAffinity "hard" -}}
podAntiAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- include "relay.selectorLabels" . | nindent 10 }}
{{- end -}}
{{- end -}}

{{/*
topologySpreadConstraints, each without a labelSelector given the relay's
selector labels.
*/}}
{{- define "relay.topologySpreadConstraints" -}}
{{- $out := list -}}
{{- range .Values.topologySpreadConstraints -}}
{{- $c := deepCopy . -}}
{{- if not (hasKey $c "labelSelector") -}}
{{- $_ := set $c "labelSelector" (dict "matchLabels" (include "relay.selectorLabels" $ | fromYaml)) -}}
{{- end -}}
{{- $out = append $out $c -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/*
The init Job's config file: the relay's, with init.postgres merged over
postgres (the owner role's URL).
*/}}
{{- define "relay.initConfig" -}}
{{- $cfg := include "relay.config" . | fromYaml -}}
{{- $_ := set $cfg "postgres" (mergeOverwrite (get $cfg "postgres") (deepCopy .Values.init.postgres)) -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/*
The variables of the init Job's Secret: secretEnv (unless existingSecret
holds the relay's) with init.secretEnv over it.
*/}}
{{- define "relay.initSecretEnv" -}}
{{- $env := dict -}}
{{- if not .Values.existingSecret -}}{{- $env = deepCopy (.Values.secretEnv | default dict) -}}{{- end -}}
{{- toYaml (mergeOverwrite $env (deepCopy (.Values.init.secretEnv | default dict))) -}}
{{- end -}}

{{/*
The envFrom of a container (dict: root, the chart's context; secrets and
after, names of Secrets, empty ones skipped): secrets, then extraEnvFrom,
then after. Later sources win.
*/}}
{{- define "relay.envFrom" -}}
{{- $from := list -}}
{{- range .secrets }}{{ if . }}{{ $from = append $from (dict "secretRef" (dict "name" .)) }}{{ end }}{{ end -}}
{{- $from = concat $from (.root.Values.extraEnvFrom | default list) -}}
{{- range .after }}{{ if . }}{{ $from = append $from (dict "secretRef" (dict "name" .)) }}{{ end }}{{ end -}}
{{- with $from }}
envFrom:
  {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end -}}

{{/* The env of a container: env, then extraEnv. */}}
{{- define "relay.env" -}}
{{- with concat (.Values.env | default list) (.Values.extraEnv | default list) }}
env:
  {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end -}}
