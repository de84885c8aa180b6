package testenv

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

func TestStartRedisStopAndStartOnSamePort(t *testing.T) {
	t.Parallel()
	s := StartRedis(t)
	addr := s.Addr()
	mustPing(t, addr)

	s.Stop()
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Fatalf("dial %s after Stop: got a connection, want refused", addr)
	}
	s.Stop() // idempotent

	s.Start()
	if got := s.Addr(); got != addr {
		t.Fatalf("Addr after Start: got %s, want %s", got, addr)
	}
	mustPing(t, addr)
	s.Start() // no-op while running

	s.Kill()
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Fatalf("dial %s after Kill: got a connection, want refused", addr)
	}
	s.Start()
	mustPing(t, addr)
}

func TestBlackHoleNeverAnswers(t *testing.T) {
	t.Parallel()
	conn, err := net.DialTimeout("tcp", BlackHole(t), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		t.Fatalf("write: %v", err)
	}
	conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	n, err := conn.Read(make([]byte, 16))
	var netErr net.Error
	if !errors.As(err, &netErr) || !netErr.Timeout() {
		t.Fatalf("read: got %d bytes, err %v; want a timeout", n, err)
	}
}

// TestFreeAddrIsBindable: an address FreeAddr returns can be listened on.
// Another process may take it first, as FreeAddr says: under `make test`
// other packages start servers on addresses their own FreeAddr picked
// from the same range, between its check and their listen. So a taken
// address is followed by another, a few times.
func TestFreeAddrIsBindable(t *testing.T) {
	t.Parallel()
	var errs []error
	for range 3 {
		addr := FreeAddr(t)
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			ln.Close()
			return
		}
		errs = append(errs, err)
	}
	t.Fatalf("no address FreeAddr returned could be listened on: %v", errors.Join(errs...))
}

func TestStartClusterIsHealthy(t *testing.T) {
	t.Parallel()
	addrs := StartCluster(t)
	if len(addrs) != 6 {
		t.Fatalf("StartCluster: got %d addresses %v, want 6", len(addrs), addrs)
	}
	for _, addr := range addrs {
		info := mustDo(t, addr, "CLUSTER", "INFO")
		if got := infoField(info, "cluster_state"); got != "ok" {
			t.Errorf("%s cluster_state: got %q, want ok", addr, got)
		}
		if got := infoField(info, "cluster_slots_ok"); got != "16384" {
			t.Errorf("%s cluster_slots_ok: got %q, want 16384", addr, got)
		}
	}
}

func TestSharedServersAnswer(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		mustPing(t, Redis(t))
	})
	t.Run("cluster", func(t *testing.T) {
		for _, addr := range Cluster(t) {
			if got := infoField(mustDo(t, addr, "CLUSTER", "INFO"), "cluster_state"); got != "ok" {
				t.Errorf("%s cluster_state: got %q, want ok", addr, got)
			}
		}
	})
}

// recordingTB records Fatal and Skip instead of ending the test.
type recordingTB struct {
	testing.TB
	fatal, skip string
}

func (r *recordingTB) Helper()                   {}
func (r *recordingTB) Fatal(args ...any)         { r.fatal = fmt.Sprint(args...) }
func (r *recordingTB) Fatalf(f string, a ...any) { r.fatal = fmt.Sprintf(f, a...) }
func (r *recordingTB) Skip(args ...any)          { r.skip = fmt.Sprint(args...) }
func (r *recordingTB) Skipf(f string, a ...any)  { r.skip = fmt.Sprintf(f, a...) }

func TestMissingServerFailsOnlyWhenRequired(t *testing.T) {
	tests := []struct {
		name      string
		require   string
		wantFatal bool
	}{
		{name: "make test demands servers", require: "1", wantFatal: true},
		{name: "plain go test skips", require: "", wantFatal: false},
		{name: "explicitly not required", require: "0", wantFatal: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(envRequire, tt.require)
			t.Setenv(envRedis, "")
			rec := &recordingTB{TB: t}
			Redis(rec)
			got := rec.skip
			if tt.wantFatal {
				got = rec.fatal
			}
			want := "LIMITER_TEST_REDIS is not set: run `make test`, which starts Redis"
			if got != want {
				t.Errorf("got fatal %q, skip %q; want %q as %s", rec.fatal, rec.skip, want, map[bool]string{true: "fatal", false: "skip"}[tt.wantFatal])
			}
		})
	}
}

func mustPing(t *testing.T, addr string) {
	t.Helper()
	reply, err := do(addr, 2*time.Second, "PING")
	if err != nil || reply != "PONG" {
		t.Fatalf("PING %s: got %v, %v; want PONG", addr, reply, err)
	}
}

func mustDo(t *testing.T, addr string, args ...string) string {
	t.Helper()
	reply, err := do(addr, 2*time.Second, args...)
	if err != nil {
		t.Fatalf("%s %s: %v", addr, strings.Join(args, " "), err)
	}
	s, ok := reply.(string)
	if !ok {
		t.Fatalf("%s %s: got %T reply, want a string", addr, strings.Join(args, " "), reply)
	}
	return s
}

func TestKeySlotMatchesRedis(t *testing.T) {
	addr := Cluster(t)[0]
	for _, key := range []string{"a", "joishi:streams:{user-1}", "{}x", "x{}{y}", "p:{a}b{c}", "no-tag", "{user 9}"} {
		reply, err := do(addr, 2*time.Second, "CLUSTER", "KEYSLOT", key)
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", key, err)
		}
		if got, want := int64(KeySlot(key)), reply.(int64); got != want {
			t.Errorf("KeySlot(%q) = %d, want %d (CLUSTER KEYSLOT)", key, got, want)
		}
	}
}

func TestProxyDropRepliesRunsTheCallAndLosesItsAnswer(t *testing.T) {
	t.Parallel()
	srv := StartRedis(t)
	proxy := StartProxy(t, srv.Addr())
	const incr = "return redis.call('INCR', KEYS[1])"
	proxy.DropReplies(1)

	if reply, err := do(proxy.Addr(), 2*time.Second, "PING"); err != nil || reply != "PONG" {
		t.Fatalf("PING through the proxy while a drop is armed: got %v, %v; want PONG (only script calls drop)", reply, err)
	}
	if reply, err := do(proxy.Addr(), 2*time.Second, "EVAL", incr, "1", "k"); err == nil {
		t.Fatalf("EVAL through the proxy: got reply %v, want the connection dropped", reply)
	}
	if got := mustDo(t, srv.Addr(), "GET", "k"); got != "1" {
		t.Fatalf("GET k after the dropped EVAL: got %q, want 1 (the call ran)", got)
	}
	if reply, err := do(proxy.Addr(), 2*time.Second, "EVAL", incr, "1", "k"); err != nil || reply != int64(2) {
		t.Fatalf("EVAL after the one drop: got %v, %v; want 2", reply, err)
	}
}
