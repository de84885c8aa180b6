{{/* Name of the chart, or nameOverride. */}}
{{- define "limiter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of the release's objects: fullnameOverride, else <release>-<name>,
else the release name when it already contains the name. 63 characters at most
(a DNS label).
*/}}
{{- define "limiter.fullname" -}}
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

{{/* The metrics Service's name: the full name, shortened to leave room for "-metrics". */}}
{{- define "limiter.metricsName" -}}
{{- printf "%s-metrics" (include "limiter.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{/* Labels every object carries. */}}
{{- define "limiter.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "limiter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: limiter
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels that select the release's pods. Never change them: a Deployment's selector is immutable. */}}
{{- define "limiter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "limiter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The ServiceAccount the pods run as. */}}
{{- define "limiter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "limiter.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag, or repository@digest when a digest is set. */}}
{{- define "limiter.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* Whether the limiter reads LimitTier objects (and so needs RBAC and a token). */}}
{{- define "limiter.kubernetesTiers" -}}
{{- if eq .Values.tiers.source "kubernetes" }}true{{ end }}
{{- end }}

{{/*
terminationGracePeriodSeconds: the preStop delay, then the drain
(http.shutdownGrace), then a margin, so SIGKILL never cuts a drain short.
*/}}
{{- define "limiter.terminationGracePeriodSeconds" -}}
{{- $s := .Values.server }}
{{- add (int $s.preStopSleepSeconds) (int $s.shutdownGraceSeconds) (int $s.terminationGraceExtraSeconds) }}
{{- end }}

{{/* Where the pod mounts its files. */}}
{{- define "limiter.configDir" -}}/etc/limiter/config{{- end }}
{{- define "limiter.redisPasswordDir" -}}/etc/limiter/redis{{- end }}
{{- define "limiter.redisTLSDir" -}}/etc/limiter/redis-tls{{- end }}
{{- define "limiter.adminDir" -}}/etc/limiter/admin{{- end }}

{{/*
Refuse values that render but cannot work. values.schema.json checks each
value alone; these rules relate several.
*/}}
{{- define "limiter.validate" -}}
{{- if and (empty .Values.redis.addrs) (gt (int .Values.replicaCount) 1) }}
{{- fail (printf "redis.addrs is empty, which selects the embedded in-process store: it holds one replica's slots only, so with replicaCount %d every replica would enforce its own limit. Set redis.addrs, or replicaCount: 1 for a trial." (int .Values.replicaCount)) }}
{{- end }}
{{- if and (empty .Values.redis.addrs) (or .Values.redis.password.existingSecret .Values.redis.username .Values.redis.tls.enabled .Values.redis.sentinelMasterSet) }}
{{- fail "redis.username, redis.password, redis.tls and redis.sentinelMasterSet need redis.addrs (the embedded store takes no authentication, TLS or Sentinel)" }}
{{- end }}
{{- if and .Values.redis.tls.existingSecret (not .Values.redis.tls.enabled) }}
{{- fail "redis.tls.existingSecret is set but redis.tls.enabled is false: set redis.tls.enabled: true (refused rather than silently connecting in plain text)" }}
{{- end }}
{{- if and .Values.redis.tls.existingSecret (ne (empty .Values.redis.tls.certKey) (empty .Values.redis.tls.keyKey)) }}
{{- fail "redis.tls.certKey and redis.tls.keyKey must be set together (mutual TLS needs both), or both empty" }}
{{- end }}
{{- if and .Values.redis.tls.existingSecret (empty .Values.redis.tls.caKey) (empty .Values.redis.tls.certKey) }}
{{- fail "redis.tls.existingSecret is set but redis.tls.caKey and redis.tls.certKey are both empty: name the key(s) to mount, or unset the Secret" }}
{{- end }}
{{- $plans := dict }}
{{- $names := dict }}
{{- range $i, $t := .Values.tiers.items }}
{{- if hasKey $names $t.name }}
{{- fail (printf "tiers.items[%d]: name %q is already used by tiers.items[%v]" $i $t.name (get $names $t.name)) }}
{{- end }}
{{- $_ := set $names $t.name $i }}
{{- $plan := $t.plan | default $t.name }}
{{- if hasKey $plans $plan }}
{{- fail (printf "tiers.items[%d]: plan %q is already defined by tiers.items[%v]" $i $plan (get $plans $plan)) }}
{{- end }}
{{- $_ := set $plans $plan $i }}
{{- end }}
{{- if and (eq .Values.tiers.source "static") (empty .Values.tiers.items) }}
{{- fail "tiers.items must hold at least one tier with tiers.source static" }}
{{- end }}
{{- end }}
