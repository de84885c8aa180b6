package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/joishi/limiter/pkg/httpapi"
)

// The admin commands reach the user they name, whatever the id: the path
// they build survives the client and the server's path cleaning.
func TestAdminCommandsAddressAnyUserID(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+httpapi.PathAdminUserSlots, func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(httpapi.AdminSlotsResponse{UserID: r.PathValue("user_id"), Slots: []httpapi.AdminSlot{}})
	})
	mux.HandleFunc("POST "+httpapi.PathAdminUserRelease, func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(httpapi.AdminReleaseResponse{Released: []string{r.PathValue("user_id")}, AuditID: "0123456789abcdef"})
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for _, user := range []string{".", "..", "...", "a.b", ".hidden", "a/b", "%2E", "a?b#c", "é 中"} {
		t.Run(user, func(t *testing.T) {
			var slots httpapi.AdminSlotsResponse
			runAdmin(t, &slots, "slots", user, "--url", srv.URL, "--token", "t", "-o", "json")
			if slots.UserID != user {
				t.Errorf("slots %q: the server got user %q, want %q", user, slots.UserID, user)
			}
			var released httpapi.AdminReleaseResponse
			runAdmin(t, &released, "release", user, "--reason", "test", "--url", srv.URL, "--token", "t", "-o", "json")
			if len(released.Released) != 1 || released.Released[0] != user {
				t.Errorf("release %q: the server got user %v, want %q", user, released.Released, user)
			}
		})
	}
}

// runAdmin runs `limiter admin args...` and decodes its JSON output into out.
func runAdmin(t *testing.T, out any, args ...string) {
	t.Helper()
	cmd := newAdminCommand()
	var stdout, stderr bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	cmd.SetArgs(args)
	if err := cmd.Execute(); err != nil {
		t.Fatalf("admin %v: got %v (stderr %q), want success", args, err, stderr.String())
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		t.Fatalf("admin %v: output %q: %v", args, stdout.String(), err)
	}
}
