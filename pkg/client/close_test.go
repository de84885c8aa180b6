package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/client"
)

func TestCloseReleasesEveryLease(t *testing.T) {
	f := newFake(t)
	baseline := runtime.NumGoroutine()
	c, err := client.New(f.URL(), client.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var leases []*client.Lease
	for i := range 20 {
		l, err := c.Acquire(ctx, fmt.Sprintf("u%d", i%5), "bulk")
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	f.waitBatches(1, 2*time.Second)
	if err := c.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for i := range 5 {
		if got := f.used(fmt.Sprintf("u%d", i)); got != 0 {
			t.Errorf("u%d: got used %d after Close, want 0", i, got)
		}
	}
	for _, l := range leases {
		select {
		case <-l.Lost():
			if !errors.Is(l.Err(), client.ErrClosed) {
				t.Errorf("got Err %v, want ErrClosed", l.Err())
			}
		default:
			t.Error("Lost open after Close, want closed")
		}
	}
	if _, err := c.Acquire(ctx, "u1", "bulk"); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Acquire after Close: got %v, want ErrClosed", err)
	}
	if err := c.Close(ctx); err != nil {
		t.Errorf("second Close: got %v, want nil", err)
	}
	beats := len(f.batches())
	time.Sleep(250 * time.Millisecond)
	if got := len(f.batches()); got != beats {
		t.Errorf("got %d heartbeat requests after Close, want 0", got-beats)
	}
	waitGoroutines(t, baseline)
}

func TestCloseIsPromptWhileAHeartbeatHangs(t *testing.T) {
	f := newFake(t)
	f.onHeartbeats = func(w http.ResponseWriter, r *http.Request) bool { hang(r); return true }
	baseline := runtime.NumGoroutine()
	c, err := client.New(f.URL(), client.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(context.Background(), "u1", "paid"); err != nil {
		t.Fatal(err)
	}
	f.waitBatches(1, 2*time.Second) // now hanging, with a 5s request timeout
	start := time.Now()
	if err := c.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Close took %s with a heartbeat in flight, want well under the 5s request timeout", took)
	}
	if got := f.used("u1"); got != 0 {
		t.Errorf("got used %d after Close, want 0", got)
	}
	waitGoroutines(t, baseline)
}

func waitGoroutines(t *testing.T, baseline int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for runtime.NumGoroutine() > baseline {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("got %d goroutines after Close, want at most %d:\n%s", runtime.NumGoroutine(), baseline, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestCloseReportsReleaseFailures(t *testing.T) {
	f := newFake(t)
	c, err := client.New(f.URL(), client.WithLogger(quiet), client.WithHeartbeatInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	var leases []*client.Lease
	for i := range 3 {
		l, err := c.Acquire(context.Background(), fmt.Sprintf("u%d", i), "paid")
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	f.srv.Close() // the limiter is gone
	err = c.Close(context.Background())
	if !errors.Is(err, client.ErrUnavailable) || !strings.Contains(err.Error(), "3 of 3") {
		t.Errorf("got %v, want a summary of 3 of 3 failures matching ErrUnavailable", err)
	}
	for _, l := range leases {
		if !errors.Is(l.Err(), client.ErrClosed) {
			t.Errorf("got Err %v, want ErrClosed", l.Err())
		}
	}
}
