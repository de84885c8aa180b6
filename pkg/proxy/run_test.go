package proxy_test

import (
	"context"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/holdtest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/hold"
	"github.com/joishi/limiter/pkg/identity"
	"github.com/joishi/limiter/pkg/proxy"
)

// The ops listener takes http.readTimeout and http.writeTimeout, as
// serve's does: a client sending its request a byte at a time is cut at
// the read timeout configured, not at a fixed 10s.
func TestRunOpsListenerTakesTheReadTimeout(t *testing.T) {
	const readTimeout, slack = 600 * time.Millisecond, 1500 * time.Millisecond
	e := holdtest.New(t, holdtest.Options{Hold: hold.Options{Mode: "proxy"}})
	ident, err := identity.New(identity.Options{})
	if err != nil {
		t.Fatal(err)
	}
	upstream, _ := url.Parse("http://" + testenv.FreeAddr(t))
	p, err := proxy.New(e.Holder, ident, proxy.Options{Upstream: upstream, Tiers: e.Stack.Table, MeterProvider: e.Tel.MeterProvider})
	if err != nil {
		t.Fatal(err)
	}
	l := proxy.Listeners{Proxy: testenv.FreeAddr(t), Ops: testenv.FreeAddr(t), OpsReadTimeout: readTimeout, OpsWriteTimeout: readTimeout}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, l, time.Second) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if conn, err := net.Dial("tcp", l.Ops); err == nil {
			conn.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Run: ops %s does not accept connections within 10s", l.Ops)
		}
	}

	held, cut := testenv.SlowBody("/readyz", 50*time.Millisecond).HeldOpen(t, l.Ops, readTimeout+slack+5*time.Second)
	if !cut || held > readTimeout+slack {
		t.Errorf("ops: a body sent a byte at a time held the connection %v (cut: %v), want it cut within %v + %v", held.Round(time.Millisecond), cut, readTimeout, slack)
	}
}
