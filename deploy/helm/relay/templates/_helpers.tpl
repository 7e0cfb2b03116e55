{{/* The name of every object: the release name, plus the chart's unless it has it. */}}
{{- define "relay.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "relay.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "relay.labels" -}}
{{ include "relay.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
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
The pod and container security contexts of the relay and its init Job:
non-root, read-only root filesystem, no privilege escalation or
capabilities.
*/}}
{{- define "relay.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "relay.containerSecurityContext" -}}
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
{{- end -}}

{{- define "relay.image" -}}
"{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
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
