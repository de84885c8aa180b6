package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/client"
	"github.com/joishi/limiter/pkg/httpapi"
)

const (
	e2eViewerToken   = "e2e-viewer-token-0123456789"
	e2eOperatorToken = "e2e-operator-token-0123456789"
)

// adminTiers: paid=3 with a short heartbeat, so a lost lease shows fast;
// long=3 with a TTL no slow test machine outlasts, for slots held without
// heartbeats; queued=2 like long, whose acquires may wait a minute;
// urgent=3 like queued, of priority 5.
const adminTiers = `    - plan: paid
      maxConcurrentStreams: 3
      slotTTL: 3s
      heartbeatInterval: 300ms
    - plan: long
      maxConcurrentStreams: 3
      slotTTL: 120s
      heartbeatInterval: 20s
    - plan: queued
      maxConcurrentStreams: 2
      slotTTL: 120s
      heartbeatInterval: 20s
      maxWait: 60s
    - plan: urgent
      maxConcurrentStreams: 3
      slotTTL: 120s
      heartbeatInterval: 20s
      maxWait: 60s
      priority: 5
`

// adminServer is a `limiter serve` process with the admin API on.
type adminServer struct {
	*servetest.Process
	tokensFile string
}

// startAdminServer writes a tokens file (a viewer and an operator) and
// starts a serve process using it, on its own key prefix on the shared
// standalone Redis; extra is added to its config file.
func startAdminServer(t *testing.T, extra ...string) *adminServer {
	t.Helper()
	return startAdminServerOn(t, []string{testenv.Redis(t)}, extra...)
}

// startAdminServerOn is startAdminServer on the Redis at addrs.
func startAdminServerOn(t *testing.T, addrs []string, extra ...string) *adminServer {
	t.Helper()
	tokens := filepath.Join(t.TempDir(), "admin-tokens")
	content := "# e2e\nvic viewer " + e2eViewerToken + "\nopal operator " + e2eOperatorToken + "\n"
	if err := os.WriteFile(tokens, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	config := serveConfig(addrs, "e2e-admin-"+randomID()+":", adminTiers) +
		"admin:\n  tokensFile: " + tokens + "\n" + strings.Join(extra, "")
	proc := servetest.Start(t, servetest.Options{Config: config, AwaitRedis: true})
	return &adminServer{Process: proc, tokensFile: tokens}
}

// admin calls the admin API with token and decodes a 200 into out.
func (s *adminServer) admin(t *testing.T, method, path, token string, body, out any) (int, []byte) {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second, Transport: bearer(token)}
	status, _, data := call(t, hc, method, s.Admin+path, body, nil)
	if status == http.StatusOK && out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatal(err)
		}
	}
	return status, data
}

type bearer string

func (b bearer) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	if b != "" {
		req.Header.Set("Authorization", "Bearer "+string(b))
	}
	return http.DefaultTransport.RoundTrip(req)
}

