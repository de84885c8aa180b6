package server_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/server"
)

// Callers of the API tokens file of these tests: chat may use three and
// one, batch only one, ops every plan, and certy has no token (a client
// certificate only).
const (
	chatToken   = "chat-token-0123456789abcdef"
	batchToken  = "batch-token-0123456789abcdef"
	opsToken    = "ops-token-0123456789abcdef"
	unknownTok  = "not-a-caller-0123456789abcdef"
	callerLines = "# callers of the slot API\n" +
		"chat   " + chatToken + "   three,one\n" +
		"batch  " + batchToken + "  one\n" +
		"ops    " + opsToken + "    *\n" +
		"certy  -  three\n"
)

// writeCallers writes content as a tokens file and returns its path.
func writeCallers(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "api-tokens")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// authEnv is the API with callers authenticated, its limiter and its log.
type authEnv struct {
	*api
	lim *limiter.Limiter
	log *logSink
}

func newAuthEnv(t *testing.T, tokensFile string, poll time.Duration) (*authEnv, *server.Callers) {
	t.Helper()
	return newAuthEnvOf(t, tokensFile, poll, limitertest.Options{})
}

// newAuthEnvOf is newAuthEnv on a limiter of opts (its tiers, say).
func newAuthEnvOf(t *testing.T, tokensFile string, poll time.Duration, opts limitertest.Options) (*authEnv, *server.Callers) {
	t.Helper()
	sink := &logSink{}
	logger := slog.New(slog.NewJSONHandler(sink, nil))
	callers, err := server.LoadCallers(server.CallersOptions{TokensFile: tokensFile, PollInterval: poll, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	lim := limitertest.New(t, opts).Limiter
	return &authEnv{api: newAPIOf(t, server.New(lim, server.Options{Logger: logger, Callers: callers})), lim: lim, log: sink}, callers
}

// as calls the API with token as the bearer token (none when empty).
func (e *authEnv) as(t *testing.T, token, method, path string, body any) reply {
	t.Helper()
	var data []byte
	if body != nil {
		data = mustJSON(t, body)
	}
	header := http.Header{}
	if token != "" {
		header.Set("Authorization", "Bearer "+token)
	}
	return e.callWith(t, method, path, data, false, header)
}

// used returns how many slots user holds.
func (e *authEnv) used(t *testing.T, user string) int {
	t.Helper()
	got, err := e.lim.Slots(context.Background(), user)
	if err != nil {
		t.Fatal(err)
	}
	return got.Used
}

// matrixCaller is one kind of caller of the auth matrix.
type matrixCaller struct {
	name   string      // of the case
	caller string      // its name in the tokens file; "" when unknown
	plan   bool        // may use plan three
	via    *api        // sends its calls (with its client certificate, if any)
	header http.Header // its Authorization header, if any
}

func bearerHeader(token string) http.Header {
	return http.Header{"Authorization": {"Bearer " + token}}
}

// runAuthMatrix calls every slot route as each caller, for a user holding
// a slot of plan three, and checks the answer: 401 for an unknown caller,
// 403 for a route naming a plan the caller may not use, else the route's
// 200.
func runAuthMatrix(t *testing.T, lim *limiter.Limiter, callers []matrixCaller) {
	t.Helper()
	user := newUser(t)
	held, err := lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "three", StreamID: "held"})
	if err != nil || !held.Granted {
		t.Fatalf("acquire: %+v, %v", held, err)
	}
	slot := httpapi.HeartbeatRequest{UserID: user, Plan: "three", StreamID: "held"}
	routes := []struct {
		name, method, path string
		body               any
		planned            bool // names a plan: refused for a caller without it
		ok                 func(t *testing.T, r reply, c matrixCaller)
	}{
		{name: "acquire", method: "POST", path: httpapi.PathAcquire, planned: true,
			body: httpapi.AcquireRequest{UserID: user, Plan: "three", StreamID: "held"},
			ok: func(t *testing.T, r reply, _ matrixCaller) {
				got := decode[httpapi.AcquireResponse](t, r, http.StatusOK)
				if !got.Granted || got.Used != 1 {
					t.Errorf("got %+v, want granted with used 1 (the held slot)", got)
				}
			}},
		{name: "heartbeat", method: "POST", path: httpapi.PathHeartbeat, planned: true, body: slot,
			ok: func(t *testing.T, r reply, _ matrixCaller) {
				if got := decode[httpapi.HeartbeatResponse](t, r, http.StatusOK); !got.Alive {
					t.Errorf("got %+v, want alive", got)
				}
			}},
		{name: "heartbeats", method: "POST", path: httpapi.PathHeartbeats, body: httpapi.HeartbeatsRequest{Slots: []httpapi.HeartbeatRequest{slot}},
			ok: func(t *testing.T, r reply, c matrixCaller) {
				got := decode[httpapi.HeartbeatsResponse](t, r, http.StatusOK)
				if len(got.Results) != 1 {
					t.Fatalf("results: got %+v, want 1", got.Results)
				}
				res := got.Results[0]
				if !c.plan {
					// A plan outside the caller's is refused per slot.
					if res.Alive || res.Error == nil || res.Error.Code != httpapi.CodePlanNotAllowed {
						t.Errorf("got %+v, want not alive with error plan_not_allowed", res)
					}
					return
				}
				if !res.Alive || res.Error != nil {
					t.Errorf("got %+v, want alive", res)
				}
			}},
		{name: "release", method: "POST", path: httpapi.PathRelease, body: httpapi.ReleaseRequest{UserID: user, StreamID: "never-held"},
			ok: func(t *testing.T, r reply, _ matrixCaller) {
				if got := decode[httpapi.ReleaseResponse](t, r, http.StatusOK); got.Released {
					t.Errorf("got %+v, want released false (never held)", got)
				}
			}},
		{name: "tiers", method: "GET", path: httpapi.PathTiers,
			ok: func(t *testing.T, r reply, _ matrixCaller) {
				if got := decode[httpapi.TiersResponse](t, r, http.StatusOK); len(got.Tiers) != len(limitertest.Tiers()) {
					t.Errorf("tiers: got %d, want %d", len(got.Tiers), len(limitertest.Tiers()))
				}
			}},
	}
	for _, rt := range routes {
		for _, c := range callers {
			t.Run(rt.name+": "+c.name, func(t *testing.T) {
				var body []byte
				if rt.body != nil {
					body = mustJSON(t, rt.body)
				}
				r := c.via.callWith(t, rt.method, rt.path, body, false, c.header)
				switch {
				case c.caller == "":
					wantError(t, r, http.StatusUnauthorized, httpapi.CodeUnauthenticated)
					challenge := r.header.Get("WWW-Authenticate")
					if !strings.HasPrefix(challenge, "Bearer ") || strings.Contains(challenge, "invalid_token") != (c.header != nil) {
						t.Errorf("WWW-Authenticate: got %q, want a Bearer challenge, with error=\"invalid_token\" only for a token sent", challenge)
					}
				case rt.planned && !c.plan:
					e := wantError(t, r, http.StatusForbidden, httpapi.CodePlanNotAllowed)
					if !strings.Contains(e.Message, `"three"`) || !strings.Contains(e.Message, strconv.Quote(c.caller)) || strings.Contains(e.Message, "token-") {
						t.Errorf("message: got %q, want it to name the plan and the caller, not the token", e.Message)
					}
				default:
					rt.ok(t, r, c)
				}
			})
		}
	}
}

