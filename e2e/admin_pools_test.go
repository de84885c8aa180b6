package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/httpapi"
)

// adminLlama is a model's name that holds a '/': one escaped path
// segment, one argument of the CLI.
const adminLlama = "meta-llama/Llama-3.1-70B-Instruct"

// adminPools caps model=gpt-4o at 2, model=<adminLlama> at 1 and every
// other key of model at 3, with a wait of up to 30s; org caps acme at 1
// and no other key.
const adminPools = `pools:
  static:
    - pool: model
      maxConcurrentStreams: 3
      keys: {gpt-4o: 2, "meta-llama/Llama-3.1-70B-Instruct": 1}
      maxWait: 30s
    - pool: org
      keys: {acme: 1}
`

// joinPool acquires a stream of user (plan long) that joins key of pool
// through the API, and returns the status.
func joinPool(t *testing.T, srv *adminServer, user, pool, key string) int {
	t.Helper()
	status, _, _ := call(t, httpClient, "POST", srv.API+httpapi.PathAcquire,
		httpapi.AcquireRequest{UserID: user, Plan: "long", Label: "e2e", Pools: map[string]string{pool: key}}, nil)
	return status
}

// waitInPool starts an acquire of user (plan) that joins key of pool as
// stream, waiting up to 30s, and returns once the key lists it among its
// n waiters. stop cancels it and waits until the key lists none of it.
func waitInPool(t *testing.T, srv *adminServer, user, plan, stream, pool, key string, n int) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	answered := make(chan answer, 1)
	go func() {
		answered <- postAs(ctx, "", srv.API+httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: plan, StreamID: stream, Label: "e2e-wait",
			WaitMs: 30_000, Pools: map[string]string{pool: key}})
	}()
	t.Cleanup(cancel)
	waiters(t, srv, pool, key, n)
	return func() {
		t.Helper()
		cancel()
		if a := <-answered; a.status == http.StatusOK {
			t.Errorf("%s's waiting acquire: got 200 %s, want no grant (the key stayed full)", user, a.body)
		}
		eventually(t, 10*time.Second, "the waiter "+user+" leaves "+pool+"="+key, func() bool {
			for _, w := range poolKey(t, srv, pool, key).Waiters {
				if w.UserID == user {
					return false
				}
			}
			return true
		})
	}
}

// poolKey lists key of pool through the admin API.
func poolKey(t *testing.T, srv *adminServer, pool, key string) httpapi.AdminPoolKeyResponse {
	t.Helper()
	var got httpapi.AdminPoolKeyResponse
	if status, body := srv.admin(t, "GET", httpapi.AdminPoolKeyPath(pool, key), e2eViewerToken, nil, &got); status != http.StatusOK {
		t.Fatalf("GET %s=%s: got %d %s, want 200", pool, key, status, body)
	}
	return got
}

// waiters returns the listing of key of pool once it has n waiters.
func waiters(t *testing.T, srv *adminServer, pool, key string, n int) httpapi.AdminPoolKeyResponse {
	t.Helper()
	var got httpapi.AdminPoolKeyResponse
	eventually(t, 10*time.Second, pool+"="+key+" lists its waiters", func() bool {
		got = poolKey(t, srv, pool, key)
		return len(got.Waiters) == n
	})
	return got
}

