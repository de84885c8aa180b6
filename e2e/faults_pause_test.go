package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/client"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/redis/rueidis"
)

// The pause tests' short-TTL tiers: a pause of pauseTTL+1s outlives every
// slot, and a holder learns of it at its next heartbeat.
const (
	pauseTTL      = 3 * time.Second
	pauseInterval = time.Second
	pauseFor      = pauseTTL + time.Second
	// learnSlack is allowed beyond one heartbeat interval for a holder to
	// be told slot_lost: the request itself, a loaded machine, -race.
	learnSlack = time.Second
)

// heldStream is a stream held over raw HTTP, heartbeated every interval
// (each request bounded by the interval) until the limiter answers
// slot_lost or the test ends.
type heldStream struct {
	user, plan, stream string
	lost               chan time.Time // receives when the 410 arrived
}

// holdStreams acquires n streams for user on server and heartbeats each in
// the background until the test ends.
func holdStreams(t *testing.T, server, user, plan string, n int) []*heldStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	var out []*heldStream
	for i := range n {
		h := &heldStream{user: user, plan: plan, stream: fmt.Sprintf("held-%d", i), lost: make(chan time.Time, 1)}
		status, _, body := call(t, httpClient, "POST", server+httpapi.PathAcquire,
			httpapi.AcquireRequest{UserID: user, Plan: plan, StreamID: h.stream}, nil)
		if status != http.StatusOK || !strings.Contains(string(body), `"granted":true`) || strings.Contains(string(body), `"degraded":true`) {
			t.Fatalf("acquire %s/%s: %d %s, want granted from Redis", user, h.stream, status, body)
		}
		out = append(out, h)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for sleepCtx(ctx, pauseInterval) {
				if heartbeat(ctx, server, h) == http.StatusGone {
					h.lost <- time.Now()
					return
				}
			}
		}()
	}
	return out
}

