package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/tiers"
)

// Bounds of the validated values.
const (
	// MaxRedisTimeout bounds redis.timeout: a request waits this long
	// before its tier fails open or closed, so seconds already defeat the
	// point.
	MaxRedisTimeout = 10 * time.Second
	// MinLeaseDuration and MaxLeaseDuration bound tiers.leaseDuration.
	MinLeaseDuration = time.Second
	MaxLeaseDuration = 5 * time.Minute
	// MaxAuditLen bounds admin.auditMaxLen.
	MaxAuditLen = 10_000_000
	// MinSlotsUsedMaxWindow and MaxSlotsUsedMaxWindow bound
	// telemetry.slotsUsedMaxWindow.
	MinSlotsUsedMaxWindow = time.Second
	MaxSlotsUsedMaxWindow = time.Hour
)

var namespacePattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// ValidateServe reports the values `limiter serve` alone refuses: an
// ops.addr on http.addr, the API listener only serve opens (the proxy
// checks ops.addr against proxy.listen instead).
func (c Config) ValidateServe() error {
	v := validator{}
	if sameListener(c.HTTP.Addr, c.Ops.Addr) {
		v.add("ops.addr", "must not be the address of http.addr ("+c.HTTP.Addr+")", strconv.Quote(c.Ops.Addr))
	}
	return errors.Join(v.errs...)
}

// normalize lower-cases the enums, so LIMITER_LOG_LEVEL=INFO works.
func (c *Config) normalize() {
	c.Tiers.Source = strings.ToLower(strings.TrimSpace(c.Tiers.Source))
	c.Log.Level = strings.ToLower(strings.TrimSpace(c.Log.Level))
	c.Log.Format = strings.ToLower(strings.TrimSpace(c.Log.Format))
}

// Validate reports every invalid value, each as a *KeyError naming the
// key, its environment variable (and flag), what is allowed and what it
// got. It checks that the files named exist and are readable. What only
// one command opens or reads is checked by ValidateServe and ValidateProxy.
func (c Config) Validate() error {
	v := validator{}

	v.listenAddr("http.addr", c.HTTP.Addr)
	v.listenAddr("ops.addr", c.Ops.Addr)
	if c.HTTP.ShutdownGrace < 0 {
		v.add("http.shutdownGrace", "must be >= 0s", c.HTTP.ShutdownGrace.String())
	}
	for _, d := range []struct {
		key   string
		value time.Duration
	}{
		{"http.readHeaderTimeout", c.HTTP.ReadHeaderTimeout},
		{"http.readTimeout", c.HTTP.ReadTimeout},
		{"http.writeTimeout", c.HTTP.WriteTimeout},
		{"http.idleTimeout", c.HTTP.IdleTimeout},
	} {
		// 0 would mean no limit to net/http: the slow-client hole these
		// close.
		if d.value <= 0 {
			v.add(d.key, "must be > 0", d.value.String())
		}
	}

	v.readable("api.tokensFile", c.API.TokensFile)
	c.validateListenerTLS(&v)

	c.validateRedis(&v)

	switch c.Tiers.Source {
	case SourceStatic:
		c.validateStaticTiers(&v)
	case SourceKubernetes:
		switch {
		case c.Tiers.Namespace == "":
			v.add("tiers.namespace", "is required with tiers.source kubernetes outside a pod (POD_NAMESPACE unset, no service account namespace file)", "")
		case !namespacePattern.MatchString(c.Tiers.Namespace):
			v.add("tiers.namespace", "must be a Kubernetes namespace name (1-63 of [a-z0-9-], starting and ending alphanumeric)", strconv.Quote(c.Tiers.Namespace))
		}
	default:
		v.add("tiers.source", "must be static or kubernetes", strconv.Quote(c.Tiers.Source))
	}
	c.validateStaticPools(&v)
	if c.Tiers.LeaseDuration < MinLeaseDuration || c.Tiers.LeaseDuration > MaxLeaseDuration {
		v.add("tiers.leaseDuration", fmt.Sprintf("must be between %s and %s", MinLeaseDuration, MaxLeaseDuration), c.Tiers.LeaseDuration.String())
	}

	v.listenAddr("admin.addr", c.Admin.Addr)
	if c.Admin.TokensFile != "" {
		v.readable("admin.tokensFile", c.Admin.TokensFile)
		// Only a listener that will open can collide.
		for _, other := range []struct{ key, addr string }{{"http.addr", c.HTTP.Addr}, {"ops.addr", c.Ops.Addr}} {
			if sameListener(c.Admin.Addr, other.addr) {
				v.add("admin.addr", "must not be the address of "+other.key+" ("+other.addr+")", strconv.Quote(c.Admin.Addr))
			}
		}
	}
	if c.Admin.AuditMaxLen < 1 || c.Admin.AuditMaxLen > MaxAuditLen {
		v.add("admin.auditMaxLen", fmt.Sprintf("must be between 1 and %d", MaxAuditLen), strconv.Itoa(c.Admin.AuditMaxLen))
	}

	c.validateProxy(&v)
	c.validateIdentity(&v)
	c.validateExtProc(&v)

	if c.Telemetry.OTLPEndpoint != "" && !validEndpoint(c.Telemetry.OTLPEndpoint) {
		v.add("telemetry.otlpEndpoint", "must be host:port or an http:// or https:// URL", strconv.Quote(c.Telemetry.OTLPEndpoint))
	}
	if strings.TrimSpace(c.Telemetry.ServiceName) == "" {
		v.add("telemetry.serviceName", "must not be empty", "")
	}
	if w := c.Telemetry.SlotsUsedMaxWindow; w < MinSlotsUsedMaxWindow || w > MaxSlotsUsedMaxWindow {
		v.add("telemetry.slotsUsedMaxWindow", fmt.Sprintf("must be between %s and %s", MinSlotsUsedMaxWindow, MaxSlotsUsedMaxWindow), w.String())
	}

	switch c.Log.Level {
	case LevelDebug, LevelInfo, LevelWarn, LevelError:
	default:
		v.add("log.level", "must be debug, info, warn or error", strconv.Quote(c.Log.Level))
	}
	switch c.Log.Format {
	case FormatJSON, FormatText:
	default:
		v.add("log.format", "must be json or text", strconv.Quote(c.Log.Format))
	}
	return errors.Join(v.errs...)
}

