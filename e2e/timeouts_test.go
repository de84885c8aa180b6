package e2e

import (
	"net/url"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/httpapi"
)

// TestServeCutsSlowClients: a client that sends its headers or its body a
// byte at a time (slowloris) is cut by serve's configured timeouts on both
// listeners, instead of holding a connection open for as long as it likes.
func TestServeCutsSlowClients(t *testing.T) {
	const (
		headerTimeout = time.Second
		readTimeout   = 2 * time.Second
		slack         = 2 * time.Second
	)
	proc := servetest.Start(t, servetest.Options{Config: `http:
  readHeaderTimeout: 1s
  readTimeout: 2s
`})
	api, ops := hostOf(t, proc.API), hostOf(t, proc.Ops)
	for _, tc := range []struct {
		name    string
		addr    string
		client  testenv.SlowClient
		timeout time.Duration
	}{
		{"API, slow headers", api, testenv.SlowHeaders(httpapi.PathAcquire, 100*time.Millisecond), headerTimeout},
		{"API, slow body", api, testenv.SlowBody(httpapi.PathAcquire, 100*time.Millisecond), readTimeout},
		{"ops, slow headers", ops, testenv.SlowHeaders("/metrics", 100*time.Millisecond), headerTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			held, cut := tc.client.HeldOpen(t, tc.addr, tc.timeout+slack+10*time.Second)
			if !cut || held > tc.timeout+slack {
				t.Errorf("connection held open %v (cut: %v), want cut within %v + %v", held.Round(time.Millisecond), cut, tc.timeout, slack)
			}
		})
	}
}

func hostOf(t *testing.T, base string) string {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}