// heartbeat sends one heartbeat bounded by the interval; 0 if unanswered.
func heartbeat(ctx context.Context, server string, h *heldStream) int {
	ctx, cancel := context.WithTimeout(ctx, pauseInterval)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, server+httpapi.PathHeartbeat,
		strings.NewReader(fmt.Sprintf(`{"user_id":%q,"plan":%q,"stream_id":%q}`, h.user, h.plan, h.stream)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// awaitLost waits for every stream to be told slot_lost and returns the
// longest time after since; it fails the test past since+interval+slack.
func awaitLost(t *testing.T, streams []*heldStream, since time.Time) time.Duration {
	t.Helper()
	deadline := since.Add(pauseInterval + learnSlack)
	var worst time.Duration
	for _, h := range streams {
		select {
		case at := <-h.lost:
			worst = max(worst, at.Sub(since))
		case <-time.After(time.Until(deadline) + 2*time.Second):
			t.Errorf("%s of %s: not told slot_lost within %v", h.stream, h.user, time.Since(since).Round(time.Millisecond))
			continue
		}
	}
	if worst > pauseInterval+learnSlack {
		t.Errorf("a holder was told slot_lost %v after the fault ended, want within one heartbeat interval (%v) + %v",
			worst.Round(time.Millisecond), pauseInterval, learnSlack)
	}
	return worst
}

// acquireUntilGranted acquires for user on server until n grants counted
// in Redis (not degraded) are held at once, fails the test if that takes
// longer than within, releases them and returns how long it took.
func acquireUntilGranted(t *testing.T, server, user, plan string, n int, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var granted []string
	defer func() {
		for _, stream := range granted {
			call(t, httpClient, "POST", server+httpapi.PathRelease, httpapi.ReleaseRequest{UserID: user, StreamID: stream}, nil)
		}
	}()
	for len(granted) < n {
		status, res := acquire(t, server, user, plan)
		if status == http.StatusOK && !res.Degraded {
			granted = append(granted, res.StreamID)
			continue
		}
		if time.Since(start) > within {
			t.Fatalf("%s: %d of %d streams granted %v after asking (last: %d %+v), want within %v",
				user, len(granted), n, time.Since(start).Round(time.Millisecond), status, res, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

func pauseConfig(redis []string, run string) string {
	return serveConfig(redis, "e2e-"+run+":", faultTiers(pauseTTL, pauseInterval))
}

// TestFaultPausesLongerThanTheTTL proves P1 and P3 and bounds the P2 window
// of holders paused longer than the TTL (slotTTL 3s, heartbeats every 1s):
// a limiter process or an application process SIGSTOPped for 4s, and a
// Redis that loses every slot (FLUSHALL, a restart without persistence)
// while streams are held. In each, the user may stream again by one TTL
// after the last heartbeat at the latest (at once when Redis lost the
// slots), and each holder is told 410 slot_lost within one heartbeat
// interval (+1s) of the process resuming or Redis answering again.
func TestFaultPausesLongerThanTheTTL(t *testing.T) {
	t.Run("limiter process stopped", func(t *testing.T) {
		t.Parallel()
		run := randomID()
		servers := startServers(t, 2, pauseConfig([]string{testenv.Redis(t)}, run))
		paused, other := servers[0], servers[1]
		user := "pause-serve-" + run
		streams := holdStreams(t, paused.API, user, "trio", 3)
		time.Sleep(1500 * time.Millisecond) // heartbeats flow

		if err := paused.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		resume := sync.OnceFunc(func() { _ = paused.Signal(syscall.SIGCONT) })
		t.Cleanup(resume)
		free := acquireUntilGranted(t, other.API, user, "trio", 3, pauseTTL+learnSlack)
		time.Sleep(time.Until(stopped.Add(pauseFor)))
		resume()
		resumed := time.Now()
		learned := awaitLost(t, streams, resumed)
		again := acquireUntilGranted(t, paused.API, user, "trio", 3, learnSlack)
		t.Logf("limiter stopped %v: the user's 3 slots free through another replica %v after the stop (TTL %v); "+
			"holders told slot_lost within %v of SIGCONT; 3 streams granted through the resumed replica in %v",
			pauseFor, free.Round(time.Millisecond), pauseTTL, learned.Round(time.Millisecond), again.Round(time.Millisecond))
	})

	t.Run("application process stopped", func(t *testing.T) {
		t.Parallel()
		run := randomID()
		server := startServers(t, 1, pauseConfig([]string{testenv.Redis(t)}, run))[0]
		user := "pause-app-" + run
		app, n := startChild(t, "holders", "E2E_SERVERS="+server.API, "E2E_USER="+user, "E2E_PLAN=trio", "E2E_STREAMS=3")
		if n != 3 {
			t.Fatalf("the application holds %d streams, want 3", n)
		}
		time.Sleep(1500 * time.Millisecond)

		if err := app.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		resume := sync.OnceFunc(func() { _ = app.cmd.Process.Signal(syscall.SIGCONT) })
		t.Cleanup(resume)
		// P1 and P3: the frozen holder's slots are gone one TTL after its
		// last heartbeat; another holder of the user gets them.
		var taken []string
		for len(taken) < 3 {
			status, res := acquire(t, server.API, user, "trio")
			if status == http.StatusOK && !res.Degraded {
				taken = append(taken, res.StreamID)
				continue
			}
			if time.Since(stopped) > pauseTTL+learnSlack {
				t.Fatalf("%d of 3 streams granted %v after the application froze, want all within TTL+%v", len(taken), time.Since(stopped), learnSlack)
			}
			time.Sleep(20 * time.Millisecond)
		}
		free := time.Since(stopped)
		time.Sleep(time.Until(stopped.Add(pauseFor)))
		resume()
		resumed := time.Now()

		var worst time.Duration
		for lost := 0; lost < 3; {
			select {
			case line := <-app.lines:
				var stream, code string
				var atMs int64
				if _, err := fmt.Sscanf(line, "LOST %s %d %s", &stream, &atMs, &code); err != nil {
					t.Logf("application: %s", line)
					continue
				}
				lost++
				if code != httpapi.CodeSlotLost {
					t.Errorf("lease %s lost with %s, want %s", stream, code, httpapi.CodeSlotLost)
				}
				worst = max(worst, time.UnixMilli(atMs).Sub(resumed))
			case <-time.After(pauseInterval + learnSlack + 2*time.Second):
				t.Fatalf("%d of 3 leases lost %v after SIGCONT; want all within %v", lost, time.Since(resumed), pauseInterval+learnSlack)
			}
		}
		if worst > pauseInterval+learnSlack {
			t.Errorf("the application learned of its lost leases %v after SIGCONT, want within %v", worst, pauseInterval+learnSlack)
		}
		overlap := resumed.Add(worst).Sub(stopped.Add(free))
		t.Logf("application stopped %v: its 3 slots granted to another holder %v after the stop (TTL %v); "+
			"the application's leases lost (slot_lost) within %v of SIGCONT: the user held 6 streams for %v",
			pauseFor, free.Round(time.Millisecond), pauseTTL, worst.Round(time.Millisecond), overlap.Round(time.Millisecond))
	})

	t.Run("FLUSHALL", func(t *testing.T) {
		t.Parallel()
		redis := testenv.StartRedis(t)
		run := randomID()
		server := startServers(t, 1, pauseConfig([]string{redis.Addr()}, run))[0]
		user := "flush-" + run
		streams := append(holdStreams(t, server.API, user, "trio", 3), holdStreams(t, server.API, user+"-closed", "duo", 2)...)
		time.Sleep(1500 * time.Millisecond)

		rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{redis.Addr()}, ForceSingleClient: true, DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		if err := rc.Do(context.Background(), rc.B().Flushall().Build()).Error(); err != nil {
			t.Fatal(err)
		}
		flushed := time.Now()
		again := acquireUntilGranted(t, server.API, user, "trio", 3, learnSlack)
		learned := awaitLost(t, streams, flushed)
		t.Logf("FLUSHALL under 5 held streams: 3 streams granted again %v after it; holders told slot_lost within %v",
			again.Round(time.Millisecond), learned.Round(time.Millisecond))
	})

	t.Run("Redis restarted without persistence", func(t *testing.T) {
		t.Parallel()
		redis := testenv.StartRedis(t)
		run := randomID()
		server := servetest.Start(t, servetest.Options{Config: pauseConfig([]string{redis.Addr()}, run), AwaitRedis: true})
		user := "restart-" + run
		streams := append(holdStreams(t, server.API, user, "trio", 3), holdStreams(t, server.API, user+"-closed", "duo", 2)...)
		time.Sleep(1500 * time.Millisecond)

		redis.Stop()
		time.Sleep(2 * time.Second) // heartbeats answer degraded (trio) or 503 (duo)
		redis.Start()
		answering := time.Now()
		again := acquireUntilGranted(t, server.API, user, "trio", 3, learnSlack)
		learned := awaitLost(t, streams, answering)
		t.Logf("Redis down 2s and restarted empty under 5 held streams: 3 streams granted again %v after it answered; holders told slot_lost within %v",
			again.Round(time.Millisecond), learned.Round(time.Millisecond))
	})
}

// runHolders is the "holders" child: E2E_STREAMS leases of E2E_USER on
// plan E2E_PLAN through the first of E2E_SERVERS with pkg/client, then one
// line "LOST <stream id> <unix ms> <code>" per lease the client loses.
func runHolders(ctx context.Context) error {
	c, err := client.New(strings.Split(os.Getenv("E2E_SERVERS"), ",")[0], client.WithRequestTimeout(pauseInterval))
	if err != nil {
		return err
	}
	n := envInt("E2E_STREAMS")
	for i := range n {
		l, err := c.Acquire(ctx, os.Getenv("E2E_USER"), os.Getenv("E2E_PLAN"))
		if err != nil {
			return fmt.Errorf("acquire %d: %w", i, err)
		}
		go func() {
			<-l.Lost()
			code := "unknown"
			if e := (*client.Error)(nil); errors.As(l.Err(), &e) {
				code = e.Code
			}
			fmt.Printf("LOST %s %d %s\n", l.StreamID(), time.Now().UnixMilli(), code)
		}()
	}
	fmt.Printf("READY %d\n", n)
	select {}
}
