package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/joishi/limiter/internal/testenv"
)

// With http.tls set, serve puts its admin listener on TLS, and `limiter
// admin` reaches it at an https:// URL, trusting the CA of --ca-file (or
// LIMITER_ADMIN_CA_FILE); without that CA the handshake fails and says
// which flag is missing, and the plain http:// URL gets no answer.
func TestAdminReachesATLSAdminListenerWithItsCA(t *testing.T) {
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "absent"))
	t.Setenv(envAdminURL, "")
	t.Setenv(envAdminCAFile, "")
	dir := t.TempDir()
	ca := testenv.NewCA(t)
	certFile, keyFile := ca.IssueFiles(t, dir, "server", testenv.CertSpec{CommonName: "limiter", IPs: []string{"127.0.0.1"}})
	caFile := ca.File(t, dir)
	const token = "support-token-0123456789abcdef"
	write := func(name, content string) string {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	// A generous Redis deadline: the test is about TLS, and a loaded
	// machine must not turn its calls into 503s.
	cfg := write("limiter.yaml", fmt.Sprintf("redis:\n  addrs: [%q]\n  keyPrefix: %q\n  timeout: 5s\ntiers:\n  source: static\n"+
		"admin:\n  tokensFile: %q\nhttp:\n  tls:\n    certFile: %q\n    keyFile: %q\n",
		testenv.Redis(t), "admin-tls-"+filepath.Base(dir)+":", write("admin-tokens", "support operator "+token+"\n"), certFile, keyFile))
	adminAddr := testenv.FreeAddr(t)

	ctx, cancel := context.WithCancel(t.Context())
	var serveOut testenv.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append([]string{"serve", "--config", cfg, "--log-format", "text", "--admin-addr", adminAddr}, local...), &serveOut, &serveOut)
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != exitOK {
			t.Errorf("serve: exit %d, want 0; logs:\n%s", code, serveOut.String())
		}
	})
	waitFor(t, &serveOut, "admin=https://"+adminAddr, done)
	waitFor(t, &serveOut, "redis warmed up", done) // else the admin's calls answer 503, Redis not yet reached

	https, http := "https://"+adminAddr, "http://"+adminAddr
	for _, tc := range []struct {
		name       string
		env        string // LIMITER_ADMIN_CA_FILE
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{name: "--ca-file trusts the listener's CA", args: []string{"--url", https, "--ca-file", caFile}, wantCode: exitOK, wantStdout: `"records"`},
		{name: envAdminCAFile + " does as --ca-file", env: caFile, args: []string{"--url", https}, wantCode: exitOK, wantStdout: `"records"`},
		{name: "without the CA the handshake fails, naming --ca-file", args: []string{"--url", https}, wantCode: 1,
			wantStderr: "its certificate is signed by a CA not trusted here: give that CA with --ca-file (env " + envAdminCAFile + ")"},
		{name: "plain HTTP gets no answer of the admin API", args: []string{"--url", http}, wantCode: 1, wantStderr: "the admin API answered 400 http_400: Client sent an HTTP request to an HTTPS server"},
		{name: "a CA file beside an http:// URL is refused", args: []string{"--url", http, "--ca-file", caFile}, wantCode: exitUsage,
			wantStderr: "--ca-file (env " + envAdminCAFile + ") is for an https:// URL, got --url (env " + envAdminURL + ") \"" + http + "\""},
		{name: "a CA file holding no certificate is refused", args: []string{"--url", https, "--ca-file", write("not-pem", "no certificate\n")}, wantCode: exitUsage,
			wantStderr: "no PEM certificate in it"},
		{name: "a CA file that cannot be read is refused", args: []string{"--url", https, "--ca-file", filepath.Join(dir, "absent")}, wantCode: exitUsage,
			wantStderr: "--ca-file (env " + envAdminCAFile + "): open " + filepath.Join(dir, "absent")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(envAdminCAFile, tc.env)
			var stdout, stderr testenv.Buffer
			args := append([]string{"admin", "audit", "-o", "json", "--token", token}, tc.args...)
			code := run(t.Context(), args, &stdout, &stderr)
			if code != tc.wantCode || !strings.Contains(stdout.String(), tc.wantStdout) || !strings.Contains(stderr.String(), tc.wantStderr) {
				t.Errorf("limiter %s: exit %d, stdout %q, stderr %q; want exit %d, stdout holding %q, stderr holding %q",
					strings.Join(args, " "), code, stdout.String(), stderr.String(), tc.wantCode, tc.wantStdout, tc.wantStderr)
			}
		})
	}
}
