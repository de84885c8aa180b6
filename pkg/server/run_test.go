package server_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/server"
	"github.com/joishi/limiter/pkg/tiers"
)

// tinyTimeouts make every limit of Run visible within a test.
var tinyTimeouts = server.Timeouts{
	ReadHeader: 300 * time.Millisecond,
	Read:       600 * time.Millisecond,
	Write:      600 * time.Millisecond,
	Idle:       600 * time.Millisecond,
}

// slack is how much later than its timeout a connection may be cut on a
// loaded machine.
const slack = 1500 * time.Millisecond

// runServer runs srv's Run with timeouts until the test ends and returns the
// API and ops addresses once both accept connections.
func runServer(t *testing.T, srv *server.Server, timeouts server.Timeouts) (api, ops string) {
	t.Helper()
	return runServerOn(t, srv, server.Listeners{Timeouts: timeouts})
}

// runServerOn is runServer with l, whose addresses it fills in.
func runServerOn(t *testing.T, srv *server.Server, l server.Listeners) (api, ops string) {
	t.Helper()
	api, ops = testenv.FreeAddr(t), testenv.FreeAddr(t)
	l.API, l.Ops = api, ops
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, l, time.Second) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	for _, addr := range []string{api, ops} {
		awaitAccepting(t, addr)
	}
	return api, ops
}

// awaitAccepting waits up to 10s for a listener of Run to accept
// connections on addr.
func awaitAccepting(t *testing.T, addr string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if conn, err := net.Dial("tcp", addr); err == nil {
			conn.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Run: %s does not accept connections within 10s", addr)
		}
	}
}

// slowServer is a Server on no Redis (nothing here reaches it) with a route
// that answers after a pause.
func slowServer(t *testing.T, pause time.Duration) *server.Server {
	t.Helper()
	table := tiers.NewTable()
	if err := table.Replace(limitertest.Tiers()); err != nil {
		t.Fatal(err)
	}
	return server.New(limiter.New(nil, table, limiter.Options{}), server.Options{Middleware: func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/slow" {
				next.ServeHTTP(w, r)
				return
			}
			time.Sleep(pause)
			fmt.Fprintln(w, "late")
		})
	}})
}

func TestRunCutsSlowClients(t *testing.T) {
	t.Parallel()
	api, ops := runServer(t, slowServer(t, 0), tinyTimeouts)
	for _, tc := range []struct {
		name    string
		addr    string
		client  testenv.SlowClient
		timeout time.Duration
	}{
		{"API: headers sent a byte at a time are cut at the header timeout", api, testenv.SlowHeaders(httpapi.PathAcquire, 50*time.Millisecond), tinyTimeouts.ReadHeader},
		{"API: a body sent a byte at a time is cut at the read timeout", api, testenv.SlowBody(httpapi.PathAcquire, 50*time.Millisecond), tinyTimeouts.Read},
		{"ops: headers sent a byte at a time are cut at the header timeout", ops, testenv.SlowHeaders("/readyz", 50*time.Millisecond), tinyTimeouts.ReadHeader},
		{"ops: a body sent a byte at a time is cut at the read timeout", ops, testenv.SlowBody("/readyz", 50*time.Millisecond), tinyTimeouts.Read},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			held, cut := tc.client.HeldOpen(t, tc.addr, tc.timeout+slack+5*time.Second)
			if !cut || held > tc.timeout+slack {
				t.Errorf("connection held open %v (cut: %v), want cut within %v + %v", held.Round(time.Millisecond), cut, tc.timeout, slack)
			}
		})
	}
}

func TestRunClosesIdleConnections(t *testing.T) {
	t.Parallel()
	api, ops := runServer(t, slowServer(t, 0), tinyTimeouts)
	for _, tc := range []struct{ name, addr, path string }{
		{"API", api, httpapi.PathTiers},
		{"ops", ops, "/healthz"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url := "http://" + tc.addr + tc.path
			conn, err := net.Dial("tcp", tc.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			req, _ := http.NewRequest(http.MethodGet, url, nil)
			if err := req.Write(conn); err != nil {
				t.Fatal(err)
			}
			rd := bufio.NewReader(conn)
			resp, err := http.ReadResponse(rd, req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Close {
				t.Fatalf("GET %s: %d (close %v), want 200 on a kept-alive connection", url, resp.StatusCode, resp.Close)
			}
			start := time.Now()
			_ = conn.SetReadDeadline(start.Add(tinyTimeouts.Idle + slack + 5*time.Second))
			_, err = rd.ReadByte()
			if idle := time.Since(start); !errors.Is(err, io.EOF) || idle > tinyTimeouts.Idle+slack {
				t.Errorf("idle connection: read %v after %v, want EOF within %v + %v", err, idle.Round(time.Millisecond), tinyTimeouts.Idle, slack)
			}
		})
	}
}

func TestRunBoundsTheAnswer(t *testing.T) {
	t.Parallel()
	api, _ := runServer(t, slowServer(t, tinyTimeouts.Write+500*time.Millisecond), tinyTimeouts)
	hc := &http.Client{Timeout: 10 * time.Second}
	start := time.Now()
	resp, err := hc.Get("http://" + api + "/slow")
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if err == nil {
		t.Fatalf("GET /slow answered %d after %v, past the write timeout %v: want the answer cut", resp.StatusCode, time.Since(start), tinyTimeouts.Write)
	}
}

func TestRunDefaultTimeouts(t *testing.T) {
	t.Parallel()
	want := server.Timeouts{ReadHeader: 5 * time.Second, Read: 10 * time.Second, Write: 10 * time.Second, Idle: 2 * time.Minute}
	if got := (server.Timeouts{}).WithDefaults(); got != want {
		t.Errorf("Timeouts{}.WithDefaults() = %+v, want %+v", got, want)
	}
}

// With Options.Admin, Run serves the admin API and page on a listener of
// their own; the API listener does not serve them.
func TestRunServesTheAdminListener(t *testing.T) {
	t.Parallel()
	lim := limitertest.New(t, limitertest.Options{}).Limiter
	admin := newAdmin(t, lim)
	adminAddr := testenv.FreeAddr(t)
	api, _ := runServerOn(t, server.New(lim, server.Options{Admin: admin}), server.Listeners{Admin: adminAddr})
	awaitAccepting(t, adminAddr)
	get := func(url string) int {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get("http://" + adminAddr + httpapi.PathAdminPage); got != http.StatusOK {
		t.Errorf("the admin page on the admin listener: got %d, want 200", got)
	}
	if got := get("http://" + api + httpapi.PathAdminPage); got != http.StatusNotFound {
		t.Errorf("the admin page on the API listener: got %d, want 404", got)
	}
}
