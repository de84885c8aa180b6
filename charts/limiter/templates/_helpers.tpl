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

{{/* The admin Service's name: the full name, shortened to leave room for "-admin". */}}
{{- define "limiter.adminName" -}}
{{- printf "%s-admin" (include "limiter.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{/* The ext_proc Service's name: the full name, shortened to leave room for "-extproc". */}}
{{- define "limiter.extprocName" -}}
{{- printf "%s-extproc" (include "limiter.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{/* The Secret of the callers' tokens file: api.existingSecret, else the one the chart generates. */}}
{{- define "limiter.apiTokensSecret" -}}
{{- if .Values.api.existingSecret }}
{{- .Values.api.existingSecret }}
{{- else }}
{{- printf "%s-api-tokens" (include "limiter.fullname" . | trunc 52 | trimSuffix "-") }}
{{- end }}
{{- end }}

{{/* Whether the admin API (and so its port and Service) is on: it needs a tokens file. */}}
{{- define "limiter.adminEnabled" -}}
{{- if .Values.admin.existingSecret }}true{{ end }}
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

{{/* Whether the pods run `limiter proxy`. */}}
{{- define "limiter.proxyMode" -}}
{{- if eq .Values.mode "proxy" }}true{{ end }}
{{- end }}

{{/* The container port named http: the proxy's, or the API's. */}}
{{- define "limiter.httpPort" -}}
{{- if include "limiter.proxyMode" . }}{{ int .Values.proxy.port }}{{ else }}{{ int .Values.server.apiPort }}{{ end }}
{{- end }}

{{/*
Whether the pods read identity.*: `limiter proxy`, and the ext_proc server
of `limiter serve` (extproc.enabled).
*/}}
{{- define "limiter.readsIdentity" -}}
{{- if or (include "limiter.proxyMode" .) .Values.extproc.enabled }}true{{ end }}
{{- end }}

{{/* The mounted JWKS file, when the pods read identity.* and it names one. */}}
{{- define "limiter.jwksFile" -}}
{{- if and (include "limiter.readsIdentity" .) .Values.identity.jwt.jwks.existingConfigMap }}{{ include "limiter.jwksDir" . }}/jwks.json{{ end }}
{{- end }}

{{/* Where the pod mounts its files. */}}
{{- define "limiter.configDir" -}}/etc/limiter/config{{- end }}
{{- define "limiter.redisPasswordDir" -}}/etc/limiter/redis{{- end }}
{{- define "limiter.redisTLSDir" -}}/etc/limiter/redis-tls{{- end }}
{{- define "limiter.adminDir" -}}/etc/limiter/admin{{- end }}
{{- define "limiter.apiDir" -}}/etc/limiter/api{{- end }}
{{- define "limiter.jwksDir" -}}/etc/limiter/jwks{{- end }}
{{- define "limiter.tlsDir" -}}/etc/limiter/tls{{- end }}

{{/*
A duration string (as values.schema.json lets through: number-unit pairs such
as "90s", "1m30s", "1.5h") in nanoseconds, printed as an integer: turn it back
into a number with `include "limiter.durationNs" $s | int64`. Go's units: ns,
us (µs), ms, s, m, h.
*/}}
{{- define "limiter.durationNs" -}}
{{- $units := dict "ns" 1 "us" 1000 "µs" 1000 "μs" 1000 "ms" 1000000 "s" 1000000000 "m" 60000000000 "h" 3600000000000 }}
{{- $ns := 0.0 }}
{{- range regexFindAll `[0-9]+(\.[0-9]+)?(ns|us|µs|μs|ms|s|m|h)` (toString .) -1 }}
{{- $num := regexFind `^[0-9]+(\.[0-9]+)?` . }}
{{- $ns = addf $ns (mulf $num (get $units (trimPrefix $num .))) }}
{{- end }}
{{- $ns | int64 }}
{{- end }}

{{/*
Refuse values that render but cannot work. values.schema.json checks each
value alone (the form of a duration, not its range); these rules check
ranges and relate several values, with the limiter's own bounds (pkg/tiers,
pkg/config) and the LimitTier CRD's, so a bad value fails `helm install`
rather than a pod or the API server later.
*/}}
{{- define "limiter.validate" -}}
{{- if include "limiter.proxyMode" . }}
{{- if empty .Values.proxy.upstream }}
{{- fail "mode proxy needs proxy.upstream: the URL of the server to put the cap in front of, like http://vllm.inference.svc:8000" }}
{{- end }}
{{- if .Values.admin.existingSecret }}
{{- fail "admin.existingSecret is set with mode proxy, which serves no admin API: run a release in mode serve for it, or unset admin.existingSecret" }}
{{- end }}
{{- if .Values.server.tls.clientCA }}
{{- fail "server.tls.clientCA is set with mode proxy, which takes no caller from a client certificate (identity.jwt or the identity headers name the user): unset server.tls.clientCA" }}
{{- end }}
{{- if .Values.extproc.enabled }}
{{- fail "extproc.enabled is set with mode proxy, which serves no ext_proc server (`limiter proxy` never listens on extproc.addr): Envoy would find nothing there and, failing open, let every request through uncapped. Run a release in mode serve for Envoy, or unset extproc.enabled" }}
{{- end }}
{{- if eq (int .Values.proxy.port) (int .Values.server.opsPort) }}
{{- fail (printf "proxy.port %d is server.opsPort's: give them different ports" (int .Values.proxy.port)) }}
{{- end }}
{{- end }}
{{- if include "limiter.readsIdentity" . }}
{{- $jwt := .Values.identity.jwt }}
{{- if or $jwt.jwks.existingConfigMap $jwt.jwksURL }}
{{- if or (empty $jwt.issuer) (empty $jwt.audience) }}
{{- fail "identity.jwt needs identity.jwt.issuer and identity.jwt.audience with a key set (identity.jwt.jwks.existingConfigMap or identity.jwt.jwksURL): tokens of any issuer or audience would pass" }}
{{- end }}
{{- else if or $jwt.issuer $jwt.audience $jwt.planClaim (ne ($jwt.userClaim | default "sub") "sub") }}
{{- fail "identity.jwt.issuer, audience, planClaim and a userClaim other than sub need a key set: identity.jwt.jwks.existingConfigMap or identity.jwt.jwksURL" }}
{{- end }}
{{- end }}
{{- with .Values.identity.pools }}
{{- if not (include "limiter.readsIdentity" $) }}
{{- fail "identity.pools is read by mode proxy and by the ext_proc server (extproc.enabled) only: set one of them, or unset identity.pools" }}
{{- end }}
{{- if not (include "limiter.kubernetesTiers" $) }}
{{- fail (printf "identity.pools (%s) needs tiers.source kubernetes: the chart renders no pools.static, so with tiers.source static the limiter would refuse every pool; make each pool a LimitPool (limitPools)" (keys . | sortAlpha | join ", ")) }}
{{- end }}
{{- end }}
{{- if and (empty .Values.redis.addrs) (gt (int .Values.replicaCount) 1) }}
{{- fail (printf "redis.addrs is empty, which selects the embedded in-process store: it holds one replica's slots only, so with replicaCount %d every replica would enforce its own limit. Set redis.addrs, or replicaCount: 1 for a trial." (int .Values.replicaCount)) }}
{{- end }}
{{- if and (empty .Values.redis.addrs) (or .Values.redis.password.existingSecret .Values.redis.username .Values.redis.tls.enabled .Values.redis.sentinelMasterSet) }}
{{- fail "redis.username, redis.password, redis.tls and redis.sentinelMasterSet need redis.addrs (the embedded store takes no authentication, TLS or Sentinel)" }}
{{- end }}
{{- if and .Values.server.tls.clientCA (not .Values.server.tls.existingSecret) }}
{{- fail "server.tls.clientCA needs server.tls.existingSecret: client certificates need TLS (and the Secret's ca.crt)" }}
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
{{- $timeout := include "limiter.durationNs" .Values.redis.timeout | int64 }}
{{- if or (le $timeout 0) (gt $timeout 10000000000) }}
{{- fail (printf "redis.timeout %q: must be above 0s and at most 10s" (toString .Values.redis.timeout)) }}
{{- end }}
{{- if le (include "limiter.durationNs" .Values.redis.shardsRefreshInterval | int64) 0 }}
{{- fail (printf "redis.shardsRefreshInterval %q: must be above 0s" (toString .Values.redis.shardsRefreshInterval)) }}
{{- end }}
{{- /* name, value, least and most (ns), and the range as the limiter words it. */}}
{{- range $c := list
  (list "extproc.wait" .Values.extproc.wait 0 60000000000 "0s and 60s")
  (list "proxy.wait" .Values.proxy.wait 0 60000000000 "0s and 60s")
  (list "proxy.stallTimeout" .Values.proxy.stallTimeout 1000000000 3600000000000 "1s and 1h")
  (list "telemetry.slotsUsedMaxWindow" .Values.telemetry.slotsUsedMaxWindow 1000000000 3600000000000 "1s and 1h") }}
{{- $v := index $c 1 }}
{{- if not (kindIs "invalid" $v) }}
{{- $ns := include "limiter.durationNs" $v | int64 }}
{{- if or (lt $ns (index $c 2 | int64)) (gt $ns (index $c 3 | int64)) }}
{{- fail (printf "%s %q: must be between %s" (index $c 0) (toString $v) (index $c 4)) }}
{{- end }}
{{- end }}
{{- end }}
{{- if include "limiter.kubernetesTiers" . }}
{{- $lease := include "limiter.durationNs" .Values.tiers.leaseDuration | int64 }}
{{- if or (lt $lease 1000000000) (gt $lease 300000000000) }}
{{- fail (printf "tiers.leaseDuration %q: must be between 1s and 5m" (toString .Values.tiers.leaseDuration)) }}
{{- end }}
{{- end }}
{{- $plans := dict }}
{{- $names := dict }}
{{- range $i, $t := .Values.tiers.items }}
{{- $where := printf "tiers.items[%d] (%s)" $i $t.name }}
{{- range $field := list "slotTTL" "heartbeatInterval" "maxWait" }}
{{- $v := get $t $field | toString }}
{{- if or (contains "µ" $v) (contains "μ" $v) }}
{{- fail (printf "%s: %s %q: write microseconds as \"us\" (a LimitTier's durations take ns, us, ms, s, m or h)" $where $field $v) }}
{{- end }}
{{- end }}
{{- /* The defaults of a tier (pkg/tiers WithDefaults): slotTTL 120s; heartbeatInterval min(20s, slotTTL/3), valid whenever slotTTL is. */}}
{{- $ttl := 120000000000 }}
{{- if hasKey $t "slotTTL" }}
{{- $ttl = include "limiter.durationNs" $t.slotTTL | int64 }}
{{- if or (lt $ttl 100000000) (gt $ttl 86400000000000) }}
{{- fail (printf "%s: slotTTL %q: must be between 100ms and 24h" $where (toString $t.slotTTL)) }}
{{- end }}
{{- end }}
{{- if hasKey $t "heartbeatInterval" }}
{{- $hb := include "limiter.durationNs" $t.heartbeatInterval | int64 }}
{{- if lt $hb 1000000 }}
{{- fail (printf "%s: heartbeatInterval %q: must be at least 1ms (heartbeat_interval_ms is whole milliseconds)" $where (toString $t.heartbeatInterval)) }}
{{- end }}
{{- if gt (mul $hb 3) $ttl }}
{{- fail (printf "%s: heartbeatInterval %q: must be at most a third of slotTTL (%s), so that two lost heartbeats do not lose a slot; leave it unset for min(20s, slotTTL/3)" $where (toString $t.heartbeatInterval) (toString ($t.slotTTL | default "120s, the default"))) }}
{{- end }}
{{- end }}
{{- if and (hasKey $t "maxWait") (gt (include "limiter.durationNs" $t.maxWait | int64) 60000000000) }}
{{- fail (printf "%s: maxWait %q: must be between 0s (no waiting) and 60s" $where (toString $t.maxWait)) }}
{{- end }}
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

{{/*
NOTES.txt: how curl trusts the API or proxy port served over TLS with the
Secret .secret (server.tls.existingSecret) in namespace .ns; nothing without it.
*/}}
{{- define "limiter.notesTLS" }}
{{- with .secret }}

The port serves TLS with the certificate of the Secret {{ . }}
(server.tls.existingSecret). curl trusts it with the Secret's CA, its
ca.crt (cert-manager writes one; with a certificate of a CA the system
trusts, drop --cacert), at localhost only when the certificate names it
(else reach the Service by a name it holds):

  kubectl -n {{ $.ns }} get secret {{ . }} -o jsonpath='{.data.ca\.crt}' | base64 -d > ca.crt
{{- end }}
{{- end }}
