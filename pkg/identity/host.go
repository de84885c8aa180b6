package identity

import (
	"strconv"
	"strings"
)

// schemeHeader is the pseudo-header naming a request's scheme ("http",
// "https"), as Envoy passes it to ext_proc; the proxy's Headers answer it
// from the connection. It tells a Host's default port.
const schemeHeader = ":scheme"

// isHostHeader reports whether a header source reads the request's host.
func isHostHeader(name string) bool { return strings.EqualFold(name, "Host") }

// canonicalHost is the pool key of a request's host (header:Host): one
// host, however spelt, is one key with one cap. The name is lower-cased
// (ASCII only: a Unicode fold would make "\u212aey" the host "key"), one
// trailing dot of a fully qualified name is dropped, a port of digits is
// read as a number (":0443" is ":443"), and the port is dropped when it is
// scheme's default (80 for http, 443 for https) or empty. An IPv6 literal
// keeps its brackets; any other port, or a scheme not known, keeps the
// port. ok is false for a host with no name left (".", ":443"): it is no
// host's key, and joining none would leave the request uncapped.
func canonicalHost(host, scheme string) (key string, ok bool) {
	host = asciiLower(host)
	name, port, hasPort := host, "", false
	switch {
	case strings.HasPrefix(host, "["):
		if i := strings.LastIndex(host, "]:"); i >= 0 {
			name, port, hasPort = host[:i+1], host[i+2:], true
		}
	case strings.Count(host, ":") == 1:
		name, port, _ = strings.Cut(host, ":")
		hasPort = true
	}
	if n, err := strconv.ParseUint(port, 10, 16); err == nil {
		port = strconv.FormatUint(n, 10)
	}
	if hasPort && (port == "" || port == defaultPort(asciiLower(scheme))) {
		hasPort = false
	}
	if !strings.HasPrefix(name, "[") {
		name = strings.TrimSuffix(name, ".")
	}
	if name == "" {
		return "", false
	}
	if hasPort {
		return name + ":" + port, true
	}
	return name, true
}

func defaultPort(scheme string) string {
	switch scheme {
	case "http":
		return "80"
	case "https":
		return "443"
	}
	return "" // no port is a default: every one is kept
}

func asciiLower(s string) string {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if 'A' <= b[j] && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}
