package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/linearize"
	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/httpapi"
)

// TestPoolCapIsLinearizable: 30 users, each one stream at a time (their
// own limit of 3 never refuses), race for model=gpt-4o (cap 5) through
// three serve processes on the Redis Cluster. The pool key's history of
// acquires and releases is linearizable against "at most 5 live
// memberships" (internal/linearize, one partition: the key); the same
// history with one refusal turned into a grant is not.
func TestPoolCapIsLinearizable(t *testing.T) {
	const (
		users   = 30
		poolCap = 5
		run     = 4 * time.Second
		ttl     = 2 * time.Second // incidentTiers' paid plan
	)
	prefix := "e2e-pools-lin-" + randomID() + ":"
	config := serveConfig(testenv.Cluster(t), prefix, incidentTiers) + fmt.Sprintf(`pools:
  static:
    - pool: model
      keys: {gpt-4o: %d}
`, poolCap)
	servers := make([]*servetest.Process, 3)
	for i := range servers {
		servers[i] = servetest.Start(t, servetest.Options{Config: config, AwaitRedis: true})
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	post := func(url, body string) (int, []byte, error) {
		resp, err := hc.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		return resp.StatusCode, data, err
	}

	const scope = "model=gpt-4o"
	var mu sync.Mutex
	var history []linearize.Op
	var granted, refused, degraded, other int
	record := func(op linearize.Op) {
		mu.Lock()
		history = append(history, op)
		mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), run)
	defer cancel()
	// At most inFlight calls at once: what porcupine searches grows with
	// the calls that overlap, and 30 at once would not be decided in time.
	const inFlight = 6
	slots := make(chan struct{}, inFlight)
	post0 := post
	post = func(url, body string) (int, []byte, error) {
		slots <- struct{}{}
		defer func() { <-slots }()
		return post0(url, body)
	}
	var wg sync.WaitGroup
	for u := range users {
		user := fmt.Sprintf("lin-%s-%d", randomID(), u)
		srv := servers[u%len(servers)]
		wg.Go(func() {
			for n := 0; ctx.Err() == nil; n++ {
				stream := fmt.Sprintf("s%d", n)
				member := stream + "@" + user // one member of the key per user and stream
				// The plan's 2s TTL: a hold is meant to end well within it,
				// but on a loaded machine a release may wait its turn (of
				// inFlight) past it, and the membership then expires, as it
				// should; the model lets it only then.
				op := linearize.Op{User: scope, Limit: poolCap, TTL: int64(ttl), Kind: linearize.Acquire, Stream: member}
				op.Call = time.Now().UnixNano()
				status, data, err := post(srv.API+"/v1/slots/acquire",
					fmt.Sprintf(`{"user_id":%q,"plan":"paid","stream_id":%q,"pools":{"model":"gpt-4o"}}`, user, stream))
				op.Return = time.Now().UnixNano()
				var e httpapi.ErrorResponse
				_ = json.Unmarshal(data, &e)
				var g httpapi.AcquireResponse
				_ = json.Unmarshal(data, &g)
				switch {
				case err == nil && status == http.StatusOK && g.Degraded:
					// Granted by the plan's failure mode when Redis did not
					// answer in time (a loaded machine): whether the scripts
					// ran is not known, so neither is the membership.
					op.Result = linearize.Unknown
				case err == nil && status == http.StatusOK:
					op.Result = linearize.Yes
				case err == nil && status == http.StatusTooManyRequests && e.Error.Code == httpapi.CodePoolLimitReached:
					op.Result = linearize.No
				default:
					op.Result = linearize.Unknown
				}
				record(op)
				mu.Lock()
				switch {
				case op.Result == linearize.Yes:
					granted++
				case op.Result == linearize.No:
					refused++
				case g.Degraded:
					degraded++
				default:
					other++
				}
				mu.Unlock()
				if op.Result != linearize.Yes {
					// Back off as a client told Retry-After would, briefly:
					// the history stays small enough to search.
					time.Sleep(time.Duration(80+rand.IntN(120)) * time.Millisecond)
					continue
				}
				time.Sleep(time.Duration(20+rand.IntN(200)) * time.Millisecond)
				rel := linearize.Op{User: scope, Limit: poolCap, TTL: op.TTL, Kind: linearize.Release, Stream: member}
				rel.Call = time.Now().UnixNano()
				status, data, err = post(srv.API+"/v1/slots/release", fmt.Sprintf(`{"user_id":%q,"stream_id":%q}`, user, stream))
				rel.Return = time.Now().UnixNano()
				var r httpapi.ReleaseResponse
				switch {
				case err == nil && status == http.StatusOK && json.Unmarshal(data, &r) == nil && r.Released:
					rel.Result = linearize.Yes
				case err == nil && status == http.StatusOK:
					rel.Result = linearize.No
				default:
					rel.Result = linearize.Unknown
				}
				record(rel)
			}
		})
	}
	wg.Wait()
	t.Logf("%d users on 3 processes for %v: %d grants, %d pool refusals, %d degraded grants, %d other answers", users, run, granted, refused, degraded, other)
	if granted < 20 || refused < 20 {
		t.Fatalf("%d grants and %d refusals: too little contention to check anything", granted, refused)
	}
	if other > 0 {
		t.Errorf("%d calls answered neither a grant nor a pool refusal", other)
	}
	if v := linearize.Check(history, linearize.Options{}); !v.OK() {
		t.Errorf("the pool key's history is not linearizable: illegal %v, undecided %v", v.Illegal, v.Undecided)
	}
	// The checker is not vacuous: at the first moment the key certainly
	// holds its cap, one more grant makes the history up to then illegal.
	injected := overAdmitted(history, poolCap)
	if injected == nil {
		t.Fatal("the key never certainly held its cap: nothing to inject")
	}
	if v := linearize.Check(injected, linearize.Options{}); len(v.Illegal) == 0 {
		t.Errorf("with one grant past the cap the history still checks (undecided %v): the checker sees nothing", v.Undecided)
	}
}

// overAdmitted returns the grants of history certainly held (answered,
// not yet released) at the first moment they were cap, and one more grant
// at that moment; nil when there is no such moment.
func overAdmitted(history []linearize.Op, cap int) []linearize.Op {
	released := map[string]int64{}
	for _, op := range history {
		if op.Kind == linearize.Release {
			released[op.Stream] = op.Call
		}
	}
	for _, at := range history {
		if at.Kind != linearize.Acquire || at.Result != linearize.Yes {
			continue
		}
		t := at.Return + 1
		held := 0
		for _, op := range history {
			if op.Kind == linearize.Acquire && op.Result == linearize.Yes && op.Return < t {
				if rel, ok := released[op.Stream]; !ok || rel > t {
					held++
				}
			}
		}
		if held < cap {
			continue
		}
		// The grants certainly held at t, and one more: a history small
		// enough to be refused at once.
		var out []linearize.Op
		for _, op := range history {
			if op.Kind == linearize.Acquire && op.Result == linearize.Yes && op.Return < t {
				if rel, ok := released[op.Stream]; !ok || rel > t {
					out = append(out, op)
				}
			}
		}
		extra := at
		extra.Stream, extra.Call, extra.Return = "injected@nobody", t, t+1
		return append(out, extra)
	}
	return nil
}
