package main

import (
	"io"
	"log/slog"
	"testing"

	"github.com/joishi/limiter/pkg/config"
)

// An open API on the embedded store, the try-it default, listens on the
// loopback interface unless http.addr names a host; any other set-up
// listens where http.addr says.
func TestAnOpenAPIOnTheEmbeddedStoreListensOnLoopback(t *testing.T) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		name, addr, tokens string
		embedded           bool
		want               string
	}{
		{"the default: open, embedded, no host", ":8080", "", true, "127.0.0.1:8080"},
		{"a host asked for", "0.0.0.0:8080", "", true, "0.0.0.0:8080"},
		{"callers authenticate", ":8080", "/etc/limiter/tokens", true, ":8080"},
		{"a Redis of its own", ":8080", "", false, ":8080"},
	} {
		cfg := config.Config{HTTP: config.HTTP{Addr: tc.addr}, API: config.API{TokensFile: tc.tokens}}
		if got := apiAddr(cfg, tc.embedded, logger); got != tc.want {
			t.Errorf("%s: listens on %q, want %q", tc.name, got, tc.want)
		}
	}
}

// The ext_proc server takes slots as the API does, on the same callers
// (api.tokensFile): open on the embedded store, it listens on the
// loopback interface unless extproc.addr names a host.
func TestAnOpenExtProcServerOnTheEmbeddedStoreListensOnLoopback(t *testing.T) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		name, addr, tokens string
		embedded           bool
		want               string
	}{
		{"README's: open, embedded, no host", ":9091", "", true, "127.0.0.1:9091"},
		{"a host asked for", "0.0.0.0:9091", "", true, "0.0.0.0:9091"},
		{"callers authenticate", ":9091", "/etc/limiter/tokens", true, ":9091"},
		{"a Redis of its own", ":9091", "", false, ":9091"},
	} {
		cfg := config.Config{HTTP: config.HTTP{Addr: ":8080"}, API: config.API{TokensFile: tc.tokens}, ExtProc: config.ExtProc{Addr: tc.addr}}
		if got := openAddr(cfg, "the ext_proc server", "extproc.addr", cfg.ExtProc.Addr, tc.embedded, logger); got != tc.want {
			t.Errorf("%s: listens on %q, want %q", tc.name, got, tc.want)
		}
	}
}
