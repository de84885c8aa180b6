package server_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/apitest"
	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/admin"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/server"
)

// adminToken is the operator token of newAdmin's tokens file.
const adminToken = "operator-token-0123456789abcdef"

// newAdmin returns the admin API and page of lim (pkg/admin), for a
// server's admin listener.
func newAdmin(t *testing.T, lim *limiter.Limiter) *admin.Admin {
	t.Helper()
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("ola operator "+adminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := admin.New(lim, admin.Options{TokensFile: tokens})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// The admin API and page are served on the admin listener only: the API
// listener answers their paths 404, with or without admin on.
func TestAdminNotOnTheAPIListener(t *testing.T) {
	t.Parallel()
	lim := limitertest.New(t, limitertest.Options{}).Limiter
	admin := newAdmin(t, lim)
	for _, tc := range []struct {
		name string
		opts server.Options
	}{
		{"admin off", server.Options{}},
		{"admin on", server.Options{Admin: admin}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAPIOf(t, server.New(lim, tc.opts))
			header := http.Header{"Authorization": {"Bearer " + adminToken}}
			for _, path := range []string{httpapi.AdminUserSlotsPath("u-1"), httpapi.PathAdminAudit} {
				wantError(t, a.callWith(t, http.MethodGet, path, nil, false, header), http.StatusNotFound, httpapi.CodeNotFound)
			}
			r := a.callWith(t, http.MethodPost, httpapi.AdminUserReleasePath("u-1"), []byte(`{"reason":"x"}`), false, header)
			wantError(t, r, http.StatusNotFound, httpapi.CodeNotFound)
			for _, path := range []string{httpapi.PathAdminPage, "/admin", "/admin/app.js"} {
				resp, err := http.Get(a.url + path)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusNotFound {
					t.Errorf("GET %s on the API listener: got %d, want 404", path, resp.StatusCode)
				}
			}
		})
	}
	t.Run("the admin listener serves no slot route", func(t *testing.T) {
		srv := httptest.NewServer(server.New(lim, server.Options{Admin: admin}).AdminHandler())
		defer srv.Close()
		hc := &http.Client{Transport: apitest.ValidatingAdminTransport(t, srv.Client().Transport), Timeout: 10 * time.Second}
		resp, err := hc.Get(srv.URL + httpapi.PathTiers)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s on the admin listener: got %d, want 404", httpapi.PathTiers, resp.StatusCode)
		}
	})
}
