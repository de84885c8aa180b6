package limitertest

import (
	"context"
	"strings"
	"testing"

	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/tiers"
)

func TestNewGivesEachStackItsOwnPrefix(t *testing.T) {
	a, b := New(t, Options{Backend: Embedded}), New(t, Options{Backend: Embedded})
	for _, s := range []*Stack{a, b} {
		if !strings.HasPrefix(s.Keys.Prefix, "limitertest:") || !strings.HasSuffix(s.Keys.Prefix, ":") {
			t.Errorf("prefix: got %q, want limitertest:<random>:", s.Keys.Prefix)
		}
	}
	if a.Keys.Prefix == b.Keys.Prefix {
		t.Errorf("prefixes: got %q twice, want one per stack", a.Keys.Prefix)
	}
}

func TestNewServesTheTestTiers(t *testing.T) {
	s := New(t, Options{Backend: Embedded})
	if got, want := s.Table.Len(), len(Tiers()); got != want {
		t.Errorf("table: got %d tiers, want %d", got, want)
	}
	res, err := s.Limiter.Acquire(context.Background(), limiter.AcquireRequest{UserID: "u", Plan: "one"})
	if err != nil || !res.Granted || res.Degraded || res.Limit != 1 {
		t.Errorf("Acquire on plan one: got %+v, %v, want granted with limit 1, not degraded", res, err)
	}
}

func TestNewHandsTheTableToNewObserver(t *testing.T) {
	var got *tiers.Table
	s := New(t, Options{Backend: Embedded, NewObserver: func(table *tiers.Table) (limiter.Observer, error) {
		got = table
		return nil, nil
	}})
	if got != s.Table {
		t.Errorf("NewObserver: got table %p, want the stack's %p", got, s.Table)
	}
}

func TestNewWithoutWaitDoesNotTouchRedis(t *testing.T) {
	s := New(t, Options{Redis: cluster.Options{Addrs: []string{testenv.FreeAddr(t)}}, NoWait: true})
	if _, err := s.Redis.Redis(); err == nil {
		t.Errorf("Redis(): got a client, want ErrNotConnected (nothing listens there)")
	}
}
