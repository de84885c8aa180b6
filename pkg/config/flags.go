package config

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

// FlagConfig is the flag naming the YAML configuration file; EnvConfig is
// its environment variable.
const (
	FlagConfig = "config"
	EnvConfig  = EnvPrefix + "CONFIG"
)

// flagSpec is a command-line flag for one key. Its type and default come
// from the key's field and from Default.
type flagSpec struct {
	name  string
	key   string
	usage string
	// unset says what the zero default means; pflag prints no default
	// for zero values, and every flag's help must state its default.
	unset string
	// only, when set, is the one command that has the flag; otherwise
	// every command does.
	only string
}

// Commands whose flags differ.
const (
	CommandServe = "serve"
	CommandProxy = "proxy"
)

// flagSpecs are the keys settable by flag: the ones an operator changes
// per environment. The rest (tiers.static, TLS details) belong in the file.
var flagSpecs = []flagSpec{
	{name: "http-addr", key: "http.addr", usage: "API listen address, host:port", only: CommandServe},
	{name: "http-shutdown-grace", key: "http.shutdownGrace", usage: "how long in-flight requests may finish after SIGTERM"},
	{name: "api-tokens-file", key: "api.tokensFile", usage: `file of "name token plans" lines: the callers allowed on the slot API and their plans`, unset: "none: the slot API is open", only: CommandServe},
	{name: "ops-addr", key: "ops.addr", usage: "listen address of /healthz, /readyz and /metrics, host:port"},
	{name: "redis-addrs", key: "redis.addrs", usage: "Redis seed addresses, host:port, comma-separated: a standalone server, cluster nodes, or Sentinels", unset: "none: the embedded store, for one replica only"},
	{name: "redis-sentinel-master-set", key: "redis.sentinelMasterSet", usage: "Sentinel master set; makes --redis-addrs Sentinels", unset: "none: no Sentinel"},
	{name: "redis-username", key: "redis.username", usage: "Redis ACL user", unset: "none: the default user"},
	{name: "redis-password-file", key: "redis.passwordFile", usage: "file holding the Redis password", unset: "none: no password"},
	{name: "redis-tls", key: "redis.tls.enabled", usage: "connect to Redis over TLS (CA and client certificate: redis.tls.* in the file or environment)", unset: "false"},
	{name: "redis-timeout", key: "redis.timeout", usage: "deadline of each Redis call; past it the tier's failureMode applies"},
	{name: "redis-key-prefix", key: "redis.keyPrefix", usage: "prefix of every Redis key"},
	{name: "tiers-source", key: "tiers.source", usage: "where limit tiers come from: static (tiers.static) or kubernetes (LimitTier objects)"},
	{name: "tiers-namespace", key: "tiers.namespace", usage: "namespace of the LimitTier objects (tiers-source kubernetes)", unset: "the pod's own namespace"},
	{name: "extproc-addr", key: "extproc.addr", usage: "gRPC listen address of the Envoy ext_proc server and its gRPC health, host:port", unset: "none: no ext_proc server", only: CommandServe},
	{name: "extproc-wait", key: "extproc.wait", usage: "how long an ext_proc request of a user holding every slot may wait for one, first come first served, before a 429 (0s-60s, capped by the plan's maxWait)", unset: "0s: refused at once", only: CommandServe},
	{name: "admin-addr", key: "admin.addr", usage: "listen address of the admin API and page (with --admin-tokens-file), host:port", only: CommandServe},
	{name: "admin-tokens-file", key: "admin.tokensFile", usage: `file of "name role token" lines (role viewer or operator) allowed on the admin API`, unset: "none: the admin API is off", only: CommandServe},
	{name: "otlp-endpoint", key: "telemetry.otlpEndpoint", usage: "OTLP receiver of traces (metrics are scraped from /metrics), host:port or http(s):// URL", unset: "none: no export"},
	{name: "service-name", key: "telemetry.serviceName", usage: "service.name of traces and metrics"},
	{name: "slots-used-max-window", key: "telemetry.slotsUsedMaxWindow", usage: "window of limiter_slots_used_max, the most live slots one user of a plan held; at least the scrape interval"},
	{name: "log-level", key: "log.level", usage: "least severe level logged: debug, info, warn or error"},
	{name: "log-format", key: "log.format", usage: "log format: json or text"},

	{name: "listen", key: "proxy.listen", usage: "the proxy's listen address, host:port", only: CommandProxy},
	{name: "upstream", key: "proxy.upstream", usage: "URL requests are forwarded to, http(s)://host:port[/prefix]", unset: "none: required", only: CommandProxy},
	{name: "routes", key: "proxy.routes", usage: "path prefixes whose requests hold a slot, comma-separated; the rest pass through", unset: "none: every request", only: CommandProxy},
	{name: "pass-authorization", key: "proxy.passAuthorization", usage: "pass the client's Authorization header upstream", only: CommandProxy},
	{name: "upstream-ca-file", key: "proxy.upstreamCAFile", usage: "PEM bundle of the CAs trusted for an https upstream", unset: "none: the system roots", only: CommandProxy},
	{name: "label-header", key: "proxy.labelHeader", usage: "request header whose value becomes the slot's label (a model, a pod, a request id), shown to support; empty: no label", only: CommandProxy},
	{name: "upstream-response-header-timeout", key: "proxy.responseHeaderTimeout", usage: "how long the upstream may take to send its response headers (the stream itself is not bounded)", only: CommandProxy},
	{name: "wait", key: "proxy.wait", usage: "how long a request of a user holding every slot may wait for one, first come first served, before a 429 (0s-60s, capped by the plan's maxWait)", unset: "0s: refused at once", only: CommandProxy},
	{name: "user-header", key: "identity.userHeader", usage: "header naming the user when no JWT is configured; trust it only behind a hop that authenticates and sets it", only: CommandProxy},
	{name: "plan-header", key: "identity.planHeader", usage: "header naming the plan when no JWT is configured", only: CommandProxy},
	{name: "default-plan", key: "identity.defaultPlan", usage: "plan of a request that names none", unset: "none: such requests are refused", only: CommandProxy},
	{name: "jwt-jwks-file", key: "identity.jwt.jwksFile", usage: "JSON Web Key Set file verifying bearer tokens, re-read when it changes; makes a verified JWT the only identity", unset: "none", only: CommandProxy},
	{name: "jwt-jwks-url", key: "identity.jwt.jwksURL", usage: "JSON Web Key Set URL verifying bearer tokens, cached", unset: "none", only: CommandProxy},
	{name: "jwt-issuer", key: "identity.jwt.issuer", usage: "iss every token must carry (required with a JWT)", unset: "none", only: CommandProxy},
	{name: "jwt-audience", key: "identity.jwt.audience", usage: "aud every token must carry (required with a JWT)", unset: "none", only: CommandProxy},
	{name: "jwt-user-claim", key: "identity.jwt.userClaim", usage: "claim holding the user id (dots reach into objects)", only: CommandProxy},
	{name: "jwt-plan-claim", key: "identity.jwt.planClaim", usage: "claim holding the plan", unset: "none: the default plan", only: CommandProxy},
}

