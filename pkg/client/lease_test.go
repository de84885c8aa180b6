package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/client"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/server"
	"github.com/joishi/limiter/pkg/tiers"
)

// shadowReal is pkg/server over a limiter on the shared test Redis whose
// plan watch (1 stream) and pool model (key big capped at 1) are in shadow
// mode, beside plan paid (3 streams) and pool org (key acme capped at 2),
// which enforce. While lose is above 0, an acquire runs and is answered
// 503 limiter_unavailable in its place (one fewer each time): a grant
// whose answer was lost.
type shadowReal struct {
	url  string
	lose atomic.Int32
}

func newShadowReal(t *testing.T) *shadowReal {
	t.Helper()
	off := false
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{
		pools.Pool{Pool: "model", Keys: map[string]int{"big": 1}, Enforce: &off}.WithDefaults(),
		pools.Pool{Pool: "org", Keys: map[string]int{"acme": 2}}.WithDefaults(),
	}); err != nil {
		t.Fatal(err)
	}
	lim := limitertest.New(t, limitertest.Options{
		Redis: cluster.Options{Logger: quiet},
		Tiers: []tiers.Tier{
			tiers.Tier{Plan: "watch", MaxConcurrentStreams: 1, SlotTTL: realTTL, HeartbeatInterval: realInterval, Enforce: &off}.WithDefaults(),
			tiers.Tier{Plan: "paid", MaxConcurrentStreams: 3, SlotTTL: realTTL, HeartbeatInterval: realInterval}.WithDefaults(),
		},
		Limiter: limiter.Options{Logger: quiet, Pools: table},
	}).Limiter
	s := &shadowReal{}
	api := server.New(lim, server.Options{Logger: quiet}).Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != httpapi.PathAcquire || s.lose.Add(-1) < 0 {
			api.ServeHTTP(w, r)
			return
		}
		lost := httptest.NewRecorder()
		api.ServeHTTP(lost, r)
		if lost.Code != http.StatusOK {
			t.Errorf("the acquire whose answer is to be lost: %d %s; want 200", lost.Code, lost.Body)
		}
		writeError(w, http.StatusServiceUnavailable, httpapi.Error{Code: httpapi.CodeUnavailable, Message: "the answer was lost"})
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

// leaseSaid is what a Lease says of its acquire's answer.
type leaseSaid struct {
	used, limit   int
	pools         []httpapi.PoolGrant
	wouldRefuse   string
	wouldRefuseBy *httpapi.PoolGrant
}

func saidBy(l *client.Lease) leaseSaid {
	s := leaseSaid{used: l.Used(), limit: l.Limit(), pools: l.Pools(), wouldRefuse: l.WouldRefuse()}
	if by, ok := l.WouldRefuseBy(); ok {
		s.wouldRefuseBy = &by
	}
	return s
}

func (s leaseSaid) equal(o leaseSaid) bool {
	return s.used == o.used && s.limit == o.limit && slices.Equal(s.pools, o.pools) && s.wouldRefuse == o.wouldRefuse &&
		(s.wouldRefuseBy == nil) == (o.wouldRefuseBy == nil) && (s.wouldRefuseBy == nil || *s.wouldRefuseBy == *o.wouldRefuseBy)
}

func (s leaseSaid) String() string {
	by := "none"
	if s.wouldRefuseBy != nil {
		by = fmt.Sprintf("%s=%s %d/%d", s.wouldRefuseBy.Pool, s.wouldRefuseBy.Key, s.wouldRefuseBy.Used, s.wouldRefuseBy.Limit)
	}
	return fmt.Sprintf("used %d of %d, pools %+v, would_refuse %q by %s", s.used, s.limit, s.pools, s.wouldRefuse, by)
}

