package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/client"
)

// TestRealPoolKeyHoldsAcrossHeartbeats: a lease that joined model=gpt-4o
// (cap 1) keeps its membership past the slot TTL by its heartbeats alone;
// another user's acquire of the key is ErrPoolLimitReached naming it, not
// ErrLimitReached; once the lease is released the key is free.
func TestRealPoolKeyHoldsAcrossHeartbeats(t *testing.T) {
	r := newReal(t)
	ctx := context.Background()
	c := newClient(t, r.url)
	gpt := client.WithPools(map[string]string{"model": "gpt-4o"})
	lease, err := c.Acquire(ctx, "pool-ana-"+time.Now().Format("150405.000"), "free", gpt)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * realTTL) // past the TTL: only heartbeats keep it
	_, err = c.Acquire(ctx, "pool-bo-"+time.Now().Format("150405.000"), "free", gpt)
	var e *client.Error
	if !errors.Is(err, client.ErrPoolLimitReached) || errors.Is(err, client.ErrLimitReached) || !errors.As(err, &e) ||
		e.Pool != "model" || e.Key != "gpt-4o" || e.Used != 1 || e.Limit != 1 || e.RetryAfter <= 0 {
		t.Fatalf("another user's acquire of the held pool key: %v (%+v); want ErrPoolLimitReached naming model=gpt-4o, 1 of 1", err, e)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	other, err := c.Acquire(ctx, "pool-cy-"+time.Now().Format("150405.000"), "free", gpt)
	if err != nil {
		t.Fatalf("acquire once the lease is released: %v", err)
	}
	_ = other.Release(ctx)
	if _, err := c.Acquire(ctx, "pool-di", "free", client.WithPools(map[string]string{"region": "eu"})); !errors.Is(err, client.ErrUnknownPool) {
		t.Errorf("an unknown pool: %v, want ErrUnknownPool", err)
	}
}
