package telemetry

import (
	"sync"
	"testing"
	"time"
)

// clock is a fake clock: the window is the observer's own time, not
// Redis's.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func TestUsedMaxIsTheLargestOverTheWindow(t *testing.T) {
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	m := newUsedMax(time.Minute, c.now)
	if got := m.max("free"); got != 0 {
		t.Fatalf("max before any record: got %d, want 0", got)
	}
	m.record("free", 1)
	m.record("paid", 3)
	m.record("free", 2)
	m.record("free", 1)
	if got := m.max("free"); got != 2 {
		t.Fatalf("max after 1, 2, 1: got %d, want 2", got)
	}
	c.advance(30 * time.Second)
	m.record("free", 1)
	if got := m.max("free"); got != 2 {
		t.Errorf("max 30s after the 2: got %d, want 2 (still in the window)", got)
	}
	c.advance(31 * time.Second)
	if got := m.max("free"); got != 1 {
		t.Errorf("max 61s after the 2 and 31s after the 1: got %d, want 1", got)
	}
	if got := m.max("paid"); got != 0 {
		t.Errorf("paid 61s after its only record: got %d, want 0 (a floor that returns to zero)", got)
	}
	c.advance(time.Minute)
	if got := m.max("free"); got != 0 {
		t.Errorf("free a window after its last record: got %d, want 0", got)
	}
	m.record("free", 0)
	if got := m.max("free"); got != 0 {
		t.Errorf("after recording 0: got %d, want 0", got)
	}
}

// A step reused after the window passed starts from its new value, not the
// largest the step held a window earlier.
func TestUsedMaxForgetsAReusedStep(t *testing.T) {
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	m := newUsedMax(6*time.Second, c.now)
	m.record("free", 9)
	c.advance(6 * time.Second) // the same step of the ring, one window on
	m.record("free", 2)
	if got := m.max("free"); got != 2 {
		t.Errorf("max after the step was reused: got %d, want 2", got)
	}
}

func TestUsedMaxConcurrentRecordsKeepTheLargest(t *testing.T) {
	m := newUsedMax(time.Minute, time.Now)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				m.record("paid", (i*7+g)%500)
			}
		})
	}
	wg.Wait()
	if got := m.max("paid"); got != 499 {
		t.Errorf("max of concurrent records up to 499: got %d, want 499", got)
	}
}