// TestLeaseSaysWhatItsAcquireAnswered: a Lease carries its acquire's
// counts and pool keys, and says when a scope in shadow mode would have
// refused it: a shadow plan over its limit (stream_limit_reached) and a
// shadow pool key over its cap (pool_limit_reached, naming the key); a
// grant by scopes that enforce says nothing would have, and the enforced
// pool key does refuse once full.
func TestLeaseSaysWhatItsAcquireAnswered(t *testing.T) {
	r := newShadowReal(t)
	ctx := context.Background()
	c := newClient(t, r.url)
	suffix := time.Now().Format("150405.000000")
	both := client.WithPools(map[string]string{"model": "big", "org": "acme"})
	acquire := func(user, plan string, opts ...client.AcquireOption) *client.Lease {
		t.Helper()
		l, err := c.Acquire(ctx, user+suffix, plan, opts...)
		if err != nil {
			t.Fatalf("acquire of %s under %s: %v", user, plan, err)
		}
		return l
	}

	watchFirst := acquire("ana", "watch")
	watchOver := acquire("ana", "watch")
	paidFirst := acquire("bo", "paid", both)
	paidOver := acquire("cy", "paid", both)
	enforced := acquire("di", "paid")
	for _, tc := range []struct {
		name  string
		lease *client.Lease
		want  leaseSaid
	}{
		{"a shadow plan's first stream", watchFirst, leaseSaid{used: 1, limit: 1}},
		{"a shadow plan's stream over its limit", watchOver, leaseSaid{used: 2, limit: 1, wouldRefuse: httpapi.CodeStreamLimitReached}},
		{"the first of a shadow pool key and an enforced one", paidFirst, leaseSaid{used: 1, limit: 3,
			pools: []httpapi.PoolGrant{{Pool: "model", Key: "big", Used: 1, Limit: 1}, {Pool: "org", Key: "acme", Used: 1, Limit: 2}}}},
		{"a shadow pool key over its cap", paidOver, leaseSaid{used: 1, limit: 3,
			pools:       []httpapi.PoolGrant{{Pool: "model", Key: "big", Used: 2, Limit: 1}, {Pool: "org", Key: "acme", Used: 2, Limit: 2}},
			wouldRefuse: httpapi.CodePoolLimitReached, wouldRefuseBy: &httpapi.PoolGrant{Pool: "model", Key: "big", Used: 2, Limit: 1}}},
		{"a grant by an enforced plan", enforced, leaseSaid{used: 1, limit: 3}},
	} {
		if got := saidBy(tc.lease); !got.equal(tc.want) {
			t.Errorf("%s: the lease says %s; want %s", tc.name, got, tc.want)
		}
	}
	// The enforced key refuses once full; its refusal is no lease.
	if _, err := c.Acquire(ctx, "ed"+suffix, "paid", client.WithPools(map[string]string{"org": "acme"})); !errors.Is(err, client.ErrPoolLimitReached) {
		t.Errorf("a third stream of org=acme (capped at 2, enforced): %v; want ErrPoolLimitReached", err)
	}
}

// TestLeaseFollowsAnExtension: an Acquire of a held stream id (an
// extension) returns the held Lease with the extension's counts and pool
// keys; the extension answers no would_refuse (the limiter extends a held
// stream whatever the limits), so what the stream's first acquire said
// stands: over the limit for the second stream, not for the first.
func TestLeaseFollowsAnExtension(t *testing.T) {
	r := newShadowReal(t)
	ctx := context.Background()
	c := newClient(t, r.url)
	suffix := time.Now().Format("150405.000000")
	user := "fay" + suffix
	big := client.WithPools(map[string]string{"model": "big"})
	first, err := c.Acquire(ctx, user, "watch", client.WithStreamID("first"), big)
	if err != nil {
		t.Fatal(err)
	}
	second, err := c.Acquire(ctx, user, "watch", client.WithStreamID("second"), big)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(ctx, "gus"+suffix, "paid", big); err != nil { // big's third member
		t.Fatal(err)
	}
	bigOf := func(used int) []httpapi.PoolGrant {
		return []httpapi.PoolGrant{{Pool: "model", Key: "big", Used: used, Limit: 1}}
	}
	for _, tc := range []struct {
		name   string
		held   *client.Lease
		id     string
		want   leaseSaid
		before string // its WouldRefuse before the extension
	}{
		{"the first stream, under the limits when taken", first, "first",
			leaseSaid{used: 2, limit: 1, pools: bigOf(3)}, ""},
		{"the second stream, over both when taken", second, "second",
			leaseSaid{used: 2, limit: 1, pools: bigOf(3), wouldRefuse: httpapi.CodeStreamLimitReached}, httpapi.CodeStreamLimitReached},
	} {
		if got := tc.held.WouldRefuse(); got != tc.before {
			t.Errorf("%s, before its extension: would_refuse %q; want %q", tc.name, got, tc.before)
		}
		again, err := c.Acquire(ctx, user, "watch", client.WithStreamID(tc.id), big)
		if err != nil {
			t.Fatalf("%s: the extension: %v", tc.name, err)
		}
		if again != tc.held {
			t.Fatalf("%s: the extension returned another Lease; want the held one", tc.name)
		}
		if got := saidBy(again); !got.equal(tc.want) {
			t.Errorf("%s, after its extension: the lease says %s; want %s", tc.name, got, tc.want)
		}
	}
}