func (c Config) validateRedis(v *validator) {
	r := c.Redis
	for _, addr := range r.Addrs {
		if !validDialAddr(addr) {
			v.add("redis.addrs", "each address must be host:port with a port 1-65535", strconv.Quote(addr))
		}
	}
	if len(r.Addrs) == 0 {
		// The embedded store speaks plain RESP without auth: these would
		// make every connection to it fail.
		for _, s := range []setting{
			{"redis.sentinelMasterSet", r.SentinelMasterSet != ""},
			{"redis.username", r.Username != ""},
			{"redis.passwordFile", r.PasswordFile != ""},
			{"redis.tls.enabled", r.TLS.Enabled},
		} {
			if s.set {
				v.add(s.key, "requires redis.addrs (without it the embedded store is used, which takes no authentication, TLS or Sentinel)", "")
			}
		}
	}
	v.readable("redis.passwordFile", r.PasswordFile)
	c.validateTLS(v)
	if r.Timeout <= 0 || r.Timeout > MaxRedisTimeout {
		v.add("redis.timeout", fmt.Sprintf("must be > 0 and <= %s", MaxRedisTimeout), r.Timeout.String())
	}
	if r.ShardsRefreshInterval <= 0 {
		v.add("redis.shardsRefreshInterval", "must be > 0", r.ShardsRefreshInterval.String())
	}
	switch {
	case r.SyncReplicas < 0:
		v.add("redis.syncReplicas", "must be >= 0 (0: acquires do not wait for replicas)", strconv.Itoa(r.SyncReplicas))
	case r.SyncReplicas > 0 && len(r.Addrs) == 0:
		v.add("redis.syncReplicas", "requires redis.addrs (the embedded store has no replicas)", strconv.Itoa(r.SyncReplicas))
	}
	if r.KeyPrefix == "" {
		v.add("redis.keyPrefix", "must not be empty", "")
	} else if err := keys.ValidateKeyPrefix(r.KeyPrefix); err != nil {
		v.errs = append(v.errs, &KeyError{Key: "redis.keyPrefix", Problem: err.Error(), Err: err})
	}
}

func (c Config) validateTLS(v *validator) {
	t := c.Redis.TLS
	if !t.Enabled {
		for _, s := range []setting{
			{"redis.tls.caFile", t.CAFile != ""},
			{"redis.tls.certFile", t.CertFile != ""},
			{"redis.tls.keyFile", t.KeyFile != ""},
			{"redis.tls.serverName", t.ServerName != ""},
			{"redis.tls.insecureSkipVerify", t.InsecureSkipVerify},
		} {
			if s.set {
				v.add(s.key, "requires redis.tls.enabled: true (refused rather than silently connecting in plain text)", "")
			}
		}
		return
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		v.add("redis.tls.certFile", "and redis.tls.keyFile must be set together", "")
	}
	v.readable("redis.tls.caFile", t.CAFile)
	v.readable("redis.tls.certFile", t.CertFile)
	v.readable("redis.tls.keyFile", t.KeyFile)
}

