package client_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/admin"
	"github.com/joishi/limiter/pkg/client"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/server"
)

// WithLabel's label reaches the slot's record; one the limiter refuses is
// ErrInvalid with code invalid_label, and takes no slot.
func TestWithLabelLabelsTheSlot(t *testing.T) {
	r := newReal(t)
	c := newClient(t, r.url)
	ctx := context.Background()
	l, err := c.Acquire(ctx, "labelled", "free", client.WithLabel("pod-7/gpt-4o"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	slots, err := r.lim.Slots(ctx, "labelled")
	if err != nil || len(slots.Slots) != 1 || slots.Slots[0].Label != "pod-7/gpt-4o" {
		t.Fatalf("slots: got %+v, %v; want one slot labelled pod-7/gpt-4o", slots, err)
	}
	_, err = c.Acquire(ctx, "labelled-badly", "free", client.WithLabel(strings.Repeat("l", httpapi.MaxLabelBytes+1)))
	var e *client.Error
	if !errors.Is(err, client.ErrInvalid) || !errors.As(err, &e) || e.Code != httpapi.CodeInvalidLabel || !strings.Contains(e.Message, "the limit is 128") {
		t.Fatalf("a 129-byte label: got %v, want ErrInvalid with code invalid_label naming the limit", err)
	}
	if n := r.used(t, "labelled-badly"); n != 0 {
		t.Errorf("slots after the refused acquire: %d, want 0", n)
	}
}

// Admin.SetOverride and RemoveOverride reach the admin API: the override
// judges the user's next acquire through Client, and a duration that is
// not whole seconds is refused before any call.
func TestAdminOverrideThroughTheClient(t *testing.T) {
	r := newReal(t)
	a := newRealAdmin(t, r)
	c := newClient(t, r.url)
	ctx := context.Background()

	if _, err := a.SetOverride(ctx, "boosted", 2, 1500*time.Millisecond, "r"); err == nil || !strings.Contains(err.Error(), "whole seconds") {
		t.Fatalf("SetOverride for 1.5s: got %v, want a refusal of the fraction", err)
	}
	set, err := a.SetOverride(ctx, "boosted", 2, time.Hour, "ticket 3")
	if err != nil || set.Override.MaxConcurrentStreams != 2 || set.Override.Actor != "ola" || set.AuditID == "" {
		t.Fatalf("SetOverride: got %+v, %v; want 2 streams by ola, audited", set, err)
	}
	for range 2 {
		l, err := c.Acquire(ctx, "boosted", "free")
		if err != nil {
			t.Fatalf("acquire on plan free (1) under an override of 2: %v", err)
		}
		defer l.Release(ctx)
	}
	if _, err := c.Acquire(ctx, "boosted", "free"); !client.IsLimited(err) {
		t.Fatalf("3rd acquire: got %v, want stream_limit_reached", err)
	}
	if _, err := a.SetOverride(ctx, "boosted", 1001, time.Hour, "r"); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("SetOverride of 1001 streams: got %v, want ErrInvalid", err)
	}
	removed, err := a.RemoveOverride(ctx, "boosted", "ticket 3 closed")
	if err != nil || !removed.Removed {
		t.Fatalf("RemoveOverride: got %+v, %v; want removed", removed, err)
	}
	slots, err := a.Slots(ctx, "boosted")
	if err != nil || slots.Override != nil || slots.Used != 2 {
		t.Fatalf("Slots after the removal: got %+v, %v; want the 2 slots held and no override", slots, err)
	}
}

// newRealAdmin serves r's admin API (an operator's token) and returns an
// Admin of it.
func newRealAdmin(t *testing.T, r *realLimiter) *client.Admin {
	t.Helper()
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("ola operator "+operatorToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	routes, err := admin.New(r.lim, admin.Options{TokensFile: tokens, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(server.New(r.lim, server.Options{Logger: quiet, Admin: routes}).AdminHandler())
	t.Cleanup(srv.Close)
	a, err := client.NewAdmin(srv.URL, operatorToken)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Admin.PoolKey, SetPoolOverride and RemovePoolOverride reach the admin
// API: the key's holder is listed with its user, the override judges the
// next stream that joins the key through Client, and refusals are the
// errors their codes say.
func TestAdminPoolOverrideThroughTheClient(t *testing.T) {
	r := newReal(t)
	a := newRealAdmin(t, r)
	c := newClient(t, r.url)
	ctx := context.Background()
	gpt := client.WithPools(map[string]string{"model": "gpt-4o"})

	held, err := c.Acquire(ctx, "pool-ana", "free", gpt, client.WithLabel("pod-7"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	shown, err := a.PoolKey(ctx, "model", "gpt-4o")
	if err != nil || shown.Used != 1 || shown.Limit == nil || *shown.Limit != 1 || len(shown.Holders) != 1 ||
		shown.Holders[0].UserID != "pool-ana" || shown.Holders[0].StreamID != held.StreamID() || shown.Holders[0].Label != "pod-7" {
		t.Fatalf("PoolKey: got %+v, %v; want pool-ana's stream %s alone, labelled pod-7, cap 1", shown, err, held.StreamID())
	}
	if _, err := c.Acquire(ctx, "pool-bo", "free", gpt); !errors.Is(err, client.ErrPoolLimitReached) {
		t.Fatalf("a 2nd stream of model=gpt-4o (cap 1): got %v, want ErrPoolLimitReached", err)
	}
	set, err := a.SetPoolOverride(ctx, "model", "gpt-4o", 2, time.Hour, "ticket 6")
	if err != nil || set.Pool != "model" || set.Key != "gpt-4o" || set.Override.MaxConcurrentStreams != 2 || set.Override.Actor != "ola" || set.AuditID == "" {
		t.Fatalf("SetPoolOverride: got %+v, %v; want 2 streams on model=gpt-4o by ola, audited", set, err)
	}
	second, err := c.Acquire(ctx, "pool-bo", "free", gpt)
	if err != nil {
		t.Fatalf("a 2nd stream under the override of 2: %v", err)
	}
	defer second.Release(ctx)
	removed, err := a.RemovePoolOverride(ctx, "model", "gpt-4o", "ticket 6 closed")
	if err != nil || !removed.Removed {
		t.Fatalf("RemovePoolOverride: got %+v, %v; want removed", removed, err)
	}

	var e *client.Error
	if _, err := a.PoolKey(ctx, "region", "eu"); !errors.Is(err, client.ErrUnknownPool) || !errors.As(err, &e) || e.Code != httpapi.CodeUnknownPool {
		t.Errorf("PoolKey of a pool not configured: got %v, want ErrUnknownPool", err)
	}
	if _, err := a.PoolKey(ctx, "model", strings.Repeat("k", 129)); !errors.Is(err, client.ErrInvalid) || !errors.As(err, &e) || e.Code != httpapi.CodeInvalidPoolKey {
		t.Errorf("PoolKey of a 129-byte key: got %v, want ErrInvalid with code invalid_pool_key", err)
	}
	if _, err := a.SetPoolOverride(ctx, "model", "gpt-4o", 2, 1500*time.Millisecond, "r"); err == nil || !strings.Contains(err.Error(), "whole seconds") {
		t.Errorf("SetPoolOverride for 1.5s: got %v, want a refusal of the fraction", err)
	}
}