// TestLeaseOfARetriedAcquire: an acquire whose answer was lost (503 after
// the slot was taken) is retried under its stream id; the Lease says what
// the retry answered: the one slot and pool membership the stream holds,
// not two.
func TestLeaseOfARetriedAcquire(t *testing.T) {
	r := newShadowReal(t)
	ctx := context.Background()
	c := newClient(t, r.url)
	r.lose.Store(1)
	l, err := c.Acquire(ctx, "hal"+time.Now().Format("150405.000000"), "paid", client.WithPools(map[string]string{"org": "acme"}))
	if err != nil {
		t.Fatalf("an acquire whose first answer was lost: %v; want granted on the retry", err)
	}
	if left := r.lose.Load(); left >= 0 {
		t.Fatalf("no answer was lost (%d left to lose)", left)
	}
	want := leaseSaid{used: 1, limit: 3, pools: []httpapi.PoolGrant{{Pool: "org", Key: "acme", Used: 1, Limit: 2}}}
	if got := saidBy(l); !got.equal(want) {
		t.Errorf("the lease says %s; want %s", got, want)
	}
}

// TestLeaseOfARetriedShadowAcquire: an acquire that a scope in shadow
// mode let in over its limit, whose answer was lost, is retried under its
// stream id and answered as an extension; the Lease still says what the
// first answer said: the verdict on the acquire that took the stream.
func TestLeaseOfARetriedShadowAcquire(t *testing.T) {
	r := newShadowReal(t)
	ctx := context.Background()
	c := newClient(t, r.url)
	suffix := time.Now().Format("150405.000000")
	big := client.WithPools(map[string]string{"model": "big"})
	for _, tc := range []struct {
		name       string
		user, plan string
		opts       []client.AcquireOption
		want       leaseSaid
	}{
		{"over a shadow plan's limit", "ivy", "watch", nil,
			leaseSaid{used: 2, limit: 1, wouldRefuse: httpapi.CodeStreamLimitReached}},
		{"over a shadow pool key's cap", "jo", "paid", []client.AcquireOption{big},
			leaseSaid{used: 2, limit: 3, pools: []httpapi.PoolGrant{{Pool: "model", Key: "big", Used: 2, Limit: 1}},
				wouldRefuse: httpapi.CodePoolLimitReached, wouldRefuseBy: &httpapi.PoolGrant{Pool: "model", Key: "big", Used: 2, Limit: 1}}},
	} {
		user := tc.user + suffix
		// The stream before it: the user's first, big's first member.
		first, err := c.Acquire(ctx, user, tc.plan, tc.opts...)
		if err != nil {
			t.Fatalf("%s: the first stream: %v", tc.name, err)
		}
		r.lose.Store(1)
		l, err := c.Acquire(ctx, user, tc.plan, tc.opts...)
		if err != nil {
			t.Fatalf("%s: an acquire whose first answer was lost: %v; want granted on the retry", tc.name, err)
		}
		if left := r.lose.Load(); left >= 0 {
			t.Fatalf("%s: no answer was lost (%d left to lose)", tc.name, left)
		}
		if got := saidBy(l); !got.equal(tc.want) {
			t.Errorf("%s: the retried lease says %s; want %s", tc.name, got, tc.want)
		}
		for _, held := range []*client.Lease{first, l} {
			if err := held.Release(ctx); err != nil {
				t.Fatalf("%s: release: %v", tc.name, err)
			}
		}
	}
}
