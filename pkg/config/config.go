// Package config is the limiter's typed configuration: its keys, their
// defaults, and their validation. Values come from a YAML file (--config),
// then environment variables LIMITER_<KEY> ('.' becomes '_', upper case),
// then flags, each layer overriding the one before (see Load).
//
// It is the only package that imports viper, and only load.go does.
package config

import (
	"log/slog"
	"time"

	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/server"
	"github.com/joishi/limiter/pkg/telemetry"
	"github.com/joishi/limiter/pkg/tiers"
)

// Config is the whole configuration of a limiter replica. Each field's key
// is its mapstructure tag path (e.g. redis.tls.caFile); Default documents
// every default.
type Config struct {
	HTTP      HTTP      `mapstructure:"http"`
	API       API       `mapstructure:"api"`
	Ops       Ops       `mapstructure:"ops"`
	Redis     Redis     `mapstructure:"redis"`
	Tiers     Tiers     `mapstructure:"tiers"`
	Pools     Pools     `mapstructure:"pools"`
	Admin     Admin     `mapstructure:"admin"`
	Telemetry Telemetry `mapstructure:"telemetry"`
	Log       Log       `mapstructure:"log"`
	// Proxy and Identity configure `limiter proxy` (see proxy.go);
	// Identity and ExtProc the ext_proc server of `limiter serve`
	// (extproc.go).
	Proxy    Proxy    `mapstructure:"proxy"`
	Identity Identity `mapstructure:"identity"`
	ExtProc  ExtProc  `mapstructure:"extproc"`
}

// HTTP is the API listener.
type HTTP struct {
	// Addr is the API's listen address, host:port. Default ":8080".
	Addr string `mapstructure:"addr"`
	// ShutdownGrace is how long in-flight requests may run after SIGTERM
	// before they are cut. Keep it below the pod's
	// terminationGracePeriodSeconds. Default 15s.
	ShutdownGrace time.Duration `mapstructure:"shutdownGrace"`
	// ReadHeaderTimeout bounds reading a request's headers, on the API and
	// ops listeners: a client sending them a byte at a time is cut after
	// it. Default 5s.
	ReadHeaderTimeout time.Duration `mapstructure:"readHeaderTimeout"`
	// ReadTimeout bounds reading a whole request, body included, on both
	// listeners. Default 10s.
	ReadTimeout time.Duration `mapstructure:"readTimeout"`
	// WriteTimeout bounds a request from the end of its headers to the end
	// of its answer, on both listeners. No route streams; keep it above
	// redis.timeout. Default 10s.
	WriteTimeout time.Duration `mapstructure:"writeTimeout"`
	// IdleTimeout is how long a kept-alive connection may wait for its next
	// request, on both listeners. Default 2m.
	IdleTimeout time.Duration `mapstructure:"idleTimeout"`
	// TLS serves the API over TLS, and mutual TLS with a client CA, and the
	// admin listener over TLS with the same certificate.
	TLS ListenerTLS `mapstructure:"tls"`
}

// ListenerTLS is the API listener's TLS, and the admin listener's (its
// certificate, no client certificates). The ops listener stays plain.
type ListenerTLS struct {
	// CertFile and KeyFile are the server's PEM certificate and key; both
	// or neither. Re-read when they change. Default "": plain HTTP.
	CertFile string `mapstructure:"certFile"`
	KeyFile  string `mapstructure:"keyFile"`
	// ClientCAFile is a PEM bundle of the CAs whose client certificates
	// identify callers: a certificate's first DNS name (its common name
	// only when it has no SAN at all; one whose SANs hold no DNS name is
	// refused) must name a line of api.tokensFile, which scopes it like a
	// token (its token column may be "-"). A client without a certificate
	// may still send a token. Requires certFile and api.tokensFile.
	// Read at start. Default "": no client certificates.
	ClientCAFile string `mapstructure:"clientCAFile"`
}

// Files returns the TLS files for server.Listeners.
func (t ListenerTLS) Files() server.TLSFiles {
	return server.TLSFiles{CertFile: t.CertFile, KeyFile: t.KeyFile, ClientCAFile: t.ClientCAFile}
}

// API is who may call the slot API (/v1/slots/*, /v1/tiers).
type API struct {
	// TokensFile holds one "name token plans" per line: the callers of the
	// slot API, each with its bearer token (at least 16 characters; "-"
	// for a caller that presents a client certificate only) and the plans
	// it may use ("*" or a comma-separated list); '#' comments allowed.
	// Re-read when it changes; a removed file refuses every caller. A call
	// without a known token is 401, a plan outside the caller's 403.
	// Default "": the slot API is open to anyone who reaches http.addr
	// (logged at WARN).
	TokensFile string `mapstructure:"tokensFile"`
}

