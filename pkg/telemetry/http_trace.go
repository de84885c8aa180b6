package telemetry

import (
	"net"
	"net/http"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// requestTraceAttrs are the server span's attributes at its start, as
// otelhttp set them, but url.path: the path may hold a user id
// (/v1/admin/users/{user_id}/slots), so the span gets the route's template
// at its end instead (responseTraceAttrs), and never the path itself.
func requestTraceAttrs(r *http.Request) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 12)
	https := r.TLS != nil
	host, port := splitHostPort(r.Host)
	attrs = append(attrs, semconv.ServerAddress(host))
	if port > 0 && !(https && port == 443) && !(!https && port == 80) {
		attrs = append(attrs, semconv.ServerPort(port))
	}
	method := standardMethod(r.Method)
	attrs = append(attrs, semconv.HTTPRequestMethodKey.String(method))
	if method != r.Method {
		attrs = append(attrs, semconv.HTTPRequestMethodOriginal(r.Method))
	}
	scheme := "http"
	if https {
		scheme = "https"
	}
	attrs = append(attrs, semconv.URLScheme(scheme))
	peer, peerPort := splitHostPort(r.RemoteAddr)
	if peer != "" {
		attrs = append(attrs, semconv.NetworkPeerAddress(peer))
		if peerPort > 0 {
			attrs = append(attrs, semconv.NetworkPeerPort(peerPort))
		}
	}
	if agent := r.UserAgent(); agent != "" {
		attrs = append(attrs, semconv.UserAgentOriginal(agent))
	}
	client, _, _ := strings.Cut(r.Header.Get("X-Forwarded-For"), ",")
	if client == "" {
		client = peer
	}
	if client != "" {
		attrs = append(attrs, semconv.ClientAddress(client))
	}
	name, version, _ := strings.Cut(r.Proto, "/")
	if name = strings.ToLower(name); name != "" && name != "http" {
		attrs = append(attrs, semconv.NetworkProtocolName(name))
	}
	if version != "" {
		attrs = append(attrs, semconv.NetworkProtocolVersion(version))
	}
	return attrs
}

// responseTraceAttrs are the server span's attributes at its end: the
// route's template as url.path, the body sizes and the status.
func responseTraceAttrs(r *http.Request, rec *recorder) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 4)
	if route := httpRoute(r.Pattern); route != "" {
		attrs = append(attrs, semconv.URLPath(route))
	} else if r.Pattern == "" && r.URL != nil && r.URL.Path != "" {
		attrs = append(attrs, semconv.URLPath(r.URL.Path)) // no mux: nothing to hide
	}
	if n := rec.bodyRead(); n > 0 {
		attrs = append(attrs, semconv.HTTPRequestBodySize(int(n)))
	}
	if rec.written > 0 {
		attrs = append(attrs, semconv.HTTPResponseBodySize(int(rec.written)))
	}
	return append(attrs, semconv.HTTPResponseStatusCode(rec.status))
}

// splitHostPort splits "host:port", "[v6]:port" or a bare host; port is
// -1 when there is none.
func splitHostPort(hostport string) (string, int) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return strings.TrimSuffix(strings.TrimPrefix(hostport, "["), "]"), -1
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return host, -1
	}
	return host, int(p)
}
