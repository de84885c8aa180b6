package telemetry

import (
	"net/http"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// labelKey is what the attributes of the HTTP server metrics are made
// of. Each field takes a handful of values whatever the requests say: no
// label comes from a request header (otelhttp also recorded server.address
// and server.port, from Host: every distinct Host a client sent made new
// series).
type labelKey struct {
	route   string // the path of the mux pattern; "" when none matched
	method  string // standardMethod
	status  int
	https   bool
	version string // protocolVersion
}

// metricLabels is one attribute set, ready to pass to Record.
type metricLabels struct{ opts []metric.RecordOption }

// labelCache builds each attribute set once: a lookup in an immutable map,
// replaced by a copy when a set is added.
type labelCache struct {
	sets atomic.Pointer[map[labelKey]*metricLabels]
	mu   sync.Mutex
}

// maxLabelSets bounds the cache. The keys are few (routes × methods ×
// statuses × protocols); past the bound a set is built per request.
const maxLabelSets = 1024

func (c *labelCache) get(r *http.Request, status int) *metricLabels {
	key := labelKey{
		route:   httpRoute(r.Pattern),
		method:  standardMethod(r.Method),
		status:  status,
		https:   r.TLS != nil,
		version: protocolVersion(r.Proto),
	}
	if sets := c.sets.Load(); sets != nil {
		if l, ok := (*sets)[key]; ok {
			return l
		}
	}
	return c.add(key)
}

func (c *labelCache) add(key labelKey) *metricLabels {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.sets.Load()
	if old != nil {
		if l, ok := (*old)[key]; ok {
			return l
		}
	}
	l := &metricLabels{opts: []metric.RecordOption{metric.WithAttributeSet(key.set())}}
	if old != nil && len(*old) >= maxLabelSets {
		return l
	}
	sets := make(map[labelKey]*metricLabels, 1)
	if old != nil {
		sets = make(map[labelKey]*metricLabels, len(*old)+1)
		for k, v := range *old {
			sets[k] = v
		}
	}
	sets[key] = l
	c.sets.Store(&sets)
	return l
}

// set is the attribute set of key: the attributes otelhttp recorded,
// but those of the Host header.
func (key labelKey) set() attribute.Set {
	scheme := "http"
	if key.https {
		scheme = "https"
	}
	attrs := []attribute.KeyValue{
		semconv.HTTPRequestMethodKey.String(key.method),
		semconv.URLScheme(scheme),
		semconv.NetworkProtocolName("http"),
		semconv.HTTPResponseStatusCode(key.status),
	}
	if key.version != "" {
		attrs = append(attrs, semconv.NetworkProtocolVersion(key.version))
	}
	if key.route != "" {
		attrs = append(attrs, semconv.HTTPRoute(key.route))
	}
	return attribute.NewSet(attrs...)
}

// protocolVersion is the HTTP version of a request line, as otelhttp
// recorded it ("1.1", "2.0"), for the versions clients speak. net/http
// accepts any HTTP/1.x, up to "HTTP/1.1000000"; those would be series
// made at a client's will, so they have no version label.
func protocolVersion(proto string) string {
	switch proto {
	case "HTTP/1.1":
		return "1.1"
	case "HTTP/2.0":
		return "2.0"
	case "HTTP/1.0":
		return "1.0"
	}
	return ""
}
