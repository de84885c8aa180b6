package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

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

// The pool commands reach the pool key they name, whatever its spelling:
// a model name's '/' stays in the key, dots are not path steps, case is
// kept; the text output names each holder's user.
func TestAdminPoolCommandsAddressAnyKey(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+httpapi.PathAdminPoolKey, func(w http.ResponseWriter, r *http.Request) {
		limit := 3
		_ = json.NewEncoder(w).Encode(httpapi.AdminPoolKeyResponse{Pool: r.PathValue("pool"), Key: r.PathValue("key"), Used: 1, Limit: &limit,
			Holders: []httpapi.AdminSlot{{UserID: "u-holder", StreamID: "s-1", Caller: "chat-api", Plan: "paid", ExpiresAt: time.Now(), TTLMs: 9000}},
			// The first waiter's stream id spells the holder's user id: it is
			// shown under its own user.
			Waiters: []httpapi.AdminTicket{
				{UserID: "u-high", StreamID: "u-holder", Place: 1, Priority: 5, Plan: "enterprise", Caller: "chat-api", Label: "pod-7", WaitedMs: 1250},
				{UserID: "u-low", StreamID: "s-2", Place: 2, Priority: 0, Plan: "paid", WaitedMs: 4200},
			}})
	})
	mux.HandleFunc("POST "+httpapi.PathAdminPoolKeyOverride, func(w http.ResponseWriter, r *http.Request) {
		var req httpapi.AdminOverrideRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		_ = json.NewEncoder(w).Encode(httpapi.AdminPoolOverrideResponse{Pool: r.PathValue("pool"), Key: r.PathValue("key"),
			Override: httpapi.AdminOverride{MaxConcurrentStreams: *req.MaxConcurrentStreams, Reason: req.Reason}, AuditID: "0123456789abcdef"})
	})
	mux.HandleFunc("DELETE "+httpapi.PathAdminPoolKeyOverride, func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(httpapi.AdminOverrideRemoveResponse{Removed: r.PathValue("pool")+"="+r.PathValue("key") == "model=gpt-4o", AuditID: "0123456789abcdef"})
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for _, key := range []string{"gpt-4o", "GPT-4o", "meta-llama/Llama-3.1-70B-Instruct", ".", "..", "a.b", "org:acme@eu"} {
		t.Run(key, func(t *testing.T) {
			var shown httpapi.AdminPoolKeyResponse
			runAdmin(t, &shown, "pool", "model", key, "--url", srv.URL, "--token", "t", "-o", "json")
			if shown.Pool != "model" || shown.Key != key {
				t.Errorf("pool model %q: the server got %s=%s", key, shown.Pool, shown.Key)
			}
			var set httpapi.AdminPoolOverrideResponse
			runAdmin(t, &set, "pool-override", "set", "model", key, "--max-streams", "7", "--expires-in", "1h", "--reason", "test", "--url", srv.URL, "--token", "t", "-o", "json")
			if set.Pool != "model" || set.Key != key || set.Override.MaxConcurrentStreams != 7 {
				t.Errorf("pool-override set model %q: the server got %s=%s, %d streams", key, set.Pool, set.Key, set.Override.MaxConcurrentStreams)
			}
		})
	}

	// A key that starts with '-' comes after "--", which ends the flags.
	for _, key := range []string{"-eu", "-1", "--x"} {
		var shown httpapi.AdminPoolKeyResponse
		runAdmin(t, &shown, "pool", "--url", srv.URL, "--token", "t", "-o", "json", "model", "--", key)
		if shown.Pool != "model" || shown.Key != key {
			t.Errorf("pool model -- %q: the server got %s=%s", key, shown.Pool, shown.Key)
		}
		var removed httpapi.AdminOverrideRemoveResponse
		runAdmin(t, &removed, "pool-override", "remove", "--reason", "test", "--url", srv.URL, "--token", "t", "-o", "json", "--", "model", key)
	}

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"the key's holders with their users", []string{"pool", "model", "gpt-4o"},
			"pool key model=gpt-4o: 1 live membership, the pool's cap 3\nUSER      STREAM ID  AGE  CALLER    PLAN  LABEL"},
		{"the key's waiters, first served first, each under its own user", []string{"pool", "model", "gpt-4o"},
			"2 acquires waiting, first served first:\n" +
				"PLACE  PRIORITY  USER    STREAM ID  PLAN        CALLER    LABEL  WAITED\n" +
				"1      5         u-high  u-holder   enterprise  chat-api  pod-7  1.3s\n" +
				"2      0         u-low   s-2        paid        -         -      4.2s\n"},
		{"a removal says what applies again", []string{"pool-override", "remove", "model", "gpt-4o", "--reason", "done"},
			"removed the override of pool key model=gpt-4o: the pool's cap applies again\n"},
		{"a removal that found none", []string{"pool-override", "remove", "model", "GPT-4o", "--reason", "done"},
			"pool key model=GPT-4o had no override in force\n"},
		{"a set names the pool key", []string{"pool-override", "set", "model", "gpt-4o", "--max-streams", "7", "--expires-in", "1h", "--reason", "r"},
			"pool key model=gpt-4o: override: 7 streams until"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if out := runAdminText(t, append(tc.args, "--url", srv.URL, "--token", "t")...); !strings.Contains(out, tc.want) {
				t.Errorf("admin %v: got %q, want it to hold %q", tc.args, out, tc.want)
			}
		})
	}
}