func TestAPIAuthMatrix(t *testing.T) {
	t.Parallel()
	e, _ := newAuthEnv(t, writeCallers(t, callerLines), 0)
	runAuthMatrix(t, e.lim, []matrixCaller{
		{name: "no token", via: e.api},
		{name: "an unknown token", via: e.api, header: bearerHeader(unknownTok)},
		{name: "a caller without the plan", caller: "batch", via: e.api, header: bearerHeader(batchToken)},
		{name: "a caller with the plan", caller: "chat", plan: true, via: e.api, header: bearerHeader(chatToken)},
		{name: "a caller with every plan (*)", caller: "ops", plan: true, via: e.api, header: bearerHeader(opsToken)},
	})
	user := newUser(t)
	slot := httpapi.HeartbeatRequest{UserID: user, Plan: "three", StreamID: "held"}
	if _, err := e.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "three", StreamID: "held"}); err != nil {
		t.Fatal(err)
	}

	t.Run("a refused acquire takes no slot", func(t *testing.T) {
		other := newUser(t)
		for _, token := range []string{"", unknownTok, batchToken} {
			r := e.as(t, token, "POST", httpapi.PathAcquire, httpapi.AcquireRequest{UserID: other, Plan: "three"})
			if r.status == http.StatusOK {
				t.Fatalf("acquire with token %q: got 200, want refused", token)
			}
		}
		if got := e.used(t, other); got != 0 {
			t.Errorf("slots after refused acquires: got %d, want 0", got)
		}
		decode[httpapi.AcquireResponse](t, e.as(t, batchToken, "POST", httpapi.PathAcquire, httpapi.AcquireRequest{UserID: other, Plan: "one"}), http.StatusOK)
		if got := e.used(t, other); got != 1 {
			t.Errorf("slots after batch's acquire of its plan: got %d, want 1", got)
		}
	})
	t.Run("a batch heartbeats the slots of the caller's plans and refuses the others", func(t *testing.T) {
		other := newUser(t)
		if _, err := e.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: other, Plan: "one", StreamID: "o"}); err != nil {
			t.Fatal(err)
		}
		req := httpapi.HeartbeatsRequest{Slots: []httpapi.HeartbeatRequest{slot, {UserID: other, Plan: "one", StreamID: "o"}}}
		got := decode[httpapi.HeartbeatsResponse](t, e.as(t, batchToken, "POST", httpapi.PathHeartbeats, req), http.StatusOK)
		if len(got.Results) != 2 || got.Results[0].Error == nil || got.Results[0].Error.Code != httpapi.CodePlanNotAllowed || !got.Results[1].Alive {
			t.Errorf("results: got %+v, want plan_not_allowed then alive", got.Results)
		}
	})
	t.Run("a token under another scheme is 401", func(t *testing.T) {
		r := e.callWith(t, "GET", httpapi.PathTiers, nil, false, http.Header{"Authorization": {"Basic " + chatToken}})
		wantError(t, r, http.StatusUnauthorized, httpapi.CodeUnauthenticated)
	})
	t.Run("two Authorization headers are 401, whichever comes first", func(t *testing.T) {
		for _, values := range [][]string{
			{"Bearer " + chatToken, "Bearer " + unknownTok},
			{"Bearer " + unknownTok, "Bearer " + chatToken},
			{"Bearer " + chatToken, "Bearer " + chatToken},
		} {
			r := e.callWith(t, "GET", httpapi.PathTiers, nil, false, http.Header{"Authorization": values})
			wantError(t, r, http.StatusUnauthorized, httpapi.CodeUnauthenticated)
			if !strings.Contains(string(r.body), "2 Authorization values") {
				t.Errorf("two Authorization headers: %s; want the message to say so", r.body)
			}
		}
	})
	t.Run("a caller with a certificate only has no token", func(t *testing.T) {
		r := e.callWith(t, "GET", httpapi.PathTiers, nil, false, http.Header{"Authorization": {"Bearer -"}})
		wantError(t, r, http.StatusUnauthorized, httpapi.CodeUnauthenticated)
	})
	t.Run("no token reaches the log", func(t *testing.T) {
		for _, token := range []string{chatToken, batchToken, opsToken, unknownTok} {
			if strings.Contains(e.log.String(), token) {
				t.Errorf("the log holds a token")
			}
		}
	})
}