// TestAdminPoolKeyOnCluster: a real serve process on a real Redis Cluster
// shows who holds a pool key and who waits for it, by priority, and takes and removes an override of its
// cap that judges the streams joining it, through the admin API; a hostile
// caller reaches only the key it names, or is refused, and nothing it
// sends is taken for another key.
func TestAdminPoolKeyOnCluster(t *testing.T) {
	srv := startAdminServerOn(t, testenv.Cluster(t), adminPools)
	holders := map[string]bool{}
	for range 2 {
		user := "pool-e2e-" + randomID()
		if status := joinPool(t, srv, user, "model", "gpt-4o"); status != http.StatusOK {
			t.Fatalf("acquire joining model=gpt-4o: got %d, want 200", status)
		}
		holders[user] = true
	}
	if status := joinPool(t, srv, "pool-e2e-"+randomID(), "model", "gpt-4o"); status != http.StatusTooManyRequests {
		t.Fatalf("a 3rd stream joining model=gpt-4o (cap 2): got %d, want 429", status)
	}

	var shown httpapi.AdminPoolKeyResponse
	if status, body := srv.admin(t, "GET", httpapi.AdminPoolKeyPath("model", "gpt-4o"), e2eViewerToken, nil, &shown); status != http.StatusOK {
		t.Fatalf("GET model=gpt-4o: got %d %s, want 200", status, body)
	}
	if shown.Used != 2 || shown.Limit == nil || *shown.Limit != 2 || len(shown.Holders) != 2 {
		t.Fatalf("model=gpt-4o: got %+v, want 2 holders, cap 2", shown)
	}
	var holder string
	for _, h := range shown.Holders {
		if !holders[h.UserID] || h.Label != "e2e" || h.Plan != "long" || h.StartedAt == nil {
			t.Errorf("holder %+v: want one of the users that joined, labelled e2e, plan long, with a start", h)
		}
		holder = h.UserID
	}

	// A priority-0 acquire waits, then a priority-5 one, whose stream id
	// spells a holder's user id: the priority-5 one is listed first, under
	// its own user.
	low, high := "pool-e2e-low-"+randomID(), "pool-e2e-high-"+randomID()
	stopLow := waitInPool(t, srv, low, "queued", "w-low", "model", "gpt-4o", 1)
	stopHigh := waitInPool(t, srv, high, "urgent", holder, "model", "gpt-4o", 2)
	listed := waiters(t, srv, "model", "gpt-4o", 2)
	for i, want := range []httpapi.AdminTicket{
		{UserID: high, StreamID: holder, Place: 1, Priority: 5, Plan: "urgent"},
		{UserID: low, StreamID: "w-low", Place: 2, Priority: 0, Plan: "queued"},
	} {
		if w := listed.Waiters[i]; w.UserID != want.UserID || w.StreamID != want.StreamID || w.Place != want.Place || w.Priority != want.Priority ||
			w.Plan != want.Plan || w.Label != "e2e-wait" || w.WaitingSince.IsZero() || w.WaitedMs < 0 || !w.ExpiresAt.After(w.WaitingSince) {
			t.Errorf("waiter %d: got %+v, want %+v labelled e2e-wait, with its times", i+1, w, want)
		}
	}
	stopHigh()
	stopLow()

	max := strings.Repeat("k", 128)
	for _, tc := range []struct {
		name       string
		path       string
		token      string
		status     int
		code       string
		used, want int // a 200's holders and cap
	}{
		{"another case is another key, under the default cap", httpapi.AdminPoolKeyPath("model", "GPT-4o"), e2eViewerToken, 200, "", 0, 3},
		{"a key holding '/' is one escaped segment", httpapi.AdminPoolKeyPath("model", adminLlama), e2eViewerToken, 200, "", 0, 1},
		{"the '/' unescaped is no route", "/v1/admin/pools/model/keys/" + adminLlama, e2eViewerToken, 404, httpapi.CodeNotFound, 0, 0},
		{"the key .. is a key", httpapi.AdminPoolKeyPath("model", ".."), e2eViewerToken, 200, "", 0, 3},
		{"a key of 128 bytes", httpapi.AdminPoolKeyPath("model", max), e2eViewerToken, 200, "", 0, 3},
		{"a key of 129 bytes", httpapi.AdminPoolKeyPath("model", max+"k"), e2eViewerToken, 400, httpapi.CodeInvalidPoolKey, 0, 0},
		{"a pool not configured", httpapi.AdminPoolKeyPath("region", "eu"), e2eViewerToken, 422, httpapi.CodeUnknownPool, 0, 0},
		{"no token", httpapi.AdminPoolKeyPath("model", "gpt-4o"), "", 401, httpapi.CodeUnauthorized, 0, 0},
		{"a wrong token", httpapi.AdminPoolKeyPath("model", "gpt-4o"), "wrong-token-0123456789", 401, httpapi.CodeUnauthorized, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got httpapi.AdminPoolKeyResponse
			status, body := srv.admin(t, "GET", tc.path, tc.token, nil, &got)
			if status != tc.status || (tc.code != "" && !strings.Contains(string(body), `"code":"`+tc.code+`"`)) {
				t.Fatalf("got %d %s, want %d %s", status, body, tc.status, tc.code)
			}
			if status == http.StatusOK && (got.Used != tc.used || got.Limit == nil || *got.Limit != tc.want) {
				t.Errorf("got %+v, want %d holders, cap %d", got, tc.used, tc.want)
			}
		})
	}

	// An override of 3 lets a 3rd stream join, and no 4th.
	req := httpapi.AdminOverrideRequest{MaxConcurrentStreams: new(3), ExpiresIn: new(int64(3600)), Reason: "e2e: launch"}
	if status, body := srv.admin(t, "POST", httpapi.AdminPoolKeyOverridePath("model", "gpt-4o"), e2eViewerToken, req, nil); status != http.StatusForbidden {
		t.Errorf("a viewer's override: got %d %s, want 403", status, body)
	}
	var set httpapi.AdminPoolOverrideResponse
	if status, body := srv.admin(t, "POST", httpapi.AdminPoolKeyOverridePath("model", "gpt-4o"), e2eOperatorToken, req, &set); status != http.StatusOK ||
		set.Override.MaxConcurrentStreams != 3 || set.Override.Actor != "opal" {
		t.Fatalf("override: got %d %s, want 3 streams by opal", status, body)
	}
	if status := joinPool(t, srv, "pool-e2e-"+randomID(), "model", "gpt-4o"); status != http.StatusOK {
		t.Fatalf("a 3rd stream under the override of 3: got %d, want 200", status)
	}
	if status := joinPool(t, srv, "pool-e2e-"+randomID(), "model", "gpt-4o"); status != http.StatusTooManyRequests {
		t.Fatalf("a 4th stream under the override of 3: got %d, want 429", status)
	}
	if status := joinPool(t, srv, "pool-e2e-"+randomID(), "model", "GPT-4o"); status != http.StatusOK {
		t.Errorf("a stream of model=GPT-4o, another key: got %d, want 200", status)
	}
	var removed httpapi.AdminOverrideRemoveResponse
	if status, body := srv.admin(t, "DELETE", httpapi.AdminPoolKeyOverridePath("model", "gpt-4o"), e2eOperatorToken, httpapi.AdminOverrideRemoveRequest{Reason: "e2e: done"}, &removed); status != http.StatusOK || !removed.Removed {
		t.Fatalf("removal: got %d %s, want removed", status, body)
	}
	var audit httpapi.AuditResponse
	if status, _ := srv.admin(t, "GET", httpapi.PathAdminAudit, e2eViewerToken, nil, &audit); status != http.StatusOK || len(audit.Records) < 3 ||
		audit.Records[0].Action != httpapi.ActionRemoveOverride || audit.Records[0].Pool != "model" || audit.Records[0].Key != "gpt-4o" ||
		audit.Records[1].Action != httpapi.ActionSetOverride || audit.Records[1].Reason != "e2e: launch" {
		t.Errorf("audit: got %+v, want the removal then the override of model=gpt-4o, newest first", audit.Records)
	}
	if out := srv.Output(); !strings.Contains(out, `"pool":"model","key":"gpt-4o"`) {
		t.Errorf("serve log: want the audit records to name the pool key")
	}
}