// The admin commands, the pool keys' and the users', check their
// arguments and flags before any call.
func TestAdminCommandsCheckTheirArguments(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"pool needs a key", []string{"pool", "model"}, "accepts 2 arg(s), received 1"},
		{"pool-override set needs a key", []string{"pool-override", "set", "model", "--max-streams", "1", "--expires-in", "1h", "--reason", "r"}, "accepts 2 arg(s), received 1"},
		{"a limit of 100001 is refused", []string{"pool-override", "set", "model", "gpt-4o", "--max-streams", "100001", "--expires-in", "1h", "--reason", "r"}, "--max-streams must be 0 to 100000, got 100001"},
		{"a limit of -1 is refused", []string{"pool-override", "set", "model", "gpt-4o", "--max-streams", "-1", "--expires-in", "1h", "--reason", "r"}, "--max-streams must be 0 to 100000, got -1"},
		{"59s is refused", []string{"pool-override", "set", "model", "gpt-4o", "--max-streams", "1", "--expires-in", "59s", "--reason", "r"}, "--expires-in must be whole seconds from 1m0s to 720h0m0s, got 59s"},
		{"30 days and a second is refused", []string{"pool-override", "set", "model", "gpt-4o", "--max-streams", "1", "--expires-in", "720h0m1s", "--reason", "r"}, "got 720h0m1s"},
		{"no limit names the pool key's cap", []string{"pool-override", "set", "model", "gpt-4o", "--expires-in", "1h", "--reason", "r"}, "--max-streams is required: the pool key's cap while the override is in force"},
		{"a removal needs a reason", []string{"pool-override", "remove", "model", "gpt-4o"}, "--reason is required"},
		// An empty argument would address another path (no route), not
		// the user or key: a usage error naming it.
		{"an empty user", []string{"slots", ""}, "USER is empty"},
		{"an empty user to release", []string{"release", " ", "--reason", "r"}, "USER is empty"},
		{"an empty user's override", []string{"override", "set", "", "--max-streams", "1", "--expires-in", "1h", "--reason", "r"}, "USER is empty"},
		{"an empty key", []string{"pool", "model", ""}, "KEY is empty"},
		{"an empty pool's override", []string{"pool-override", "remove", "", "k", "--reason", "r"}, "POOL is empty"},
		{"a reason of 501 characters", []string{"release", "u", "--reason", strings.Repeat("a", 501)}, "--reason is 501 characters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := newAdminCommand()
			cmd.SetOut(io.Discard)
			cmd.SetErr(io.Discard)
			cmd.SetArgs(append(tc.args, "--url", "http://127.0.0.1:1", "--token", "t"))
			if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("admin %v: got %v, want an error saying %q", tc.args, err, tc.want)
			}
		})
	}
}

// runAdminText runs `limiter admin args...` and returns its text output.
func runAdminText(t *testing.T, args ...string) string {
	t.Helper()
	cmd := newAdminCommand()
	var stdout, stderr bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	cmd.SetArgs(args)
	if err := cmd.Execute(); err != nil {
		t.Fatalf("admin %v: got %v (stderr %q), want success", args, err, stderr.String())
	}
	return stdout.String()
}