func flagOf(key string) (flagSpec, bool) {
	for _, f := range flagSpecs {
		if f.key == key {
			return f, true
		}
	}
	return flagSpec{}, false
}

// AddFlags defines --config and a flag for each main key of `limiter
// serve` on fs. Each flag's help names its key's environment variable and
// its default. Pass the parsed fs to Load as LoadOptions.Flags.
func AddFlags(fs *pflag.FlagSet) { AddCommandFlags(fs, CommandServe) }

// AddCommandFlags defines --config and the flags of command (CommandServe
// or CommandProxy) on fs.
func AddCommandFlags(fs *pflag.FlagSet, command string) {
	fs.String(FlagConfig, "", fmt.Sprintf("YAML configuration file; environment and flags override it (env %s) (default none)", EnvConfig))
	def := DefaultFor(command)
	for _, f := range flagSpecs {
		if f.only != "" && f.only != command {
			continue
		}
		k, ok := lookupKey(f.key)
		if !ok {
			continue // TestFlagsNameKeys keeps this from happening
		}
		usage := fmt.Sprintf("%s (env %s)", f.usage, EnvVar(f.key))
		if f.unset != "" {
			usage += " (default " + f.unset + ")"
		}
		switch v := k.field(&def).Interface().(type) {
		case string:
			fs.String(f.name, v, usage)
		case []string:
			fs.StringSlice(f.name, v, usage)
		case time.Duration:
			fs.Duration(f.name, v, usage)
		case bool:
			fs.Bool(f.name, v, usage)
		case int:
			fs.Int(f.name, v, usage)
		}
	}
}
