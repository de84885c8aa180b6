package main

import (
	"io"
	"log/slog"
	"testing"

	"github.com/joishi/limiter/pkg/config"
)

// A listener that takes slots, the API or the ext_proc server, open (no
// api.tokensFile) on the embedded store, the try-it default, listens on
// the loopback interface unless its address names a host; any other
// set-up listens where the address says.
func TestAnOpenListenerOnTheEmbeddedStoreListensOnLoopback(t *testing.T) {
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
		cfg := config.Config{HTTP: config.HTTP{Addr: tc.addr}, API: config.API{TokensFile: tc.tokens}, ExtProc: config.ExtProc{Addr: tc.addr}}
		if got := apiAddr(cfg, tc.embedded, logger); got != tc.want {
			t.Errorf("the API, %s: listens on %q, want %q", tc.name, got, tc.want)
		}
		if got := openAddr(cfg, "the ext_proc server", "extproc.addr", cfg.ExtProc.Addr, tc.embedded, logger); got != tc.want {
			t.Errorf("the ext_proc server, %s: listens on %q, want %q", tc.name, got, tc.want)
		}
	}
}