// TestAdminPoolCLI runs `limiter admin pool` and `pool-override` against a
// running server: they show who holds and who waits for the pool key named
// and override it, a '/' in the key as it is, and refuse what the API
// refuses.
func TestAdminPoolCLI(t *testing.T) {
	srv := startAdminServer(t, adminPools)
	user := "pool-cli-" + randomID()
	if status := joinPool(t, srv, user, "model", adminLlama); status != http.StatusOK {
		t.Fatalf("acquire joining model=%s: got %d, want 200", adminLlama, status)
	}
	viewer := []string{"LIMITER_ADMIN_URL=" + srv.Admin, "LIMITER_ADMIN_TOKEN=" + e2eViewerToken}
	operator := []string{"LIMITER_ADMIN_URL=" + srv.Admin, "LIMITER_ADMIN_TOKEN=" + e2eOperatorToken}
	llamaKey := "pool key model=" + adminLlama

	// A waiter whose stream id spells the holder's user id is shown after
	// the holders, under its own user.
	waiter := "pool-cli-w-" + randomID()
	stop := waitInPool(t, srv, waiter, "urgent", user, "model", adminLlama, 1)
	code, stdout, stderr := runAdminCLI(t, viewer, "pool", "model", adminLlama)
	_, table, _ := strings.Cut(stdout, "1 acquire waiting, first served first:\n")
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if code != 0 || len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "PLACE PRIORITY USER STREAM ID PLAN CALLER LABEL WAITED" ||
		!strings.HasPrefix(strings.Join(strings.Fields(lines[1]), " "), "1 5 "+waiter+" "+user+" urgent - e2e-wait ") {
		t.Errorf("pool with a waiter: exit %d, stdout %q, stderr %q; want the waiter at place 1, priority 5, under its own user", code, stdout, stderr)
	}
	stop()
	for _, tc := range []cliCase{
		{"pool shows the holders with their users", viewer, []string{"pool", "model", adminLlama}, 0,
			llamaKey + ": 1 live membership, the pool's cap 1\nUSER", ""},
		{"pool names each holder's user", viewer, []string{"pool", "model", adminLlama}, 0, user, ""},
		{"another case is another key", viewer, []string{"pool", "model", "Meta-Llama/Llama-3.1-70B-Instruct"}, 0, "0 live memberships, the pool's cap 3", ""},
		{"a pool not configured is refused", viewer, []string{"pool", "region", "eu"}, 1, "", "422 unknown_pool"},
		{"a key of 129 bytes is refused", viewer, []string{"pool", "model", strings.Repeat("k", 129)}, 1, "", "400 invalid_pool_key"},
		{"a wrong token is refused", []string{"LIMITER_ADMIN_URL=" + srv.Admin, "LIMITER_ADMIN_TOKEN=wrong-token-0123456789"}, []string{"pool", "model", "gpt-4o"}, 1, "", "401 unauthorized: unknown token"},
		{"a viewer may not override", viewer, []string{"pool-override", "set", "model", adminLlama, "--max-streams", "2", "--expires-in", "1h", "--reason", "cli"}, 1, "", "403 forbidden: role viewer may not set override"},
		{"an override's cap is bounded like a pool's", operator, []string{"pool-override", "set", "model", adminLlama, "--max-streams", "100001", "--expires-in", "1h", "--reason", "cli"}, 2, "", "--max-streams must be 0 to 100000, got 100001"},
		{"a key the pool does not cap takes no override", operator, []string{"pool-override", "set", "org", "globex", "--max-streams", "2", "--expires-in", "1h", "--reason", "cli"}, 1, "", "400 invalid_request"},
		{"an operator overrides the cap", operator, []string{"pool-override", "set", "model", adminLlama, "--max-streams", "2", "--expires-in", "2h", "--reason", "ticket 9: launch"}, 0,
			llamaKey + ": override: 2 streams until", ""},
		{"pool shows the override", viewer, []string{"pool", "model", adminLlama}, 0, "override: 2 streams until", ""},
		{"an operator removes the override", operator, []string{"pool-override", "remove", "model", adminLlama, "--reason", "ticket 9: done"}, 0,
			"removed the override of " + llamaKey + ": the pool's cap applies again", ""},
		{"a second removal finds none", operator, []string{"pool-override", "remove", "model", adminLlama, "--reason", "ticket 9: done"}, 0, llamaKey + " had no override in force", ""},
		{"audit names the pool key", viewer, []string{"audit"}, 0, "model=" + adminLlama, ""},
	} {
		tc.run(t)
	}
	t.Run("the override judged the key's streams", func(t *testing.T) {
		code, stdout, stderr := runAdminCLI(t, operator, "pool-override", "set", "model", adminLlama, "--max-streams", "2", "--expires-in", "1h", "--reason", "again")
		if code != 0 {
			t.Fatalf("set: exit %d, %s %s", code, stdout, stderr)
		}
		if status := joinPool(t, srv, "pool-cli-"+randomID(), "model", adminLlama); status != http.StatusOK {
			t.Errorf("a 2nd stream under the override of 2: got %d, want 200", status)
		}
		if status := joinPool(t, srv, "pool-cli-"+randomID(), "model", adminLlama); status != http.StatusTooManyRequests {
			t.Errorf("a 3rd stream under the override of 2: got %d, want 429", status)
		}
		code, stdout, _ = runAdminCLI(t, viewer, "pool", "model", adminLlama)
		if code != 0 || !strings.Contains(stdout, "2 live memberships, the pool's cap 1\noverride: 2 streams") {
			t.Errorf("pool after the override: exit %d, %q; want 2 memberships under the override of 2", code, stdout)
		}
	})
}

