package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/httpapi"
)

const (
	e2eChatToken  = "e2e-chat-token-0123456789"
	e2eBatchToken = "e2e-batch-token-0123456789"
)

// TestAStreamIDSeenByAViewerCannotBeTakenOver: a serve process with API
// callers and admin tokens. chat holds a long slot; an admin viewer lists
// the user's slots and sees its stream id; batch (which may use the same
// plan) then tries to extend, heartbeat and release it: each is 403
// not_slot_holder, the slot is still chat's with its expiry, and only
// chat's own release frees it.
func TestAStreamIDSeenByAViewerCannotBeTakenOver(t *testing.T) {
	tokens := filepath.Join(t.TempDir(), "api-tokens")
	if err := os.WriteFile(tokens, []byte("chat "+e2eChatToken+" long\nbatch "+e2eBatchToken+" long,paid\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := startAdminServer(t, "api:\n  tokensFile: "+tokens+"\n")
	user := "holder-" + randomID()
	api := func(token, path string, body any) (int, []byte) {
		hc := &http.Client{Timeout: 10 * time.Second, Transport: bearer(token)}
		status, _, data := call(t, hc, http.MethodPost, srv.API+path, body, nil)
		return status, data
	}
	status, data := api(e2eChatToken, "/v1/slots/acquire", map[string]any{"user_id": user, "plan": "long"})
	var grant httpapi.AcquireResponse
	if status != http.StatusOK || json.Unmarshal(data, &grant) != nil || !grant.Granted {
		t.Fatalf("chat's acquire: %d %s", status, data)
	}

	var listed httpapi.AdminSlotsResponse
	if status, data := srv.admin(t, http.MethodGet, "/v1/admin/users/"+user+"/slots", e2eViewerToken, nil, &listed); status != http.StatusOK || len(listed.Slots) != 1 {
		t.Fatalf("viewer's listing: %d %s", status, data)
	}
	stream := listed.Slots[0].StreamID
	if stream != grant.StreamID {
		t.Fatalf("listed stream %q, want chat's %q", stream, grant.StreamID)
	}
	for _, c := range []struct {
		path string
		body map[string]any
	}{
		{"/v1/slots/acquire", map[string]any{"user_id": user, "plan": "paid", "stream_id": stream}},
		{"/v1/slots/heartbeat", map[string]any{"user_id": user, "plan": "long", "stream_id": stream}},
		{"/v1/slots/release", map[string]any{"user_id": user, "stream_id": stream}},
	} {
		status, data := api(e2eBatchToken, c.path, c.body)
		var e httpapi.ErrorResponse
		if status != http.StatusForbidden || json.Unmarshal(data, &e) != nil || e.Error.Code != httpapi.CodeNotSlotHolder {
			t.Errorf("batch %s of chat's stream: %d %s; want 403 %s", c.path, status, data, httpapi.CodeNotSlotHolder)
		}
	}
	var after httpapi.AdminSlotsResponse
	srv.admin(t, http.MethodGet, "/v1/admin/users/"+user+"/slots", e2eViewerToken, nil, &after)
	if len(after.Slots) != 1 || after.Slots[0].StreamID != stream || !after.Slots[0].ExpiresAt.Equal(grant.ExpiresAt) {
		t.Fatalf("chat's slot after batch's calls: %+v; want it as granted, expiring at %v", after.Slots, grant.ExpiresAt)
	}
	if status, data := api(e2eChatToken, "/v1/slots/release", map[string]any{"user_id": user, "stream_id": stream}); status != http.StatusOK {
		t.Errorf("chat's release: %d %s", status, data)
	}
}