// TestAdminReleaseLosesLeases: support releases a locked-out user's slots;
// the holders' leases are told (Lost fires with ErrSlotLost) and the user
// can stream again, up to the plan's limit and no further.
func TestAdminReleaseLosesLeases(t *testing.T) {
	srv := startAdminServer(t)
	c, err := client.New(srv.API)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	ctx := context.Background()
	user := "admin-e2e-" + randomID()

	var leases []*client.Lease
	for range 3 {
		l, err := c.Acquire(ctx, user, "paid")
		if err != nil {
			t.Fatalf("acquire: %v", err)
		}
		leases = append(leases, l)
	}
	if _, err := c.Acquire(ctx, user, "paid"); !client.IsLimited(err) {
		t.Fatalf("4th acquire: got %v, want stream_limit_reached", err)
	}

	var released httpapi.AdminReleaseResponse
	if status, body := srv.admin(t, "POST", httpapi.AdminUserReleasePath(user), e2eOperatorToken, httpapi.AdminReleaseRequest{Reason: "e2e: locked out"}, &released); status != http.StatusOK {
		t.Fatalf("release: got %d %s, want 200", status, body)
	}
	if len(released.Released) != 3 || released.AuditID == "" {
		t.Fatalf("release: got %+v, want 3 released ids and an audit id", released)
	}

	for i, l := range leases {
		select {
		case <-l.Lost():
			if !errors.Is(l.Err(), client.ErrSlotLost) {
				t.Errorf("lease %d: Err got %v, want ErrSlotLost", i, l.Err())
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("lease %d: Lost did not fire within 5s of the release", i)
		}
	}

	for i := range 3 {
		if _, err := c.Acquire(ctx, user, "paid"); err != nil {
			t.Fatalf("acquire %d after the release: got %v, want granted", i+1, err)
		}
	}
	if _, err := c.Acquire(ctx, user, "paid"); !client.IsLimited(err) {
		t.Errorf("4th acquire after the release: got %v, want stream_limit_reached", err)
	}
	if out := srv.Output(); !strings.Contains(out, `"msg":"admin audit"`) || !strings.Contains(out, released.AuditID) {
		t.Errorf("serve log: want the release's audit record (audit_id %s)", released.AuditID)
	}
}

// TestAdminTokensReloadInRunningServer: a token added to the file works
// without a restart; a broken edit keeps the tokens in force and is logged
// with its line number, never with the token; removing the file revokes
// every token.
func TestAdminTokensReloadInRunningServer(t *testing.T) {
	srv := startAdminServer(t)
	const newToken = "e2e-new-operator-token-0123456789"
	path := httpapi.PathAdminAudit
	if status, _ := srv.admin(t, "GET", path, newToken, nil, nil); status != http.StatusUnauthorized {
		t.Fatalf("new token before the edit: got %d, want 401", status)
	}
	replace := func(content string) {
		t.Helper()
		tmp := srv.tokensFile + ".new"
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, srv.tokensFile); err != nil {
			t.Fatal(err)
		}
	}
	replace("vic viewer " + e2eViewerToken + "\nnew operator " + newToken + "\n")
	eventually(t, 5*time.Second, "the new token is accepted", func() bool {
		status, _ := srv.admin(t, "GET", path, newToken, nil, nil)
		return status == http.StatusOK
	})

	replace("vic viewer " + e2eViewerToken + "\nbroken operator\n")
	eventually(t, 5*time.Second, "the broken edit is logged", func() bool {
		return strings.Contains(srv.Output(), "line 2: want 3 fields")
	})
	if status, _ := srv.admin(t, "GET", path, newToken, nil, nil); status != http.StatusOK {
		t.Errorf("after a broken edit: got %d, want the last good tokens kept (200)", status)
	}

	// Removing the file (the Secret) revokes every token.
	if err := os.Remove(srv.tokensFile); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "a removed tokens file revokes the tokens", func() bool {
		status, _ := srv.admin(t, "GET", path, newToken, nil, nil)
		return status == http.StatusUnauthorized
	})
	if !strings.Contains(srv.Output(), "admin tokens file removed") {
		t.Errorf("serve log: want the removal logged")
	}
	for _, token := range []string{e2eViewerToken, e2eOperatorToken, newToken} {
		if strings.Contains(srv.Output(), token) {
			t.Errorf("serve log holds a token")
		}
	}
}