// runAdmin runs `limiter admin args...` and decodes its JSON output into out.
func runAdmin(t *testing.T, out any, args ...string) {
	t.Helper()
	stdout := runAdminText(t, args...)
	if err := json.Unmarshal([]byte(stdout), out); err != nil {
		t.Fatalf("admin %v: output %q: %v", args, stdout, err)
	}
}

// slots lists the user's waiting acquires after the slots, first served
// first, with their priority and plan; nothing when none waits.
func TestAdminSlotsShowsTheQueue(t *testing.T) {
	queue := []httpapi.AdminTicket{
		{StreamID: "w-high", Place: 1, Priority: 5, Plan: "enterprise", Caller: "chat-api", Label: "pod-7", WaitedMs: 300},
		{StreamID: "w-low", Place: 2, Priority: 0, Plan: "paid", WaitedMs: 61_000},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+httpapi.PathAdminUserSlots, func(w http.ResponseWriter, r *http.Request) {
		out := httpapi.AdminSlotsResponse{UserID: r.PathValue("user_id"), Used: 1, Queue: []httpapi.AdminTicket{},
			Slots: []httpapi.AdminSlot{{StreamID: "s-1", Plan: "paid", ExpiresAt: time.Now(), TTLMs: 9000}}}
		if out.UserID == "u-queued" {
			out.Queue = queue
		}
		_ = json.NewEncoder(w).Encode(out)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for _, tc := range []struct {
		name, user, want string
	}{
		{"the queue by priority, then arrival", "u-queued", "2 acquires waiting, first served first:\n" +
			"PLACE  PRIORITY  STREAM ID  PLAN        CALLER    LABEL  WAITED\n" +
			"1      5         w-high     enterprise  chat-api  pod-7  300ms\n" +
			"2      0         w-low      paid        -         -      1m1s\n"},
		{"no queue, no table", "u-alone", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := runAdminText(t, "slots", tc.user, "--url", srv.URL, "--token", "t")
			_, queue, _ := strings.Cut(out, "EXPIRES AT\n")
			_, queue, _ = strings.Cut(queue, "\n") // the slot's line
			if queue != tc.want {
				t.Errorf("slots %s: got after the slots %q, want %q (output %q)", tc.user, queue, tc.want, out)
			}
		})
	}
}

// slots and pool mark a limit in shadow mode (enforce: false), which
// refuses nothing, so the count above it is no lockout; a limit that
// refuses, and one from a server older than the field, are not marked.
func TestAdminShowsShadowMode(t *testing.T) {
	enforce, shadowed := true, false
	three, one := 3, 1
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+httpapi.PathAdminUserSlots, func(w http.ResponseWriter, r *http.Request) {
		out := httpapi.AdminSlotsResponse{UserID: r.PathValue("user_id"), Slots: []httpapi.AdminSlot{}, Queue: []httpapi.AdminTicket{}}
		switch out.UserID {
		case "u-shadow":
			out.Used, out.PlanLimits = 3, []httpapi.AdminPlanLimit{{Plan: "trial", Limit: 1, Enforce: &shadowed}}
		case "u-both":
			out.Used, out.PlanLimits = 2, []httpapi.AdminPlanLimit{{Plan: "paid", Limit: 3, Enforce: &enforce}, {Plan: "trial", Limit: 1, Enforce: &shadowed}}
		case "u-enforced":
			out.Used, out.PlanLimits = 1, []httpapi.AdminPlanLimit{{Plan: "paid", Limit: 3, Enforce: &enforce}}
		case "u-old-server":
			out.Used, out.PlanLimits = 1, []httpapi.AdminPlanLimit{{Plan: "paid", Limit: 3}}
		}
		_ = json.NewEncoder(w).Encode(out)
	})
	mux.HandleFunc("GET "+httpapi.PathAdminPoolKey, func(w http.ResponseWriter, r *http.Request) {
		out := httpapi.AdminPoolKeyResponse{Pool: r.PathValue("pool"), Key: r.PathValue("key"), Holders: []httpapi.AdminSlot{}, Waiters: []httpapi.AdminTicket{}}
		switch out.Pool {
		case "provider":
			out.Used, out.Limit, out.Enforce = 2, &one, &shadowed
		case "model":
			out.Used, out.Limit, out.Enforce = 3, &three, &enforce
		case "old":
			out.Used, out.Limit = 3, &three
		case "uncapped":
			out.Enforce = &shadowed
		case "deleted": // as the replica that saw the deletion lists it
			out.Used, out.Limit, out.Enforce, out.Deleted = 1, &three, &shadowed, true
		case "gone": // as one started since does
			out.Used, out.Enforce, out.Deleted = 1, &enforce, true
		}
		_ = json.NewEncoder(w).Encode(out)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for _, tc := range []struct {
		name       string
		args       []string
		want       string
		wantShadow bool
	}{
		{"a plan in shadow mode", []string{"slots", "u-shadow"},
			"user u-shadow: 3 live slots\nlimit: plan trial allows 1 (shadow - not enforced: nothing is refused, acquires over it are counted as would_refuse)\n", true},
		{"a plan in shadow mode beside one that refuses", []string{"slots", "u-both"},
			"limits: plan paid allows 3; plan trial allows 1 (shadow - not enforced", true},
		{"a plan that refuses: no limit line, as before the mark", []string{"slots", "u-enforced"}, "user u-enforced: 1 live slot\n", false},
		{"a server older than the field", []string{"slots", "u-old-server"}, "user u-old-server: 1 live slot\n", false},
		{"a pool in shadow mode", []string{"pool", "provider", "openai"},
			"pool key provider=openai: 2 live memberships, the pool's cap 1 (shadow - not enforced: nothing is refused, streams over it are counted as would_refuse)\n", true},
		{"a pool that refuses", []string{"pool", "model", "gpt-4o"}, "pool key model=gpt-4o: 3 live memberships, the pool's cap 3\n", false},
		{"a pool from a server older than the field", []string{"pool", "old", "k"}, "pool key old=k: 3 live memberships, the pool's cap 3\n", false},
		{"a key not capped has no cap to mark", []string{"pool", "uncapped", "k"}, "pool key uncapped=k: 0 live memberships, not capped\n", false},
		{"a deleted pool, its last cap known", []string{"pool", "deleted", "k"},
			"pool key deleted=k: 1 live membership, pool deleted: its holders run on until they end, none joins it (its last cap 3)\n", false},
		{"a deleted pool, its last cap not known", []string{"pool", "gone", "k"},
			"pool key gone=k: 1 live membership, pool deleted: its holders run on until they end, none joins it\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := runAdminText(t, append(tc.args, "--url", srv.URL, "--token", "t")...)
			if !strings.Contains(out, tc.want) {
				t.Errorf("admin %v: got %q, want it to hold %q", tc.args, out, tc.want)
			}
			if got := strings.Contains(out, "shadow"); got != tc.wantShadow {
				t.Errorf("admin %v: got %q, marked shadow %v, want %v", tc.args, out, got, tc.wantShadow)
			}
		})
	}
}

// A word that names no admin command is a usage error (exit 2), with the
// command it was likely meant for, not the help with exit 0 that a
// script would take for done; a group alone prints its help.
func TestAdminRefusesAnUnknownCommand(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"admin", "relase", "ana"}, 2, `unknown command "relase" for "limiter admin"; did you mean release?`},
		{[]string{"admin", "override", "delete", "ana"}, 2, `unknown command "delete" for "limiter admin override"`},
		{[]string{"admin", "pool-override", "unset", "model", "k"}, 2, `unknown command "unset" for "limiter admin pool-override"`},
		{[]string{"admin", "override"}, 0, ""},
		{[]string{"admin"}, 0, ""},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), tc.args, &stdout, &stderr)
		if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("limiter %v: exit %d, stderr %q; want exit %d saying %q", tc.args, code, stderr.String(), tc.code, tc.want)
		}
		if tc.code == 0 && !strings.Contains(stdout.String(), "Usage:") {
			t.Errorf("limiter %v printed %q; want its help", tc.args, stdout.String())
		}
	}
}