func (c Config) validateListenerTLS(v *validator) {
	t := c.HTTP.TLS
	if (t.CertFile == "") != (t.KeyFile == "") {
		v.add("http.tls.certFile", "and http.tls.keyFile must be set together", "")
	}
	if t.ClientCAFile != "" {
		if t.CertFile == "" {
			v.add("http.tls.clientCAFile", "requires http.tls.certFile and http.tls.keyFile: client certificates need TLS", "")
		}
		if c.API.TokensFile == "" {
			v.add("http.tls.clientCAFile", `requires api.tokensFile: it scopes each certificate's name to its plans (a line "name - plans")`, "")
		}
	}
	v.readable("http.tls.certFile", t.CertFile)
	v.readable("http.tls.keyFile", t.KeyFile)
	v.readable("http.tls.clientCAFile", t.ClientCAFile)
}

func (c Config) validateStaticTiers(v *validator) {
	list := c.StaticTiers()
	if len(list) == 0 {
		v.add("tiers.static", "must hold at least one tier with tiers.source static", "")
		return
	}
	validateStatic(v, "tiers.static", "plan", list)
}

// staticEntry is an entry of a static list: a tiers.Tier or a pools.Pool.
type staticEntry interface {
	// Name is what the entry defines, which no other entry may: its plan
	// or pool.
	Name() string
	// Problems reports every field out of bounds, by its name in the list.
	Problems() []*tiers.FieldError
}

// validateStatic checks the entries of list, the list at key, each
// under its index: every field out of bounds, and a name (the field
// nameField) an entry before it already defined.
func validateStatic[E staticEntry](v *validator, key, nameField string, list []E) {
	seen := map[string]int{}
	for i, e := range list {
		for _, p := range e.Problems() {
			v.errs = append(v.errs, &KeyError{Key: key, Field: fmt.Sprintf("[%d].%s", i, p.Field), Problem: p.Problem, Got: p.Got, Err: p})
		}
		if first, dup := seen[e.Name()]; dup && e.Name() != "" {
			v.errs = append(v.errs, &KeyError{Key: key, Field: fmt.Sprintf("[%d].%s", i, nameField),
				Problem: fmt.Sprintf("%q is already defined by %s[%d]", e.Name(), key, first)})
		} else {
			seen[e.Name()] = i
		}
	}
}

// setting is whether a key is set, for rules about keys that need another.
type setting struct {
	key string
	set bool
}

// validator collects the errors of Validate.
type validator struct{ errs []error }

func (v *validator) add(key, problem, got string) {
	v.errs = append(v.errs, &KeyError{Key: key, Problem: problem, Got: got})
}

func (v *validator) listenAddr(key, addr string) {
	host, port, err := net.SplitHostPort(addr)
	if err == nil && validPort(port, 0) && !strings.ContainsAny(host, " /") {
		return
	}
	v.add(key, "must be host:port or :port with a port 0-65535", strconv.Quote(addr))
}

// readable checks that path, unless empty (key unset), is a file this
// process can open.
func (v *validator) readable(key, path string) {
	if path == "" {
		return
	}
	f, err := os.Open(path)
	if err != nil {
		v.errs = append(v.errs, &KeyError{Key: key, Problem: "must name a readable file: " + err.Error(), Err: err})
		return
	}
	defer f.Close()
	if info, err := f.Stat(); err == nil && info.IsDir() {
		v.add(key, "must name a file, not a directory", strconv.Quote(path))
	}
}

func validDialAddr(addr string) bool {
	host, port, err := net.SplitHostPort(addr)
	return err == nil && host != "" && !strings.ContainsAny(host, " /") && validPort(port, 1)
}

func validPort(port string, lowest int) bool {
	n, err := strconv.Atoi(port)
	return err == nil && n >= lowest && n <= 65535
}

// sameListener reports whether two listen addresses would collide: the
// same non-zero port on the same host or on a wildcard host.
func sameListener(a, b string) bool {
	ha, pa, errA := net.SplitHostPort(a)
	hb, pb, errB := net.SplitHostPort(b)
	if errA != nil || errB != nil || pa != pb || pa == "0" {
		return false
	}
	wildcard := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	return ha == hb || wildcard(ha) || wildcard(hb)
}

func validEndpoint(endpoint string) bool {
	if strings.Contains(endpoint, "://") {
		u, err := url.Parse(endpoint)
		return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
	}
	return validDialAddr(endpoint)
}
