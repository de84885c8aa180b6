package client_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/client"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/server"
	"github.com/joishi/limiter/pkg/tiers"
)

// TestABatchOfValidIDsFitsTheBody: a client heartbeats any leases of
// valid ids, however they encode: here a full batch (httpapi.MaxBatch) of
// 256-byte user ids of '<', '>', '&' and '"'. HTML-escaped, as
// encoding/json writes by default, each '<' took 6 bytes and the batch
// body grew past the server's 1 MiB: every batch was refused 400, retried
// each tick as if the limiter were down, and the slots expired while
// their leases never said Lost.
func TestABatchOfValidIDsFitsTheBody(t *testing.T) {
	const n = httpapi.MaxBatch
	const ttl = 2 * time.Second
	lim := limitertest.New(t, limitertest.Options{
		Redis:   cluster.Options{Logger: quiet},
		Tiers:   []tiers.Tier{{Plan: "one", MaxConcurrentStreams: 1, SlotTTL: ttl, HeartbeatInterval: 300 * time.Millisecond, FailureMode: tiers.FailClosed}},
		Limiter: limiter.Options{Logger: quiet},
	}).Limiter
	api := server.New(lim, server.Options{Logger: quiet}).Handler()
	var mu sync.Mutex
	statuses := map[int]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, status: 200}
		api.ServeHTTP(rec, r)
		if r.URL.Path == httpapi.PathHeartbeats {
			mu.Lock()
			statuses[rec.status]++
			mu.Unlock()
		}
	}))
	t.Cleanup(srv.Close)
	c, err := client.New(srv.URL, client.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t.Cleanup(func() { _ = c.Close(ctx) })
	leases := make([]*client.Lease, n)
	for i := range n {
		user := strings.Repeat(`<>&"`, 63) + fmt.Sprintf("%04d", i) // 256 bytes
		l, err := c.Acquire(ctx, user, "one")
		if err != nil {
			t.Fatalf("acquire %d: %v", i, err)
		}
		leases[i] = l
	}
	time.Sleep(ttl + time.Second)
	// A 503 is an outage the client retries (the limiter's Redis deadline,
	// on a loaded machine); a 4xx is a batch refused, as too large.
	mu.Lock()
	refused := 0
	for status, n := range statuses {
		if status >= 400 && status < 500 {
			refused += n
		}
	}
	if statuses[http.StatusOK] == 0 || refused > 0 {
		t.Errorf("heartbeat batches answered %v; want them 200, none refused", statuses)
	}
	mu.Unlock()
	// Each lease must either still hold its slot (heartbeated) or report
	// Lost: never a slot gone while its lease says it holds it.
	silent := 0
	for _, l := range leases {
		select {
		case <-l.Lost():
			continue
		default:
		}
		res, err := lim.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: l.UserID(), Plan: "one", StreamID: l.StreamID()})
		if err != nil || !res.Alive {
			silent++
		}
	}
	if silent > 0 {
		t.Errorf("%d of %d leases neither heartbeated nor lost: their slots expired in the limiter while the client still holds them", silent, n)
	}
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(s int) { r.status = s; r.ResponseWriter.WriteHeader(s) }