// Ops is the listener of /healthz, /readyz and /metrics.
type Ops struct {
	// Addr is the ops listen address, host:port. Default ":9090";
	// DefaultProxyOpsAddr (":9092") for `limiter proxy`.
	Addr string `mapstructure:"addr"`
}

// DefaultProxyOpsAddr is the ops listen address of `limiter proxy`. It is
// neither serve's (:9090) nor :9091, the ext_proc port of the examples and
// the chart, so that a proxy and a replica can run side by side on one
// host with their defaults.
const DefaultProxyOpsAddr = ":9092"

// Redis says where slots are kept.
type Redis struct {
	// Addrs are seed addresses (host:port): one standalone server, any
	// nodes of a Redis Cluster (detected), or Sentinels when
	// SentinelMasterSet is set. Default empty: the embedded in-process
	// store, which holds one replica's slots only.
	Addrs []string `mapstructure:"addrs"`
	// SentinelMasterSet, when set, makes Addrs Sentinels following this
	// master set. Default "".
	SentinelMasterSet string `mapstructure:"sentinelMasterSet"`
	// Username is the ACL user. Default "" (the default user).
	Username string `mapstructure:"username"`
	// PasswordFile is a file holding the password (a trailing newline is
	// ignored). The password itself never enters Config, so logging a
	// Config cannot leak it. Default "": no password.
	PasswordFile string `mapstructure:"passwordFile"`
	// TLS secures connections to Redis and Sentinels.
	TLS TLS `mapstructure:"tls"`
	// Timeout is the deadline of each Redis call; past it the tier's
	// failureMode applies. Default 250ms.
	Timeout time.Duration `mapstructure:"timeout"`
	// ShardsRefreshInterval is how often the cluster (or Sentinel)
	// topology is rescanned. Default 5s.
	ShardsRefreshInterval time.Duration `mapstructure:"shardsRefreshInterval"`
	// KeyPrefix starts every key. Default "joishi:streams:".
	KeyPrefix string `mapstructure:"keyPrefix"`
	// RequiredForReadiness holds /readyz at 503 until Redis first answers,
	// so a rollout with a wrong address or an unformed cluster stalls
	// instead of replacing working replicas. Once Redis has answered,
	// readiness never follows it again: an outage must leave the replicas
	// in the load balancer to apply each tier's failureMode. Default false:
	// readiness ignores Redis.
	RequiredForReadiness bool `mapstructure:"requiredForReadiness"`
	// SyncReplicas, when > 0, makes every granted acquire wait (WAIT, on
	// the connection that ran the script, within the per-call deadline)
	// until that many replicas of the key's master have the slot, so a
	// failover cannot lose it. A grant fewer replicas confirm is counted
	// (limiter_acquire_unsynced_total); Closed plans refuse it (503) and
	// release the slot, Open plans keep it. Costs a replication round trip
	// per acquire (BENCHMARKS.md). Default 0: off.
	SyncReplicas int `mapstructure:"syncReplicas"`
}

// TLS of the Redis connections.
type TLS struct {
	// Enabled turns TLS on. Default false. The other fields require it.
	Enabled bool `mapstructure:"enabled"`
	// CAFile is a PEM bundle of the CAs trusted for the server
	// certificate. Default "": the system roots.
	CAFile string `mapstructure:"caFile"`
	// CertFile and KeyFile are a PEM client certificate and key (mutual
	// TLS); both or neither. They are re-read at each new connection, so
	// a rotated certificate is picked up without a restart. Default "".
	CertFile string `mapstructure:"certFile"`
	KeyFile  string `mapstructure:"keyFile"`
	// ServerName overrides the name verified in the server certificate.
	// Default "": the host of the address dialled.
	ServerName string `mapstructure:"serverName"`
	// InsecureSkipVerify accepts any server certificate. For tests only.
	// Default false.
	InsecureSkipVerify bool `mapstructure:"insecureSkipVerify"`
}

// Tier sources.
const (
	// SourceStatic reads tiers from tiers.static.
	SourceStatic = "static"
	// SourceKubernetes watches LimitTier objects in tiers.namespace.
	SourceKubernetes = "kubernetes"
)

// Tiers says where the limit tiers come from.
type Tiers struct {
	// Source is SourceStatic or SourceKubernetes. Default "static".
	Source string `mapstructure:"source"`
	// Namespace is where LimitTier objects are watched (kubernetes only).
	// Default: the pod's own namespace (POD_NAMESPACE, else the service
	// account's namespace file), filled in by Load.
	Namespace string `mapstructure:"namespace"`
	// LeaseDuration is how long the replica elected to write LimitTier
	// status keeps the role after it stops renewing its Lease (a crashed
	// replica), so how long status may go unwritten (kubernetes only).
	// Enforcement never waits for it. Default 15s.
	LeaseDuration time.Duration `mapstructure:"leaseDuration"`
	// Static is the tier list of the static source. Zero optional fields
	// take the tier defaults (see tiers.Tier.WithDefaults). Default
	// tiers.Defaults(): free=1, paid=3 (maxWait 10s).
	Static []tiers.Tier `mapstructure:"static"`
}

