package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/redis/rueidis"
)

// waitTiers are the wait tests' plans: one slot per user, waits of up to
// 30s (solo) or 1s (capped), and one slot that is never waited for
// (nowait). Slots outlive every test without a heartbeat.
const waitTiers = `    - plan: solo
      maxConcurrentStreams: 1
      slotTTL: 60s
      heartbeatInterval: 20s
      maxWait: 30s
    - plan: capped
      maxConcurrentStreams: 1
      slotTTL: 60s
      heartbeatInterval: 20s
      maxWait: 1s
    - plan: nowait
      maxConcurrentStreams: 1
      slotTTL: 60s
      heartbeatInterval: 20s
`

// waitClient has room for waits of a minute, which httpClient's 10s
// would cut.
var waitClient = &http.Client{Timeout: 70 * time.Second}

// answer is the outcome of one HTTP call made off the test's goroutine.
type answer struct {
	status int
	header http.Header
	body   []byte
	err    error
	at     time.Time // when the answer arrived
}

// acquireAnswer decodes a 200 acquire.
func (a answer) granted(t *testing.T) httpapi.AcquireResponse {
	t.Helper()
	var out httpapi.AcquireResponse
	if a.err != nil || a.status != http.StatusOK {
		t.Fatalf("acquire: got %d %s (%v), want 200", a.status, a.body, a.err)
	}
	if err := json.Unmarshal(a.body, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// post sends body as JSON to url with ctx and returns the answer; it
// does not fail any test, so it may run in a goroutine of its own.
func post(ctx context.Context, url string, body any) answer {
	return postAs(ctx, "", url, body)
}

// postAs is post by the caller of token ("": none).
func postAs(ctx context.Context, token, url string, body any) answer {
	data, err := json.Marshal(body)
	if err != nil {
		return answer{err: err}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(data))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := waitClient.Do(req)
	if err != nil {
		return answer{err: err, at: time.Now()}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, body: b, err: err, at: time.Now()}
}

// waitingAcquire sends a waiting acquire of stream for user to server, and
// returns where its answer arrives.
func waitingAcquire(ctx context.Context, server, user, plan, stream string, waitMs int64) <-chan answer {
	return waitingAcquireAs(ctx, "", server, user, plan, stream, waitMs)
}

// waitingAcquireAs is waitingAcquire by the caller of token.
func waitingAcquireAs(ctx context.Context, token, server, user, plan, stream string, waitMs int64) <-chan answer {
	out := make(chan answer, 1)
	go func() {
		out <- postAs(ctx, token, server+httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: plan, StreamID: stream, WaitMs: waitMs})
	}()
	return out
}

// queueReader reads users' queues from Redis itself, as the limiter keeps
// them.
type queueReader struct {
	c      rueidis.Client
	schema keys.Schema
}

func newQueueReader(t *testing.T, addrs []string, prefix string) *queueReader {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &queueReader{c: c, schema: keys.Schema{Prefix: prefix}}
}

// queue returns user's tickets, first served first.
func (r *queueReader) queue(ctx context.Context, user string) ([]string, error) {
	key, err := r.schema.UserKey(user)
	if err != nil {
		return nil, err
	}
	return r.c.Do(ctx, r.c.B().Zrange().Key(keys.Queue(key)).Min("0").Max("-1").Build()).AsStrSlice()
}

// await waits up to within until user's queue satisfies ok.
func (r *queueReader) await(t *testing.T, user string, within time.Duration, what string, ok func([]string) bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		q, err := r.queue(context.Background(), user)
		if err == nil && ok(q) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue of %s: want %s within %v, got %v (%v)", user, what, within, q, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// percentile returns the p-th percentile (0-100) of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p / 100 * float64(len(s)-1))
	return s[i]
}

// commandCalls sums the calls of every command in INFO commandstats over
// the masters among addrs (replicas apply the same writes again), and
// those of EVALSHA and EVAL alone: the scripts.
func commandCalls(t *testing.T, addrs []string) (total, scripts int64) {
	t.Helper()
	for _, addr := range addrs {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		role, err := c.Do(ctx, c.B().Info().Section("replication").Build()).ToString()
		if err == nil && !bytes.Contains([]byte(role), []byte("role:master")) {
			cancel()
			c.Close()
			continue
		}
		stats, err := c.Do(ctx, c.B().Info().Section("commandstats").Build()).ToString()
		cancel()
		c.Close()
		if err != nil {
			t.Fatalf("INFO commandstats on %s: %v", addr, err)
		}
		for _, line := range bytes.Split([]byte(stats), []byte("\n")) {
			var name string
			var calls int64
			// cmdstat_zadd:calls=1,usec=13,...
			colon := bytes.IndexByte(line, ':')
			if !bytes.HasPrefix(line, []byte("cmdstat_")) || colon < 0 {
				continue
			}
			name = string(line[len("cmdstat_"):colon])
			if _, err := fmt.Sscanf(string(line[colon+1:]), "calls=%d", &calls); err != nil {
				continue
			}
			total += calls
			if name == "evalsha" || name == "eval" {
				scripts += calls
			}
		}
	}
	return total, scripts
}
