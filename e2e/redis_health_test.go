package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
)

// notAnswered starts the ERROR serve logs when Redis has not answered
// within 5s of start.
const notAnswered = `"level":"ERROR","msg":"redis has not answered`

// redisUp waits up to within for limiter_redis_up on /metrics to be want,
// and fails the test if it is not (or is not exported).
func redisUp(t *testing.T, proc *servetest.Process, want float64, within time.Duration) {
	t.Helper()
	var got float64
	var ok bool
	for deadline := time.Now().Add(within); ; time.Sleep(50 * time.Millisecond) {
		got, ok = scrape(t, proc)["limiter_redis_up"]
		if ok && got == want {
			return
		}
		if time.Now().After(deadline) {
			break
		}
	}
	t.Fatalf("limiter_redis_up = %v (exported: %v) for %v, want %v\n%s", got, ok, within, want, proc.Output())
}

// TestServeShowsARedisThatNeverAnswered: with a Redis address nothing
// answers at, serve is ready (readiness never follows Redis by default) and
// grants degraded, but says so: limiter_redis_up 0 at once, and an ERROR
// naming the address within 5s of start.
func TestServeShowsARedisThatNeverAnswered(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		addr string
	}{
		{"nothing listens", testenv.FreeAddr(t)},
		{"a black hole", testenv.BlackHole(t)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			proc := servetest.Start(t, servetest.Options{Config: serveConfig([]string{tc.addr}, "e2e-health:", "    - plan: free\n      maxConcurrentStreams: 1\n")})
			redisUp(t, proc, 0, 0)
			if status, res := acquire(t, proc.API, "health-"+randomID(), "free"); status != http.StatusOK || !res.Degraded {
				t.Errorf("acquire: %d %+v, want 200 degraded", status, res)
			}
			proc.AwaitLog(notAnswered, 10*time.Second)
			line := ""
			for _, l := range strings.Split(proc.Output(), "\n") {
				if strings.Contains(l, notAnswered) {
					line = l
				}
			}
			for _, want := range []string{tc.addr, "failureMode", "degraded"} {
				if !strings.Contains(line, want) {
					t.Errorf("ERROR line %s does not say %q", line, want)
				}
			}
			redisUp(t, proc, 0, 0)
		})
	}
}

func TestServeShowsARedisThatAnswers(t *testing.T) {
	t.Parallel()
	proc := servetest.Start(t, servetest.Options{Config: serveConfig([]string{testenv.Redis(t)}, "e2e-health:", "    - plan: free\n      maxConcurrentStreams: 1\n"), AwaitRedis: true})
	redisUp(t, proc, 1, 5*time.Second)
	time.Sleep(5500 * time.Millisecond) // past the 5s within which Redis must answer
	if strings.Contains(proc.Output(), notAnswered) {
		t.Errorf("serve logged %q with a Redis that answered:\n%s", notAnswered, proc.Output())
	}
}

// TestServeReadinessRequiringRedis: with redis.requiredForReadiness, /readyz
// is 503 until Redis first answers, then 200, and stays 200 through a later
// outage (it gates the start, it never follows Redis); for serve and for
// `limiter proxy` alike. Without it, serve is ready while Redis is
// unreachable (the test above).
func TestServeReadinessRequiringRedis(t *testing.T) {
	t.Parallel()
	for _, command := range []string{"serve", "proxy"} {
		t.Run(command, func(t *testing.T) {
			t.Parallel()
			proxy := testenv.StartProxy(t, testenv.Redis(t))
			proxy.BlackHole()
			config := serveConfig([]string{proxy.Addr()}, "e2e-health:", "    - plan: free\n      maxConcurrentStreams: 1\n")
			if command == "proxy" {
				config += "proxy:\n  upstream: \"http://127.0.0.1:1\"\n"
			}
			proc := servetest.Start(t, servetest.Options{
				Command:     command,
				Config:      config,
				Env:         []string{"LIMITER_REDIS_REQUIREDFORREADINESS=true"},
				NoWaitReady: true,
			})
			// Past the client's warm-up bound too (2s): then only the
			// setting holds readiness.
			for range 30 {
				if status, body := servetest.Get(proc.Ops + "/readyz"); status != http.StatusServiceUnavailable || !strings.Contains(body, "redis") {
					t.Fatalf("/readyz before Redis answered: %d %q, want 503 naming redis", status, body)
				}
				time.Sleep(100 * time.Millisecond)
			}

			proxy.Restore()
			ready := false
			for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				if status, _ := servetest.Get(proc.Ops + "/readyz"); status == http.StatusOK {
					ready = true
					break
				}
			}
			if !ready {
				t.Fatalf("/readyz not 200 within 15s of Redis answering\n%s", proc.Output())
			}
			redisUp(t, proc, 1, 5*time.Second)

			proxy.BlackHole()
			redisUp(t, proc, 0, 15*time.Second)
			if status, body := servetest.Get(proc.Ops + "/readyz"); status != http.StatusOK {
				t.Errorf("/readyz during a later outage: %d %q, want 200 (readiness never follows Redis once it answered)", status, body)
			}
		})
	}
}