// Admin is the operators' API (/v1/admin/...) and page (/admin/).
type Admin struct {
	// Addr is the admin listener's address, host:port: the admin API and
	// page are served there, never on http.addr. It listens only when
	// TokensFile is set. Default ":8081".
	Addr string `mapstructure:"addr"`
	// TokensFile holds one "name role token" per line (role viewer or
	// operator; '#' comments allowed), re-read when it changes; the name is
	// recorded in the audit log. Default "": the admin API and page are off.
	TokensFile string `mapstructure:"tokensFile"`
	// AuditMaxLen caps the audit stream's length (entries). Default 10000.
	AuditMaxLen int `mapstructure:"auditMaxLen"`
}

// Telemetry is where traces and metrics go.
type Telemetry struct {
	// OTLPEndpoint receives traces over OTLP (metrics are scraped from /metrics): host:port (gRPC)
	// or an http(s):// URL. Default "": no export.
	OTLPEndpoint string `mapstructure:"otlpEndpoint"`
	// ServiceName is the service.name resource attribute. Default "limiter".
	ServiceName string `mapstructure:"serviceName"`
	// SlotsUsedMaxWindow is the window of limiter_slots_used_max, the most
	// live slots one user of a plan held: 1s to 1h, at least the scrape
	// interval. Default 1m.
	SlotsUsedMaxWindow time.Duration `mapstructure:"slotsUsedMaxWindow"`
}

// Log levels and formats.
const (
	LevelDebug = "debug"
	LevelInfo  = "info"
	LevelWarn  = "warn"
	LevelError = "error"

	FormatJSON = "json"
	FormatText = "text"
)

// Log is the process log (stderr).
type Log struct {
	// Level is debug, info, warn or error. Default "info".
	Level string `mapstructure:"level"`
	// Format is json or text. Default "json".
	Format string `mapstructure:"format"`
}

// SlogLevel returns Level as a slog.Level (info when Level is unknown;
// Validate refuses unknown levels).
func (l Log) SlogLevel() slog.Level {
	switch l.Level {
	case LevelDebug:
		return slog.LevelDebug
	case LevelWarn:
		return slog.LevelWarn
	case LevelError:
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}

// DefaultFor returns the configuration of command used where nothing is
// set: Default, with ops.addr DefaultProxyOpsAddr for CommandProxy.
func DefaultFor(command string) Config {
	c := Default()
	if command == CommandProxy {
		c.Ops.Addr = DefaultProxyOpsAddr
	}
	return c
}

// Default returns the configuration of `limiter serve` used where nothing
// is set.
func Default() Config {
	return Config{
		HTTP: HTTP{
			Addr:              ":8080",
			ShutdownGrace:     15 * time.Second,
			ReadHeaderTimeout: server.DefaultReadHeaderTimeout,
			ReadTimeout:       server.DefaultReadTimeout,
			WriteTimeout:      server.DefaultWriteTimeout,
			IdleTimeout:       server.DefaultIdleTimeout,
		},
		Ops: Ops{Addr: ":9090"},
		Redis: Redis{
			Addrs:                 []string{},
			Timeout:               cluster.DefaultTimeout,
			ShardsRefreshInterval: cluster.DefaultShardsRefreshInterval,
			KeyPrefix:             keys.DefaultKeyPrefix,
		},
		Tiers:     Tiers{Source: SourceStatic, LeaseDuration: 15 * time.Second, Static: tiers.Defaults()},
		Admin:     Admin{Addr: ":8081", AuditMaxLen: 10000},
		Telemetry: Telemetry{ServiceName: "limiter", SlotsUsedMaxWindow: telemetry.DefaultUsedMaxWindow},
		Log:       Log{Level: LevelInfo, Format: FormatJSON},
		Proxy:     defaultProxy(),
		Identity:  defaultIdentity(),
		ExtProc:   defaultExtProc(),
	}
}

// Timeouts returns the connection timeouts of the listeners.
func (h HTTP) Timeouts() server.Timeouts {
	return server.Timeouts{ReadHeader: h.ReadHeaderTimeout, Read: h.ReadTimeout, Write: h.WriteTimeout, Idle: h.IdleTimeout}
}

// StaticTiers returns tiers.static with each tier's defaults applied.
func (c Config) StaticTiers() []tiers.Tier {
	out := make([]tiers.Tier, len(c.Tiers.Static))
	for i, tier := range c.Tiers.Static {
		out[i] = tier.WithDefaults()
	}
	return out
}
