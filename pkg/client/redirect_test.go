package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/joishi/limiter/pkg/client"
	"github.com/joishi/limiter/pkg/httpapi"
)

// requestLog is a server that records the requests it receives and
// answers each 404.
type requestLog struct {
	srv  *httptest.Server
	mu   sync.Mutex
	seen []string // method, path and Authorization of each request
}

func newRequestLog(t *testing.T) *requestLog {
	t.Helper()
	l := &requestLog{}
	l.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.mu.Lock()
		l.seen = append(l.seen, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
		l.mu.Unlock()
		http.NotFound(w, r)
	}))
	t.Cleanup(l.srv.Close)
	return l
}

func (l *requestLog) requests() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.seen...)
}

// redirectTo answers every request status, its Location to + the request's path.
func redirectTo(status int, to func() string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", to()+r.URL.Path)
		w.WriteHeader(status)
	}
}

// The limiter never redirects its routes, so a 3xx comes from something in
// between: following it would send the bearer token to the host it names
// (net/http keeps it for the same host, or a subdomain) and a POST again as
// a GET. The client's own HTTP client follows none; the 3xx is an error
// naming its Location.
func TestRedirectIsNotFollowed(t *testing.T) {
	tests := []struct {
		name      string
		status    int
		sameHost  bool
		wantCalls int // requests the redirecting server receives
	}{
		{"a 302 to another server", http.StatusFound, false, 1},
		{"a 301 to another server", http.StatusMovedPermanently, false, 1},
		{"a 303 to another server", http.StatusSeeOther, false, 1},
		{"a 307 to another path of the same server", http.StatusTemporaryRedirect, true, 1},
		{"a 308 to another path of the same server", http.StatusPermanentRedirect, true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			elsewhere := newRequestLog(t)
			var mu sync.Mutex
			calls := 0
			var srv *httptest.Server
			srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				calls++
				mu.Unlock()
				if strings.HasPrefix(r.URL.Path, "/moved/") {
					http.NotFound(w, r)
					return
				}
				redirectTo(tt.status, func() string {
					if tt.sameHost {
						return srv.URL + "/moved"
					}
					return elsewhere.srv.URL
				})(w, r)
			}))
			t.Cleanup(srv.Close)
			c := newClient(t, srv.URL, client.WithToken(appToken))

			_, err := c.Acquire(context.Background(), "u1", "paid")
			var e *client.Error
			if !errors.As(err, &e) {
				t.Fatalf("got %v (%T), want *client.Error", err, err)
			}
			if want := "http_" + strconv.Itoa(tt.status); e.Code != want || e.Status != tt.status {
				t.Errorf("got code %q status %d, want %q %d", e.Code, e.Status, want, tt.status)
			}
			if !strings.Contains(e.Error(), "redirected to ") || !strings.Contains(e.Error(), httpapi.PathAcquire) {
				t.Errorf("got %q, want it to name where the answer redirected to", e.Error())
			}
			if errors.Is(err, client.ErrUnavailable) {
				t.Errorf("got %v matching ErrUnavailable, want a definite answer that is not retried", err)
			}
			mu.Lock()
			got := calls
			mu.Unlock()
			if got != tt.wantCalls {
				t.Errorf("got %d requests to the redirecting server, want %d", got, tt.wantCalls)
			}
			if got := elsewhere.requests(); len(got) != 0 {
				t.Errorf("got requests %q at the server the redirect named, want none", got)
			}
		})
	}

	t.Run("an admin call", func(t *testing.T) {
		elsewhere := newRequestLog(t)
		srv := httptest.NewServer(redirectTo(http.StatusFound, func() string { return elsewhere.srv.URL }))
		t.Cleanup(srv.Close)
		a, err := client.NewAdmin(srv.URL, "admin-token")
		if err != nil {
			t.Fatal(err)
		}
		_, err = a.Audit(context.Background())
		var e *client.Error
		if !errors.As(err, &e) || e.Code != "http_302" || !strings.Contains(e.Message, elsewhere.srv.URL+httpapi.PathAdminAudit) {
			t.Errorf("got %v, want http_302 naming %s", err, elsewhere.srv.URL+httpapi.PathAdminAudit)
		}
		if got := elsewhere.requests(); len(got) != 0 {
			t.Errorf("got requests %q at the server the redirect named, want none", got)
		}
	})

	t.Run("the caller's own HTTP client keeps its redirect policy", func(t *testing.T) {
		elsewhere := newRequestLog(t)
		srv := httptest.NewServer(redirectTo(http.StatusTemporaryRedirect, func() string { return elsewhere.srv.URL }))
		t.Cleanup(srv.Close)
		c := newClient(t, srv.URL, client.WithHTTPClient(&http.Client{}))
		_, err := c.Acquire(context.Background(), "u1", "paid")
		if got := elsewhere.requests(); len(got) != 1 || !strings.HasPrefix(got[0], "POST "+httpapi.PathAcquire) {
			t.Errorf("got requests %q at the server the redirect named, want the acquire (the caller's client follows it); acquire: %v", got, err)
		}
	})
}
