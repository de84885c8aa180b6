package ratelog

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// clock is a time the test moves.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func newTestLogger(level slog.Level) (*Logger, *bytes.Buffer, *clock) {
	var buf bytes.Buffer
	clk := &clock{now: time.Unix(1_700_000_000, 0)}
	l := New(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: level})), 10*time.Second)
	l.now = clk.Now
	return l, &buf, clk
}

func records(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

func TestLoggerBoundsLines(t *testing.T) {
	ctx := context.Background()
	l, buf, clk := newTestLogger(slog.LevelInfo)

	for i := range 800 {
		l.Log(ctx, slog.LevelWarn, "request failed", "i", i)
	}
	if got := records(t, buf); len(got) != 1 || got[0]["i"] != float64(0) || got[0]["similar_since_last_line"] != nil {
		t.Fatalf("800 calls in one interval logged %v, want only the first, without a count", got)
	}

	clk.Advance(9 * time.Second)
	l.Log(ctx, slog.LevelWarn, "request failed", "i", 800)
	if got := records(t, buf); len(got) != 1 {
		t.Fatalf("a call 9s after the line logged again: %d lines, want 1", len(got))
	}

	clk.Advance(time.Second)
	l.Log(ctx, slog.LevelWarn, "request failed", "i", 801)
	got := records(t, buf)
	if len(got) != 2 {
		t.Fatalf("a call 10s after the line: %d lines, want 2", len(got))
	}
	if got[1]["i"] != float64(801) || got[1]["similar_since_last_line"] != float64(800) || got[1]["level"] != "WARN" {
		t.Errorf("second line = %v, want i 801 at WARN with similar_since_last_line 800", got[1])
	}

	clk.Advance(time.Minute)
	l.Log(ctx, slog.LevelError, "request failed", "i", 802)
	if got := records(t, buf); len(got) != 3 || got[2]["similar_since_last_line"] != nil || got[2]["level"] != "ERROR" {
		t.Errorf("after a quiet minute: %v, want a third line at ERROR without a count", got)
	}
}

func TestLoggerCountsNothingItWouldNotLog(t *testing.T) {
	ctx := context.Background()
	l, buf, clk := newTestLogger(slog.LevelError)
	for range 5 {
		l.Log(ctx, slog.LevelWarn, "degraded")
	}
	l.Log(ctx, slog.LevelError, "refused")
	clk.Advance(10 * time.Second)
	l.Log(ctx, slog.LevelError, "refused")
	got := records(t, buf)
	if len(got) != 2 || got[0]["msg"] != "refused" || got[1]["similar_since_last_line"] != nil {
		t.Errorf("with WARN disabled: %v, want two ERROR lines and no count of the disabled WARNs", got)
	}
}

func TestLoggerUnderConcurrency(t *testing.T) {
	ctx := context.Background()
	l, buf, _ := newTestLogger(slog.LevelInfo)
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			for range 20 {
				l.Log(ctx, slog.LevelWarn, "request failed")
			}
		})
	}
	wg.Wait()
	if got := records(t, buf); len(got) != 1 {
		t.Errorf("1000 concurrent calls in one interval logged %d lines, want 1", len(got))
	}
	if n := l.suppressed.Load(); n != 999 {
		t.Errorf("suppressed = %d, want 999", n)
	}
}