func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestAdminServeStartup: serve says whether the admin API is on, and a
// malformed tokens file stops it at start naming the line, not the token.
func TestAdminServeStartup(t *testing.T) {
	redis := testenv.Redis(t)
	t.Run("without a tokens file the admin API is off and says so", func(t *testing.T) {
		proc := servetest.Start(t, servetest.Options{Config: serveConfig([]string{redis}, "e2e-admin-off:", adminTiers)})
		if status, _ := servetest.Get(proc.API + httpapi.AdminUserSlotsPath("u-1")); status != http.StatusNotFound {
			t.Errorf("admin API: got %d, want 404", status)
		}
		if status, _ := servetest.Get(proc.API + httpapi.PathAdminPage); status != http.StatusNotFound {
			t.Errorf("admin page: got %d, want 404", status)
		}
		if !strings.Contains(proc.Output(), "the admin API and page are off") {
			t.Errorf("serve log: want it to say the admin API is off:\n%s", proc.Output())
		}
		if status, _ := servetest.Get(proc.Admin + httpapi.PathAdminPage); status != 0 {
			t.Errorf("admin listener: got %d, want no listener at all", status)
		}
	})
	t.Run("with a tokens file the admin API is on its own listener, not the API's", func(t *testing.T) {
		srv := startAdminServer(t)
		if status, _ := srv.admin(t, "GET", httpapi.AdminUserSlotsPath("u-1"), e2eViewerToken, nil, nil); status != http.StatusOK {
			t.Errorf("admin API on the admin listener: got %d, want 200", status)
		}
		if status, _ := servetest.Get(srv.Admin + httpapi.PathAdminPage); status != http.StatusOK {
			t.Errorf("admin page on the admin listener: got %d, want 200", status)
		}
		hc := &http.Client{Timeout: 10 * time.Second, Transport: bearer(e2eViewerToken)}
		if status, _, _ := call(t, hc, "GET", srv.API+httpapi.AdminUserSlotsPath("u-1"), nil, nil); status != http.StatusNotFound {
			t.Errorf("admin API on the API listener: got %d, want 404", status)
		}
		if status, _ := servetest.Get(srv.API + httpapi.PathAdminPage); status != http.StatusNotFound {
			t.Errorf("admin page on the API listener: got %d, want 404", status)
		}
		if !strings.Contains(srv.Output(), `"admin":"`+srv.Admin) {
			t.Errorf("serve log: want the listening line to name the admin listener %s:\n%s", srv.Admin, srv.Output())
		}
	})
	t.Run("a malformed tokens file is a configuration error naming the line", func(t *testing.T) {
		tokens := filepath.Join(t.TempDir(), "tokens")
		if err := os.WriteFile(tokens, []byte("# ok\nalice viewer "+e2eViewerToken+"\nbob "+e2eOperatorToken+" operator\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := filepath.Join(t.TempDir(), "limiter.yaml")
		if err := os.WriteFile(cfg, []byte(serveConfig([]string{redis}, "e2e-admin-bad:", adminTiers)+"admin:\n  tokensFile: "+tokens+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(servetest.Binary(t), "serve", "--config", cfg, "--http-addr", "127.0.0.1:0", "--ops-addr", "127.0.0.1:0")
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 {
			t.Fatalf("exit: got %v, want code 2 (configuration error); output:\n%s", err, out)
		}
		if !strings.Contains(string(out), "line 3: the role (field 2) must be viewer or operator") {
			t.Errorf("output: got %s, want the line and field named", out)
		}
		if strings.Contains(string(out), e2eOperatorToken) {
			t.Errorf("output echoes the token")
		}
	})
}

// TestAdminCLI runs `limiter admin` against a running server.
func TestAdminCLI(t *testing.T) {
	srv := startAdminServer(t)
	user := "cli-" + randomID()
	for range 2 {
		if status, res := acquire(t, srv.API, user, "long"); status != http.StatusOK || res.Degraded {
			t.Fatalf("acquire: got %d %+v, want granted, not degraded", status, res)
		}
	}
	viewer := []string{"LIMITER_ADMIN_URL=" + srv.Admin, "LIMITER_ADMIN_TOKEN=" + e2eViewerToken}
	operator := []string{"LIMITER_ADMIN_URL=" + srv.Admin, "LIMITER_ADMIN_TOKEN=" + e2eOperatorToken}

	for _, tc := range []cliCase{
		{"slots lists the user's slots", viewer, []string{"slots", user}, 0, fmt.Sprintf("user %s: 2 live slots\nSTREAM ID", user), ""},
		{"a viewer may not release", viewer, []string{"release", user, "--reason", "cli test"}, 1, "", "403 forbidden: role viewer may not release all"},
		{"release requires a reason", operator, []string{"release", user}, 2, "", "--reason is required"},
		{"no token is a usage error naming the env var", []string{"LIMITER_ADMIN_URL=" + srv.Admin, "LIMITER_ADMIN_TOKEN="}, []string{"slots", user}, 2, "", "set LIMITER_ADMIN_TOKEN"},
		{"a wrong token is refused", nil, []string{"slots", user, "--url", srv.Admin, "--token", "wrong-token-0123456789"}, 1, "", "401 unauthorized: unknown token"},
		{"flags win over the environment", []string{"LIMITER_ADMIN_URL=http://127.0.0.1:1", "LIMITER_ADMIN_TOKEN=x"}, []string{"slots", user, "--url", srv.Admin, "--token", e2eViewerToken}, 0, "2 live slots", ""},
		{"slots shows each slot's age, plan and time left", viewer, []string{"slots", user}, 0, "CALLER  PLAN  LABEL  TIME LEFT  EXPIRES AT", ""},
		{"a viewer may not set an override", viewer, []string{"override", "set", user, "--max-streams", "5", "--expires-in", "1h", "--reason", "cli test"}, 1, "", "403 forbidden: role viewer may not set override"},
		{"an override needs --expires-in", operator, []string{"override", "set", user, "--max-streams", "5", "--reason", "cli test"}, 2, "", "--expires-in is required"},
		{"an override's limit is bounded like a tier's", operator, []string{"override", "set", user, "--max-streams", "1001", "--expires-in", "1h", "--reason", "cli test"}, 2, "", "--max-streams must be 0 to 1000, got 1001"},
		{"an operator sets an override", operator, []string{"override", "set", user, "--max-streams", "5", "--expires-in", "24h", "--reason", "ticket 8: launch"}, 0, "override: 5 streams until", ""},
		{"slots shows the override", viewer, []string{"slots", user}, 0, "override: 5 streams until", ""},
		{"an operator removes the override", operator, []string{"override", "remove", user, "--reason", "ticket 8: done"}, 0, "removed the override of user " + user, ""},
		{"a second removal finds none", operator, []string{"override", "remove", user, "--reason", "ticket 8: done"}, 0, "had no override in force", ""},
		{"an operator releases with a reason", operator, []string{"release", user, "--reason", "ticket 7: locked out"}, 0, "released 2 slots of user " + user, ""},
		{"the user holds no slot after", viewer, []string{"slots", user}, 0, fmt.Sprintf("user %s: 0 live slots", user), ""},
		{"audit lists the release with its reason", viewer, []string{"audit"}, 0, "ticket 7: locked out", ""},
	} {
		tc.run(t)
	}

	t.Run("-o json prints the API's answer", func(t *testing.T) {
		code, stdout, stderr := runAdminCLI(t, viewer, "slots", user, "-o", "json")
		var got httpapi.AdminSlotsResponse
		if code != 0 || json.Unmarshal([]byte(stdout), &got) != nil || got.UserID != user {
			t.Errorf("got exit %d, stdout %q, stderr %q; want exit 0 and the JSON of user %s's slots", code, stdout, stderr, user)
		}
	})
}

// cliCase is one run of `limiter admin` and what it must answer.
type cliCase struct {
	name       string
	env        []string
	args       []string
	wantCode   int
	wantStdout string
	wantStderr string
}

// run runs the case as a subtest.
func (tc cliCase) run(t *testing.T) {
	t.Helper()
	t.Run(tc.name, func(t *testing.T) {
		code, stdout, stderr := runAdminCLI(t, tc.env, tc.args...)
		if code != tc.wantCode || !strings.Contains(stdout, tc.wantStdout) || !strings.Contains(stderr, tc.wantStderr) {
			t.Errorf("limiter admin %s: got exit %d, stdout %q, stderr %q; want exit %d, stdout containing %q, stderr containing %q",
				strings.Join(tc.args, " "), code, stdout, stderr, tc.wantCode, tc.wantStdout, tc.wantStderr)
		}
	})
}

// runAdminCLI runs `limiter admin args...` with env added to this
// process's, and returns its exit code and output.
func runAdminCLI(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(servetest.Binary(t), append([]string{"admin"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, stdout.String(), stderr.String()
}

// TestServeStopsTheAdminListenerWithTheAPI: on SIGTERM /readyz turns
// false and the API and admin listeners stop accepting at once, in-flight
// requests getting up to the grace to finish (server.Run): the admin
// listener does not go on accepting, and serving, while an API
// connection still drains.
func TestServeStopsTheAdminListenerWithTheAPI(t *testing.T) {
	t.Parallel()
	srv := startAdminServer(t, "http:\n  shutdownGrace: 8s\n")
	// An API connection in flight: a request line and half a header. The
	// API's drain waits for it (until http.readHeaderTimeout, 5s).
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.API, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("GET /v1/tiers HTTP/1.1\r\nHost: x\r\nX-Slow: ")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if err := srv.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	if !refusedWithin(time.Second, func() (*http.Response, error) { return http.Get(srv.API + "/v1/tiers") }) {
		t.Fatal("the API listener still accepted 1s after SIGTERM")
	}
	if status, _ := servetest.Get(srv.Ops + "/readyz"); status != http.StatusServiceUnavailable {
		t.Errorf("readyz during the drain: %d, want 503", status)
	}
	lastAdmin := 0
	if !refusedWithin(2*time.Second, func() (*http.Response, error) {
		req, _ := http.NewRequest(http.MethodGet, srv.Admin+httpapi.PathAdminAudit, nil)
		req.Header.Set("Authorization", "Bearer "+e2eOperatorToken)
		// A new connection each time: what is tried is the listener's accept.
		hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := hc.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			lastAdmin = resp.StatusCode
		}
		return resp, err
	}) {
		t.Errorf("the admin listener still accepted new connections (and answered %d) %v after SIGTERM, while the API had stopped accepting; want both to stop accepting at once",
			lastAdmin, time.Since(sent).Round(time.Millisecond))
	}
	if _, err := srv.Wait(15 * time.Second); err != nil {
		t.Fatal(err)
	}
}