// TestAdminListsTheFirstThousandHolders: a pool key may hold far more
// streams than a listing can read at once without holding Redis from
// every acquire. Its listing names the first 1,000 holders to expire and
// counts them all (used), and `limiter admin pool` says how many it does
// not list. Bounds: 1,000 holders are all listed, with no such line; of
// 1,001, one is not listed.
func TestAdminListsTheFirstThousandHolders(t *testing.T) {
	srv := startAdminServer(t, "pools:\n  static:\n    - pool: team\n      maxConcurrentStreams: 2000\n")
	key := "wide-" + randomID()
	join := func(n int) {
		t.Helper()
		var wg sync.WaitGroup
		failed := make(chan int, n)
		next := make(chan int, n)
		for i := range n {
			next <- i
		}
		close(next)
		for range 8 {
			wg.Go(func() {
				for range next {
					if status := joinPool(t, srv, "wide-"+randomID(), "team", key); status != http.StatusOK {
						failed <- status
					}
				}
			})
		}
		wg.Wait()
		close(failed)
		for status := range failed {
			t.Fatalf("acquire joining team=%s: got %d, want 200", key, status)
		}
	}
	viewer := []string{"LIMITER_ADMIN_URL=" + srv.Admin, "LIMITER_ADMIN_TOKEN=" + e2eViewerToken}
	for _, tc := range []struct {
		join, used, listed int
		note               string // what the CLI says of those not listed
	}{
		{join: 1000, used: 1000, listed: 1000},
		{join: 1, used: 1001, listed: 1000, note: "(the first 1000 of 1001 to expire; 1 more not listed)"},
	} {
		join(tc.join)
		var got httpapi.AdminPoolKeyResponse
		if status, body := srv.admin(t, "GET", httpapi.AdminPoolKeyPath("team", key), e2eViewerToken, nil, &got); status != http.StatusOK ||
			got.Used != tc.used || len(got.Holders) != tc.listed {
			t.Fatalf("team=%s: %d, used %d, %d listed (%.200s); want used %d, %d listed", key, status, got.Used, len(got.Holders), body, tc.used, tc.listed)
		}
		for i := 1; i < len(got.Holders); i++ {
			if got.Holders[i].ExpiresAt.Before(got.Holders[i-1].ExpiresAt) {
				t.Fatalf("holder %d expires at %v, before holder %d's %v: want the earliest expiry first", i, got.Holders[i].ExpiresAt, i-1, got.Holders[i-1].ExpiresAt)
			}
		}
		code, stdout, stderr := runAdminCLI(t, viewer, "pool", "team", key)
		rows := strings.Count("\n"+stdout, "\nwide-") // a holder's line starts with its user
		if code != 0 || rows != tc.listed || !strings.Contains(stdout, fmt.Sprintf("%d live memberships", tc.used)) ||
			strings.Contains(stdout, "not listed") != (tc.note != "") || !strings.Contains(stdout, tc.note) {
			t.Errorf("limiter admin pool team %s with %d holders: exit %d, %d rows, stderr %q; want %d rows and %q\n%.300s", key, tc.used, code, rows, stderr, tc.listed, tc.note, stdout)
		}
	}
}
