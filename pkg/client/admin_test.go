package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/client"
	"github.com/joishi/limiter/pkg/httpapi"
)

// fakeAdmin is an in-memory stand-in for the admin API: a viewer and an
// operator token, one user's slots, and every request it was sent.
type fakeAdmin struct {
	srv *httptest.Server

	mu       sync.Mutex
	slots    map[string][]string // user → stream ids
	requests []*http.Request
	reasons  []string
}

const (
	viewerToken   = "viewer-token-0123456789"
	operatorToken = "operator-token-0123456789"
)

func newFakeAdmin(t *testing.T) *fakeAdmin {
	t.Helper()
	f := &fakeAdmin{slots: map[string][]string{"a/b": {"s-1", "s-2"}}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+httpapi.PathAdminUserSlots, f.authorized(httpapi.RoleViewer, f.listSlots))
	mux.HandleFunc("POST "+httpapi.PathAdminUserRelease, f.authorized(httpapi.RoleOperator, f.releaseAll))
	mux.HandleFunc("GET "+httpapi.PathAdminAudit, f.authorized(httpapi.RoleViewer, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, httpapi.AuditResponse{Records: []httpapi.AuditRecord{{AuditID: "0123456789abcdef", Action: httpapi.ActionReleaseAll}}})
	}))
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.requests = append(f.requests, r.Clone(context.Background()))
		f.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeAdmin) authorized(role string, next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("Authorization") {
		case "Bearer " + operatorToken:
		case "Bearer " + viewerToken:
			if role == httpapi.RoleOperator {
				writeError(w, http.StatusForbidden, httpapi.Error{Code: httpapi.CodeForbidden, Message: "role viewer may not release all"})
				return
			}
		default:
			writeError(w, http.StatusUnauthorized, httpapi.Error{Code: httpapi.CodeUnauthorized, Message: "unknown token"})
			return
		}
		next(w, r)
	}
}

func (f *fakeAdmin) listSlots(w http.ResponseWriter, r *http.Request) {
	user := r.PathValue("user_id")
	f.mu.Lock()
	defer f.mu.Unlock()
	out := httpapi.AdminSlotsResponse{UserID: user, Used: len(f.slots[user]), Slots: []httpapi.AdminSlot{}}
	for _, id := range f.slots[user] {
		out.Slots = append(out.Slots, httpapi.AdminSlot{StreamID: id, ExpiresAt: time.Now().Add(time.Minute), TTLMs: 60_000})
	}
	writeJSON(w, http.StatusOK, out)
}

func (f *fakeAdmin) releaseAll(w http.ResponseWriter, r *http.Request) {
	var req httpapi.AdminReleaseRequest
	if !decode(w, r, &req) {
		return
	}
	if strings.TrimSpace(req.Reason) == "" {
		writeError(w, http.StatusBadRequest, httpapi.Error{Code: httpapi.CodeInvalidRequest, Message: "reason is required"})
		return
	}
	user := r.PathValue("user_id")
	f.mu.Lock()
	defer f.mu.Unlock()
	released := f.slots[user]
	delete(f.slots, user)
	f.reasons = append(f.reasons, req.Reason)
	writeJSON(w, http.StatusOK, httpapi.AdminReleaseResponse{Released: released, AuditID: "0123456789abcdef"})
}

func newAdmin(t *testing.T, url, token string) *client.Admin {
	t.Helper()
	a, err := client.NewAdmin(url, token)
	if err != nil {
		t.Fatalf("NewAdmin: %v", err)
	}
	return a
}