// An admin URL where nothing listens is said to be that (exit 1), not
// "limiter unavailable", the API's word for a Redis outage, and the
// message is prefixed once.
func TestAdminSaysWhenItsURLDoesNotAnswer(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"admin", "slots", "B", "--url", "http://127.0.0.1:1", "--token", "t"}, &stdout, &stderr)
	want := "limiter: the admin API did not answer GET http://127.0.0.1:1/v1/admin/users/B/slots: "
	if code != 1 || !strings.HasPrefix(stderr.String(), want) || strings.Contains(stderr.String(), "limiter unavailable") || !strings.Contains(stderr.String(), "admin.addr") {
		t.Errorf("exit %d, stderr %q; want exit 1, starting %q and naming admin.addr", code, stderr.String(), want)
	}
}

// audit's text says what each call changed, as the admin page does: the
// slots a release freed, the override set or removed, and for a refused
// set_override what it asked for (the numbers as sent), so that a refusal
// at 3 a.m. says why without -o json.
func TestAdminAuditSaysWhatEachCallChanged(t *testing.T) {
	until := time.Date(2026, 12, 8, 3, 0, 0, 0, time.UTC)
	removed, none := true, false
	streams, expires, negative := 1001, int64(86400), int64(-5)
	one := 1
	records := []httpapi.AuditRecord{
		{Action: httpapi.ActionReleaseAll, Outcome: httpapi.OutcomeOK, UserID: "u1", Released: []string{"a", "b", "c"}, AuditID: "r1"},
		{Action: httpapi.ActionReleaseAll, Outcome: httpapi.OutcomeOK, UserID: "u2", Released: []string{}, AuditID: "r2"},
		{Action: httpapi.ActionSetOverride, Outcome: httpapi.OutcomeOK, UserID: "u3", Override: &httpapi.AuditOverride{MaxConcurrentStreams: 5, ExpiresAt: until},
			Asked: &httpapi.AuditOverrideAsked{MaxConcurrentStreams: &one, ExpiresIn: &expires}, AuditID: "s1"},
		{Action: httpapi.ActionRemoveOverride, Outcome: httpapi.OutcomeOK, UserID: "u4", OverrideRemoved: &removed, AuditID: "d1"},
		{Action: httpapi.ActionRemoveOverride, Outcome: httpapi.OutcomeOK, UserID: "u5", OverrideRemoved: &none, AuditID: "d2"},
		{Action: httpapi.ActionSetOverride, Outcome: "invalid_request", Status: 400, UserID: "u6", Asked: &httpapi.AuditOverrideAsked{MaxConcurrentStreams: &streams, ExpiresIn: &expires}, AuditID: "s2"},
		{Action: httpapi.ActionSetOverride, Outcome: "invalid_request", Status: 400, UserID: "u7", Asked: &httpapi.AuditOverrideAsked{ExpiresIn: &negative}, AuditID: "s3"},
		{Action: httpapi.ActionSetOverride, Outcome: "invalid_request", Status: 400, UserID: "u8", Asked: &httpapi.AuditOverrideAsked{}, AuditID: "s4"},
		{Action: httpapi.ActionListSlots, Outcome: httpapi.OutcomeOK, UserID: "u9", AuditID: "l1"},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+httpapi.PathAdminAudit, func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(httpapi.AuditResponse{Records: records})
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	text := runAdminText(t, "audit", "--url", srv.URL, "--token", "t")
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if len(lines) != len(records)+1 || !strings.Contains(lines[0], "RESULT") {
		t.Fatalf("audit's text: %q; want a header with RESULT and one line per record", text)
	}
	for i, want := range []string{
		"3 slots released",
		"0 slots released",
		"5 streams until 2026-12-08T03:00:00Z",
		"removed",
		"none in force",
		"asked 1001 streams for 86400s",
		"asked for -5s",
		"-",
		"-",
	} {
		line := lines[i+1]
		from, to := strings.Index(lines[0], "RESULT"), strings.Index(lines[0], "REASON")
		if got := strings.TrimSpace(line[from:to]); got != want || !strings.HasSuffix(line, records[i].AuditID) {
			t.Errorf("audit line of %s %s: %q; want its result %q, got %q", records[i].Action, records[i].AuditID, line, want, got)
		}
	}
}

// audit asks for --limit records (1 to 1000; 0 and 1001 are usage
// errors), and its text output cuts a long reason so that one 500
// characters long does not widen every row; -o json gives it whole.
func TestAdminAuditTakesALimitAndCutsLongReasons(t *testing.T) {
	long := strings.Repeat("r", 500)
	var asked []string
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+httpapi.PathAdminAudit, func(w http.ResponseWriter, r *http.Request) {
		asked = append(asked, r.URL.Query().Get("limit"))
		_ = json.NewEncoder(w).Encode(httpapi.AuditResponse{Records: []httpapi.AuditRecord{{Actor: "ops", Action: httpapi.ActionReleaseAll, Outcome: httpapi.OutcomeOK, Reason: long, AuditID: "a1"}}})
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	text := runAdminText(t, "audit", "--limit", "2", "--url", srv.URL, "--token", "t")
	if strings.Contains(text, long) || !strings.Contains(text, strings.Repeat("r", 59)+"…") {
		t.Errorf("audit's text: %q; want the reason cut to 60 characters", text)
	}
	var out httpapi.AuditResponse
	runAdmin(t, &out, "audit", "--url", srv.URL, "--token", "t", "-o", "json")
	if len(out.Records) != 1 || out.Records[0].Reason != long {
		t.Errorf("audit -o json: %+v; want the reason whole", out.Records)
	}
	runAdminText(t, "audit", "--limit", "1000", "--url", srv.URL, "--token", "t")
	runAdminText(t, "audit", "--limit", "1", "--url", srv.URL, "--token", "t")
	if want := []string{"2", "50", "1000", "1"}; !slices.Equal(asked, want) {
		t.Errorf("the limits asked: %q; want %q", asked, want)
	}
	for _, bad := range []string{"0", "1001"} {
		var stderr bytes.Buffer
		if code := run(context.Background(), []string{"admin", "audit", "--limit", bad, "--url", srv.URL, "--token", "t"}, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), "--limit must be 1 to 1000, got "+bad) {
			t.Errorf("audit --limit %s: exit %d, %q; want exit 2 naming the bounds", bad, code, stderr.String())
		}
	}
}

// --reason is measured as the admin API measures it, runs of whitespace
// as one space: 500 characters so counted pass, 501 do not.
func TestAdminReasonIsMeasuredAsTheAPIMeasuresIt(t *testing.T) {
	for _, tc := range []struct {
		reason string
		ok     bool
	}{
		{strings.Repeat("a", 490) + strings.Repeat(" ", 10) + strings.Repeat("x", 9), true}, // 509 written, 500 counted
		{strings.Repeat("a", 490) + "\n\n\t" + strings.Repeat("x", 9), true},
		{strings.Repeat("a", 500), true},
		{strings.Repeat("a", 490) + strings.Repeat(" ", 10) + strings.Repeat("x", 10), false}, // 501 counted
	} {
		if err := checkReasonFlag(tc.reason, ""); (err == nil) != tc.ok {
			t.Errorf("a reason of %d characters written (%d counted): %v; want accepted %t", len(tc.reason), len(strings.Join(strings.Fields(tc.reason), " ")), err, tc.ok)
		}
	}
}

// A change sent that the admin API did not answer within --timeout may
// have been made all the same: the CLI says so, and how to see; a
// listing that timed out is only unanswered.
func TestAdminSaysAChangeUnansweredMayHaveBeenDone(t *testing.T) {
	hang := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-hang }))
	t.Cleanup(func() { close(hang); srv.Close() })
	for _, tc := range []struct {
		args  []string
		maybe bool
	}{
		{[]string{"admin", "release", "u-1", "--reason", "ticket 1"}, true},
		{[]string{"admin", "override", "remove", "u-1", "--reason", "ticket 1"}, true},
		{[]string{"admin", "slots", "u-1"}, false},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), append(tc.args, "--url", srv.URL, "--token", "t", "--timeout", "200ms"), &stdout, &stderr)
		said := strings.Contains(stderr.String(), "it may have been done all the same")
		if code != 1 || said != tc.maybe {
			t.Errorf("limiter %v unanswered: exit %d, stderr %q; want exit 1, saying it may have been done: %t", tc.args, code, stderr.String(), tc.maybe)
		}
	}

	// A --url whose connection never opens (its host drops the SYN, its
	// dial times out): nothing was sent, so --url is to blame.
	addr := fullBacklogAddr(t)
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"admin", "release", "u-1", "--reason", "ticket 1", "--url", "http://" + addr, "--token", "t", "--timeout", "500ms"}, &stdout, &stderr)
	if code != 1 || strings.Contains(stderr.String(), "it may have been done all the same") || !strings.Contains(stderr.String(), "--url") {
		t.Errorf("limiter admin release, its --url never connected: exit %d, stderr %q; want exit 1, naming --url, not saying it may have been done", code, stderr.String())
	}
}

// fullBacklogAddr is the address of a socket that listens with a backlog
// of 0, never accepts, and whose queue is full: a further connect's SYN
// is dropped, and its dial times out.
func fullBacklogAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	for range 8 {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			return addr // full
		}
		t.Cleanup(func() { c.Close() })
	}
	t.Fatalf("could not fill the accept queue of %s", addr)
	return ""
}
