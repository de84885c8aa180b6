package client_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/client"
	"github.com/joishi/limiter/pkg/httpapi"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newClient(t *testing.T, url string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(url, append([]client.Option{client.WithLogger(quiet)}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func TestAcquireAndRelease(t *testing.T) {
	f := newFake(t)
	c := newClient(t, f.URL())
	ctx := context.Background()

	lease, err := c.Acquire(ctx, "u1", "paid", client.WithStreamID("stream-1"))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if lease.StreamID() != "stream-1" || lease.UserID() != "u1" || lease.Plan() != "paid" || lease.Degraded() {
		t.Errorf("got lease %q/%q/%q degraded %t, want stream-1/u1/paid not degraded", lease.StreamID(), lease.UserID(), lease.Plan(), lease.Degraded())
	}
	if time.Until(lease.ExpiresAt()) <= 0 {
		t.Errorf("got ExpiresAt %s, want in the future", lease.ExpiresAt())
	}
	again, err := c.Acquire(ctx, "u1", "paid", client.WithStreamID("stream-1"))
	if err != nil || again != lease {
		t.Errorf("re-acquiring a held stream id: got %p, %v; want the held lease %p", again, err, lease)
	}
	if got := f.used("u1"); got != 1 {
		t.Errorf("got used %d after acquire, want 1", got)
	}
	for range 2 {
		if err := lease.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	if got := f.used("u1"); got != 0 {
		t.Errorf("got used %d after release, want 0", got)
	}
	f.mu.Lock()
	releases := f.releases
	f.mu.Unlock()
	if releases != 1 {
		t.Errorf("got %d release requests for two Release calls, want 1", releases)
	}
	select {
	case <-lease.Lost():
		t.Error("Lost closed by Release, want open")
	default:
	}
}

func TestAcquireLimitReached(t *testing.T) {
	f := newFake(t)
	c := newClient(t, f.URL())
	ctx := context.Background()
	if _, err := c.Acquire(ctx, "u1", "free"); err != nil {
		t.Fatalf("first Acquire: %v", err)
	}
	_, err := c.Acquire(ctx, "u1", "free")
	var e *client.Error
	if !errors.As(err, &e) {
		t.Fatalf("got %v (%T), want *client.Error", err, err)
	}
	if !client.IsLimited(err) || !errors.Is(err, client.ErrLimitReached) || errors.Is(err, client.ErrUnavailable) {
		t.Errorf("got %v, want it to match ErrLimitReached only", err)
	}
	want := client.Error{Status: 429, Code: httpapi.CodeStreamLimitReached, Message: "limit", Used: 1, Limit: 1, RetryAfter: 1500 * time.Millisecond}
	if *e != want {
		t.Errorf("got %+v, want %+v", *e, want)
	}
}

func TestErrorAnswers(t *testing.T) {
	tests := []struct {
		name       string
		status     int
		body       string
		header     string
		wantCode   string
		wantIs     error
		wantRetry  time.Duration
		wantStatus int
	}{
		{"a 429 without retry_after_ms takes the Retry-After header", 429, `{"error":{"code":"stream_limit_reached","message":"m","used":3,"limit":3}}`, "7", httpapi.CodeStreamLimitReached, client.ErrLimitReached, 7 * time.Second, 429},
		{"retry_after_ms wins over the header", 429, `{"error":{"code":"stream_limit_reached","message":"m","retry_after_ms":250}}`, "7", httpapi.CodeStreamLimitReached, client.ErrLimitReached, 250 * time.Millisecond, 429},
		{"503 limiter_unavailable is unavailable, not limited", 503, `{"error":{"code":"limiter_unavailable","message":"redis down"}}`, "", httpapi.CodeUnavailable, client.ErrUnavailable, 0, 503},
		{"a proxy's 502 page is unavailable", 502, `<html>bad gateway</html>`, "", httpapi.CodeUnavailable, client.ErrUnavailable, 0, 502},
		{"422 unknown_plan", 422, `{"error":{"code":"unknown_plan","message":"no plan"}}`, "", httpapi.CodeUnknownPlan, client.ErrUnknownPlan, 0, 422},
		{"400 invalid_user_id", 400, `{"error":{"code":"invalid_user_id","message":"bad"}}`, "", httpapi.CodeInvalidUserID, client.ErrInvalid, 0, 400},
		{"a 404 without a body names its status", 404, ``, "", "http_404", nil, 0, 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			f.onAcquire = func(w http.ResponseWriter, r *http.Request) bool {
				if tt.header != "" {
					w.Header().Set("Retry-After", tt.header)
				}
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
				return true
			}
			c := newClient(t, f.URL())
			_, err := c.Acquire(context.Background(), "u1", "paid")
			var e *client.Error
			if !errors.As(err, &e) {
				t.Fatalf("got %v (%T), want *client.Error", err, err)
			}
			if e.Code != tt.wantCode || e.Status != tt.wantStatus || e.RetryAfter != tt.wantRetry {
				t.Errorf("got code %q status %d retry %s, want %q %d %s", e.Code, e.Status, e.RetryAfter, tt.wantCode, tt.wantStatus, tt.wantRetry)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("got %v, want it to match %v", err, tt.wantIs)
			}
			if tt.wantIs != client.ErrLimitReached && client.IsLimited(err) {
				t.Errorf("got IsLimited true for %v, want false", err)
			}
		})
	}
}

func TestTransportFailures(t *testing.T) {
	t.Run("a network error is unavailable", func(t *testing.T) {
		f := newFake(t)
		f.onAcquire = func(w http.ResponseWriter, r *http.Request) bool { hangUp(w); return true }
		c := newClient(t, f.URL())
		_, err := c.Acquire(context.Background(), "u1", "paid")
		if !errors.Is(err, client.ErrUnavailable) || client.IsLimited(err) {
			t.Errorf("got %v, want ErrUnavailable", err)
		}
	})
	t.Run("the request timeout is unavailable", func(t *testing.T) {
		f := newFake(t)
		f.onAcquire = func(w http.ResponseWriter, r *http.Request) bool { hang(r); return true }
		c := newClient(t, f.URL(), client.WithRequestTimeout(50*time.Millisecond))
		_, err := c.Acquire(context.Background(), "u1", "paid")
		if !errors.Is(err, client.ErrUnavailable) {
			t.Errorf("got %v, want ErrUnavailable", err)
		}
	})
	t.Run("the caller giving up is not unavailable", func(t *testing.T) {
		f := newFake(t)
		f.onAcquire = func(w http.ResponseWriter, r *http.Request) bool { hang(r); return true }
		c := newClient(t, f.URL())
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := c.Acquire(ctx, "u1", "paid")
		if errors.Is(err, client.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("got %v, want context.DeadlineExceeded and not ErrUnavailable", err)
		}
	})
}

func TestWithTransportSeesEveryRequest(t *testing.T) {
	f := newFake(t)
	wrap := func(next http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			r = r.Clone(r.Context())
			r.Header.Set("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
			return next.RoundTrip(r)
		})
	}
	hc := &http.Client{}
	c := newClient(t, f.URL(), client.WithHTTPClient(hc), client.WithTransport(wrap))
	lease, err := c.Acquire(context.Background(), "u1", "paid")
	if err != nil {
		t.Fatal(err)
	}
	f.waitBatches(1, 2*time.Second)
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if hc.Transport != nil {
		t.Error("WithTransport modified the caller's http.Client")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, h := range f.headers {
		if h.Get("Traceparent") == "" {
			t.Errorf("request %d has no traceparent header", i)
		}
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	tests := []struct {
		name string
		url  string
		opts []client.Option
	}{
		{"no scheme", "limiter:8080", nil},
		{"ftp scheme", "ftp://limiter", nil},
		{"no host", "http://", nil},
		{"a query", "http://limiter/?x=1", nil},
		{"zero heartbeat interval", "http://limiter", []client.Option{client.WithHeartbeatInterval(0)}},
		{"negative request timeout", "http://limiter", []client.Option{client.WithRequestTimeout(-time.Second)}},
		{"nil http client", "http://limiter", []client.Option{client.WithHTTPClient(nil)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if c, err := client.New(tt.url, tt.opts...); err == nil {
				_ = c.Close(context.Background())
				t.Errorf("got no error, want one")
			}
		})
	}
}

func TestBaseURLPathPrefixIsKept(t *testing.T) {
	f := newFake(t)
	var paths []string
	wrap := func(next http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			paths = append(paths, r.URL.Path)
			r = r.Clone(r.Context())
			r.URL.Path = strings.TrimPrefix(r.URL.Path, "/limiter")
			return next.RoundTrip(r)
		})
	}
	c := newClient(t, f.URL()+"/limiter/", client.WithTransport(wrap), client.WithHeartbeatInterval(time.Hour))
	if _, err := c.Acquire(context.Background(), "u1", "paid"); err != nil {
		t.Fatal(err)
	}
	if want := "/limiter" + httpapi.PathAcquire; len(paths) != 1 || paths[0] != want {
		t.Errorf("got paths %v, want [%s]", paths, want)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// waitGoroutines fails unless the goroutine count falls back to baseline:
// everything the client started has stopped.
