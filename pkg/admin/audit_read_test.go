package admin_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/joishi/limiter/internal/apitest"
	"github.com/joishi/limiter/pkg/httpapi"
)

// TestAnAuditRecordStoredTwiceIsListedOnce: an append that met an outage
// is sent once more, and stores its record twice when only its answer was
// lost (see limiter.AppendAudit); the audit lists each call once.
func TestAnAuditRecordStoredTwiceIsListedOnce(t *testing.T) {
	e := newAdminEnv(t, nil)
	ctx := context.Background()
	user := newUser()
	r := e.do(t, adminCall{method: "POST", path: httpapi.AdminUserReleasePath(user), token: operatorToken, body: `{"reason":"ticket 4812"}`})
	release := apitest.Decode[httpapi.AdminReleaseResponse](t, r, http.StatusOK)
	newest, err := e.lim.RecentAudit(ctx, 1)
	if err != nil || len(newest) != 1 || !strings.Contains(newest[0].Record, release.AuditID) {
		t.Fatalf("the stream's newest entry: %+v, %v; want the release's record", newest, err)
	}
	// The retry's copy, stored after another call's record.
	e.do(t, adminCall{method: "GET", path: httpapi.AdminUserSlotsPath(user), token: viewerToken})
	if err := e.lim.AppendAudit(ctx, newest[0].Record, 100); err != nil {
		t.Fatal(err)
	}
	got := apitest.Decode[httpapi.AuditResponse](t, e.do(t, adminCall{method: "GET", path: httpapi.PathAdminAudit, token: viewerToken}), http.StatusOK)
	n := 0
	for _, rec := range got.Records {
		if rec.AuditID == release.AuditID {
			n++
		}
	}
	if n != 1 {
		t.Errorf("the audit lists the release %d times; want once", n)
	}
}

// TestAnAuditLimitCountsCallsNotCopies: GET /v1/admin/audit?limit=2 lists
// the 2 newest calls, newest first, when the newest was stored twice: the
// copy takes none of the places.
func TestAnAuditLimitCountsCallsNotCopies(t *testing.T) {
	e := newAdminEnv(t, nil)
	ctx := context.Background()
	var ids []string
	for range 2 {
		r := e.do(t, adminCall{method: "POST", path: httpapi.AdminUserReleasePath(newUser()), token: operatorToken, body: `{"reason":"ticket 4812"}`})
		ids = append(ids, apitest.Decode[httpapi.AdminReleaseResponse](t, r, http.StatusOK).AuditID)
	}
	newest, err := e.lim.RecentAudit(ctx, 1)
	if err != nil || len(newest) != 1 || !strings.Contains(newest[0].Record, ids[1]) {
		t.Fatalf("the stream's newest entry: %+v, %v; want the second release's record", newest, err)
	}
	if err := e.lim.AppendAudit(ctx, newest[0].Record, 100); err != nil { // the retried append's copy
		t.Fatal(err)
	}
	got := apitest.Decode[httpapi.AuditResponse](t, e.do(t, adminCall{method: "GET", path: httpapi.PathAdminAudit + "?limit=2", token: viewerToken}), http.StatusOK)
	var listed []string
	for _, rec := range got.Records {
		listed = append(listed, rec.AuditID)
	}
	if want := []string{ids[1], ids[0]}; !slices.Equal(listed, want) {
		t.Errorf("audit?limit=2 listed %v; want the 2 calls, newest first: %v", listed, want)
	}
}