func TestAdminListsAndReleasesSlots(t *testing.T) {
	f := newFakeAdmin(t)
	a := newAdmin(t, f.srv.URL, operatorToken)
	ctx := context.Background()

	slots, err := a.Slots(ctx, "a/b")
	if err != nil {
		t.Fatalf("Slots: %v", err)
	}
	if slots.UserID != "a/b" || slots.Used != 2 || len(slots.Slots) != 2 {
		t.Errorf("Slots: got user %q used %d slots %d, want a/b 2 2", slots.UserID, slots.Used, len(slots.Slots))
	}
	released, err := a.ReleaseAll(ctx, "a/b", "ticket 7: locked out")
	if err != nil {
		t.Fatalf("ReleaseAll: %v", err)
	}
	if strings.Join(released.Released, ",") != "s-1,s-2" || released.AuditID == "" {
		t.Errorf("ReleaseAll: got released %v audit id %q, want [s-1 s-2] and an audit id", released.Released, released.AuditID)
	}
	audit, err := a.Audit(ctx)
	if err != nil {
		t.Fatalf("Audit: %v", err)
	}
	if len(audit.Records) != 1 || audit.Records[0].Action != httpapi.ActionReleaseAll {
		t.Errorf("Audit: got %+v, want the one release_all record", audit.Records)
	}

	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reasons) != 1 || f.reasons[0] != "ticket 7: locked out" {
		t.Errorf("got reasons %q sent, want [ticket 7: locked out]", f.reasons)
	}
	for _, r := range f.requests {
		if got, want := r.Header.Get("Authorization"), "Bearer "+operatorToken; got != want {
			t.Errorf("%s %s: got Authorization %q, want %q", r.Method, r.URL.Path, got, want)
		}
		if got, want := r.Header.Get("Content-Type") != "", r.Method == http.MethodPost; got != want {
			t.Errorf("%s %s: got a Content-Type %t, want %t", r.Method, r.URL.Path, got, want)
		}
	}
}

func TestAdminErrorAnswers(t *testing.T) {
	f := newFakeAdmin(t)
	off := httptest.NewServer(http.NotFoundHandler()) // a service without admin.tokensFile
	t.Cleanup(off.Close)
	unreachable := httptest.NewServer(http.NotFoundHandler())
	unreachable.Close()

	tests := []struct {
		name       string
		url, token string
		call       func(context.Context, *client.Admin) error
		wantStatus int
		wantCode   string
		wantIs     error
	}{
		{"an unknown token is 401 unauthorized", f.srv.URL, "wrong-token", listSlots, 401, httpapi.CodeUnauthorized, nil},
		{"a viewer releasing is 403 forbidden", f.srv.URL, viewerToken, releaseWithReason("ticket 7"), 403, httpapi.CodeForbidden, nil},
		{"a release without a reason is invalid", f.srv.URL, operatorToken, releaseWithReason(" "), 400, httpapi.CodeInvalidRequest, client.ErrInvalid},
		{"a service with the admin API off answers 404", off.URL, operatorToken, listSlots, 404, "http_404", nil},
		{"an unreachable service is unavailable", unreachable.URL, operatorToken, listSlots, 0, "", client.ErrUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call(context.Background(), newAdmin(t, tt.url, tt.token))
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("got %v, want it to match %v", err, tt.wantIs)
			}
			if tt.wantStatus == 0 {
				return
			}
			var e *client.Error
			if !errors.As(err, &e) {
				t.Fatalf("got %v (%T), want *client.Error", err, err)
			}
			if e.Status != tt.wantStatus || e.Code != tt.wantCode {
				t.Errorf("got status %d code %q, want %d %q", e.Status, e.Code, tt.wantStatus, tt.wantCode)
			}
		})
	}
}

func listSlots(ctx context.Context, a *client.Admin) error {
	_, err := a.Slots(ctx, "a/b")
	return err
}

func releaseWithReason(reason string) func(context.Context, *client.Admin) error {
	return func(ctx context.Context, a *client.Admin) error {
		_, err := a.ReleaseAll(ctx, "a/b", reason)
		return err
	}
}

func TestNewAdminRejectsBadArguments(t *testing.T) {
	tests := []struct {
		name  string
		url   string
		token string
		opts  []client.Option
	}{
		{"no token", "http://limiter", "", nil},
		{"a blank token", "http://limiter", " \t", nil},
		{"no scheme", "limiter:8080", "t", nil},
		{"a fragment", "http://limiter/#admin", "t", nil},
		{"zero request timeout", "http://limiter", "t", []client.Option{client.WithRequestTimeout(0)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := client.NewAdmin(tt.url, tt.token, tt.opts...); err == nil {
				t.Errorf("got no error, want one")
			}
		})
	}
}
