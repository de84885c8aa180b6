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
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("ola operator "+operatorToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	admin, err := server.NewAdmin(r.lim, server.AdminOptions{TokensFile: tokens, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(server.New(r.lim, server.Options{Logger: quiet, Admin: admin}).AdminHandler())
	t.Cleanup(srv.Close)
	a, err := client.NewAdmin(srv.URL, operatorToken)
	if err != nil {
		t.Fatal(err)
	}
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