// Rewriting the tokens file rotates the tokens: the new one is accepted
// and the old refused within a few polls; a broken rewrite keeps the last
// good file; a removed file refuses everyone.
func TestAPITokenRotation(t *testing.T) {
	t.Parallel()
	path := writeCallers(t, "chat "+chatToken+" three\n")
	e, callers := newAuthEnv(t, path, 10*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); callers.Watch(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	status := func(token string) int {
		return e.as(t, token, "GET", httpapi.PathTiers, nil).status
	}
	eventually := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 5s", what)
			}
		}
	}
	versions := 0
	rewrite := func(content string) {
		t.Helper()
		versions++
		tmp := path + ".new"
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		stamp := time.Now().Add(time.Duration(versions) * time.Second) // a distinct mtime per version
		if err := os.Chtimes(tmp, stamp, stamp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	if got := status(chatToken); got != http.StatusOK {
		t.Fatalf("the first token: got %d, want 200", got)
	}

	const rotated = "chat-rotated-0123456789abcdef"
	rewrite("chat " + rotated + " three\n")
	eventually("the rotated token is accepted", func() bool { return status(rotated) == http.StatusOK })
	if got := status(chatToken); got != http.StatusUnauthorized {
		t.Errorf("the old token after the rotation: got %d, want 401", got)
	}

	rewrite("chat " + rotated + "\n") // two fields: refused
	eventually("the broken rewrite is logged", func() bool { return strings.Contains(e.log.String(), "API tokens file unusable") })
	if got := status(rotated); got != http.StatusOK {
		t.Errorf("the token after a broken rewrite: got %d, want 200 (the last good file stays)", got)
	}
	var line map[string]any
	for _, l := range strings.Split(e.log.String(), "\n") {
		if strings.Contains(l, "API tokens file unusable") {
			_ = json.Unmarshal([]byte(l), &line)
		}
	}
	if line["level"] != "ERROR" || !strings.Contains(line["err"].(string), "line 1: want 3 fields") {
		t.Errorf("log of the broken rewrite: got %v, want an ERROR naming line 1", line)
	}

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	eventually("a removed file refuses every caller", func() bool { return status(rotated) == http.StatusUnauthorized })
	if strings.Contains(e.log.String(), rotated) || strings.Contains(e.log.String(), chatToken) {
		t.Errorf("the log holds a token")
	}
}

// At log.level debug every request leaves one access line naming its
// route (not its path) and its caller.
func TestAccessLogNamesTheCaller(t *testing.T) {
	t.Parallel()
	sink := &logSink{}
	logger := slog.New(slog.NewJSONHandler(sink, &slog.HandlerOptions{Level: slog.LevelDebug}))
	callers, err := server.LoadCallers(server.CallersOptions{TokensFile: writeCallers(t, callerLines), Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	lim := limitertest.New(t, limitertest.Options{}).Limiter
	a := newAPIOf(t, server.New(lim, server.Options{Logger: logger, Callers: callers}))
	r := a.callWith(t, "POST", httpapi.PathAcquire, mustJSON(t, httpapi.AcquireRequest{UserID: newUser(t), Plan: "three"}), false,
		http.Header{"Authorization": {"Bearer " + chatToken}})
	decode[httpapi.AcquireResponse](t, r, http.StatusOK)
	wantError(t, a.call(t, "GET", httpapi.PathTiers, nil, false), http.StatusUnauthorized, httpapi.CodeUnauthenticated)

	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(sink.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err == nil && m["msg"] == "request" {
			lines = append(lines, m)
		}
	}
	if len(lines) != 2 {
		t.Fatalf("access lines: got %d, want 2:\n%s", len(lines), sink.String())
	}
	if l := lines[0]; l["route"] != "POST "+httpapi.PathAcquire || l["caller"] != "chat" || l["status"] != float64(200) || l["level"] != "DEBUG" {
		t.Errorf("access line of the acquire: got %v, want route POST %s, caller chat, status 200 at DEBUG", l, httpapi.PathAcquire)
	}
	if l := lines[1]; l["route"] != "GET "+httpapi.PathTiers || l["caller"] != "" || l["status"] != float64(401) {
		t.Errorf("access line of the refused call: got %v, want route GET %s, no caller, status 401", l, httpapi.PathTiers)
	}
	if strings.Contains(sink.String(), chatToken) {
		t.Errorf("the log holds a token")
	}
}
