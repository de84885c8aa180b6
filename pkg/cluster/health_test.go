package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
	"github.com/redis/rueidis"
)

// healthOptions make the health signals fast enough for a test; logs go to
// logs.
func healthOptions(logs *testenv.Buffer, addrs ...string) Options {
	return Options{
		Addrs:         addrs,
		ProbeInterval: 100 * time.Millisecond,
		AnswerWithin:  500 * time.Millisecond,
		Logger:        slog.New(slog.NewJSONHandler(logs, nil)),
	}
}

// eventually polls cond every 20ms until it holds or within passes.
func eventually(within time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(within); ; time.Sleep(20 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

const notAnswered = `"level":"ERROR","msg":"redis has not answered`

func TestHealthOfARedisThatNeverAnswers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		addr string
	}{
		{"nothing listens at the address", testenv.FreeAddr(t)},
		{"the address accepts connections and never answers", testenv.BlackHole(t)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs testenv.Buffer
			c, err := New(healthOptions(&logs, tc.addr))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if !eventually(3*time.Second, func() bool { return strings.Contains(logs.String(), notAnswered) }) {
				t.Fatalf("no ERROR %q within 3s of start (AnswerWithin 500ms):\n%s", notAnswered, logs.String())
			}
			line := logLine(t, logs.String(), notAnswered)
			for _, want := range []string{tc.addr, "failureMode", "degraded"} {
				if !strings.Contains(line, want) {
					t.Errorf("ERROR line %s does not say %q", line, want)
				}
			}
			if c.Up() || c.Answered() {
				t.Errorf("Up() = %v, Answered() = %v; want false, false", c.Up(), c.Answered())
			}
			if strings.Count(logs.String(), notAnswered) != 1 {
				t.Errorf("the ERROR was logged %d times, want once:\n%s", strings.Count(logs.String(), notAnswered), logs.String())
			}
		})
	}
}

func logLine(t *testing.T, logs, substr string) string {
	t.Helper()
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, substr) {
			return line
		}
	}
	t.Fatalf("no log line contains %q", substr)
	return ""
}

func TestHealthOfAReachableRedis(t *testing.T) {
	t.Parallel()
	var logs testenv.Buffer
	c, err := New(healthOptions(&logs, testenv.Redis(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !eventually(5*time.Second, c.Up) {
		t.Fatalf("Up() stayed false for 5s on a reachable Redis:\n%s", logs.String())
	}
	if !c.Answered() {
		t.Error("Answered() = false once Up")
	}
	time.Sleep(700 * time.Millisecond) // past AnswerWithin
	if strings.Contains(logs.String(), notAnswered) {
		t.Errorf("logged %q for a Redis that answered:\n%s", notAnswered, logs.String())
	}
}

func TestHealthOfTheEmbeddedStore(t *testing.T) {
	t.Parallel()
	var logs testenv.Buffer
	c, err := New(healthOptions(&logs))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !eventually(5*time.Second, c.Up) {
		t.Fatalf("Up() stayed false for 5s on the embedded store:\n%s", logs.String())
	}
}

// A cluster node whose cluster never formed accepts connections and
// answers PING, but owns no slot: every call of the limiter fails.
func TestHealthOfAClusterThatNeverFormed(t *testing.T) {
	t.Parallel()
	testenv.StartRedis(t) // fails, or skips when not required, without redis-server
	addr := testenv.FreeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	// The cluster bus's port is named too: by default it is port+10000,
	// among the test Redis servers' ports, and may be taken.
	_, bus, _ := net.SplitHostPort(testenv.FreeAddr(t))
	dir := t.TempDir()
	startServer(t, addr, "--port", port, "--bind", "127.0.0.1", "--save", "", "--dir", dir,
		"--cluster-enabled", "yes", "--cluster-port", bus, "--cluster-config-file", filepath.Join(dir, "nodes.conf"))

	var logs testenv.Buffer
	c, err := New(healthOptions(&logs, addr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	if !eventually(3*time.Second, func() bool { return strings.Contains(logs.String(), notAnswered) }) {
		t.Fatalf("no ERROR %q within 3s of start:\n%s", notAnswered, logs.String())
	}
	if line := logLine(t, logs.String(), notAnswered); !strings.Contains(line, "cluster_state") {
		t.Errorf("ERROR line %s does not name the cluster state", line)
	}
	if c.Up() || c.Answered() {
		t.Errorf("Up() = %v, Answered() = %v on a cluster with no slot assigned; want false, false", c.Up(), c.Answered())
	}
}

func TestHealthFollowsAnOutage(t *testing.T) {
	t.Parallel()
	proxy := testenv.StartProxy(t, testenv.Redis(t))
	var logs testenv.Buffer
	c, err := New(healthOptions(&logs, proxy.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !eventually(5*time.Second, c.Up) {
		t.Fatalf("Up() stayed false for 5s on a reachable Redis:\n%s", logs.String())
	}

	proxy.BlackHole()
	// A probe every 100ms, each timing out after 250ms: down once no answer
	// came for DownAfter.
	if !eventually(DownAfter+3*time.Second, func() bool { return !c.Up() }) {
		t.Fatalf("Up() stayed true for %v after Redis stopped answering", DownAfter+3*time.Second)
	}
	if !c.Answered() {
		t.Error("Answered() = false after Redis had answered: want it to stay true")
	}

	proxy.Restore()
	if !eventually(10*time.Second, c.Up) {
		t.Fatalf("Up() stayed false for 10s after Redis answered again:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), notAnswered) {
		t.Errorf("logged %q although Redis answered at start", notAnswered)
	}
}

func TestOutcomeOfACall(t *testing.T) {
	c := rawClient(t, testenv.Redis(t))
	// redisErr is a real error reply, as Redis sends it.
	redisErr := func(reply string) error {
		err := c.Do(context.Background(), c.B().Arbitrary("EVAL").Args(fmt.Sprintf("return redis.error_reply(%q)", reply), "0").Build()).Error()
		if _, ok := rueidis.IsRedisErr(err); !ok {
			t.Fatalf("EVAL error_reply(%q) = %v, want a Redis error reply", reply, err)
		}
		return err
	}
	for _, tc := range []struct {
		name string
		err  error
		want outcome
	}{
		{"a reply", nil, answered},
		{"a nil reply", rueidis.Nil, answered},
		{"a permanent error reply (the configuration is wrong, Redis is up)", redisErr("NOPERM this user has no permissions"), answered},
		{"a script missing", redisErr("NOSCRIPT No matching script"), answered},
		{"a cluster down", redisErr("CLUSTERDOWN The cluster is down"), outage},
		{"a server loading", redisErr("LOADING Redis is loading the dataset in memory"), outage},
		{"a password refused", redisErr("WRONGPASS invalid username-password pair or user is disabled."), outage},
		{"a connection not authenticated", redisErr("NOAUTH Authentication required."), outage},
		{"a timeout", context.DeadlineExceeded, outage},
		{"a slot with no node", rueidis.ErrNoSlot, outage},
		{"a connection refused", &net.OpError{Op: "dial", Err: errors.New("connection refused")}, outage},
		{"a call its caller abandoned", context.Canceled, abandoned},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := outcomeOf(tc.err); got != tc.want {
				t.Errorf("outcomeOf(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
