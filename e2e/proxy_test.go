package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
)

// proxyError is the OpenAI-shaped error body of the proxy.
type proxyError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

func decodeProxyError(t *testing.T, resp *http.Response) proxyError {
	t.Helper()
	defer resp.Body.Close()
	var e proxyError
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("status %d: Content-Type %q, want application/json", resp.StatusCode, ct)
	}
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		t.Fatalf("status %d: the body is not the JSON error: %v", resp.StatusCode, err)
	}
	return e
}

// SIGKILL of the proxy mid-stream releases nothing; the slot expires
// within its TTL (1s on the free plan), so the user can stream again.
func TestProxySIGKILLMidStreamSlotExpiresWithinTTL(t *testing.T) {
	e := startProxy(t, "")
	user := "kill-" + randomID()
	e.holdStream(t, user, "free", "the first chunk")
	if n := e.used(t, user); n != 1 {
		t.Fatalf("%d slots held mid-stream, want 1", n)
	}
	e.proc.Kill()
	killed := time.Now()
	e.awaitUsed(t, user, 0, time.Second+time.Second) // TTL + 1s
	t.Logf("slot gone %v after SIGKILL (TTL 1s)", time.Since(killed).Round(time.Millisecond))
}

// SIGTERM: the proxy stops accepting, a stream that ends within the grace
// finishes whole, one that does not is cut at the grace and its slot
// released (on a plan whose TTL is 30s: released, not expired), and the
// process exits.
func TestProxySIGTERMDrainsStreams(t *testing.T) {
	e := startProxy(t, "http:\n  shutdownGrace: 3s\n")
	short, long := "term-short-"+randomID(), "term-long-"+randomID()
	// 6 chunks 300ms apart: ends 1.5s in, within the grace.
	finishing := e.chat(t, context.Background(), short, "paid", "slow:6:300", nil)
	defer finishing.Body.Close()
	endless := e.chat(t, context.Background(), long, "paid", "hold", nil)
	defer endless.Body.Close()
	finishingData, _ := sseData(finishing.Body)
	endlessData, endlessErr := sseData(endless.Body)
	within(t, finishingData, 5*time.Second, "the finishing stream's first chunk")
	within(t, endlessData, 5*time.Second, "the endless stream's first chunk")

	if err := e.proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	// No new connection accepted soon after SIGTERM, while the endless
	// stream (cut only at 3s) keeps the process alive.
	refused := refusedWithin(2*time.Second-time.Since(sent), func() (*http.Response, error) {
		return http.Get(e.proc.API + "/v1/models")
	})
	if !refused {
		t.Error("the proxy still accepted new connections 2s after SIGTERM")
	}

	var got []string
	for data := range finishingData {
		got = append(got, data)
	}
	if len(got) != 6 || got[len(got)-1] != "[DONE]" {
		t.Errorf("the stream that ends within the grace got %d events ending %q, want all 6 and [DONE]", len(got), got[len(got)-1])
	}
	for range endlessData {
	}
	cut := time.Since(sent)
	if endlessErr.Load() == nil {
		t.Error("the stream outliving the grace ended cleanly; want it cut")
	}
	if cut < 2500*time.Millisecond || cut > 5*time.Second {
		t.Errorf("the endless stream was cut %v after SIGTERM, want at the 3s grace", cut)
	}
	code, err := e.proc.Wait(5 * time.Second)
	if err != nil {
		t.Fatalf("the proxy did not exit: %v", err)
	}
	if code != 1 {
		t.Errorf("exit code %d after cutting a stream at the grace, want 1", code)
	}
	for _, user := range []string{short, long} {
		if n := e.used(t, user); n != 0 {
			t.Errorf("user %s holds %d slots after the proxy exited, want 0 (released, the TTL is 30s)", user, n)
		}
	}
	if out := e.proc.Output(); !strings.Contains(out, `msg="cut the streams still running at shutdown and released their slots" mode=proxy streams=1 released=1`) {
		t.Errorf("the proxy did not log the slots it released at shutdown:\n%s", out)
	}
}

// Bad input is refused with a JSON error, takes no slot and never reaches
// the upstream.
func TestProxyRefusesBadInput(t *testing.T) {
	e := startProxy(t, "")
	user := "bad-" + randomID()
	cases := []struct {
		name       string
		user, plan string
		header     http.Header
		wantStatus int
		wantCode   string
	}{
		{"missing identity", "", "", nil, http.StatusUnauthorized, "unauthenticated"},
		{"a user without a plan, and no default plan", user, "", nil, http.StatusUnauthorized, "unauthenticated"},
		{"a plan outside the tier table", user, "enterprise", nil, http.StatusUnprocessableEntity, "unknown_plan"},
		{"oversized headers", user, "free", http.Header{"X-Padding": {strings.Repeat("a", 40<<10)}}, http.StatusRequestHeaderFieldsTooLarge, "headers_too_large"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := e.chat(t, context.Background(), tc.user, tc.plan, "fast", tc.header)
			if resp.StatusCode != tc.wantStatus {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, body, tc.wantStatus)
			}
			if body := decodeProxyError(t, resp); body.Error.Code != tc.wantCode || body.Error.Message == "" {
				t.Errorf("error %+v, want code %s with a message", body.Error, tc.wantCode)
			}
		})
	}
	if n := e.used(t, user); n != 0 {
		t.Errorf("%d slots held after refused requests, want 0", n)
	}
	if n := e.llm.requests.Load(); n != 0 {
		t.Errorf("%d refused requests reached the upstream, want 0", n)
	}
	// A route that holds no slot passes without identity.
	resp, err := http.Get(e.proc.API + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if e.llm.requests.Load() != 1 {
		t.Error("GET /v1/models (not a limited route) did not reach the upstream")
	}
}

// TestProxyServesHTTPTLS: with http.tls set, `limiter proxy` serves its
// listener over TLS, as serve does its API (a plain-HTTP request is
// refused, not served), and a stream through it holds its slot as any;
// the ops listener stays plain HTTP for the probes.
func TestProxyServesHTTPTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := testenv.NewCA(t)
	certFile, keyFile := ca.IssueFiles(t, dir, "proxy", testenv.CertSpec{CommonName: "limiter", IPs: []string{"127.0.0.1"}})
	e := startProxy(t, fmt.Sprintf("http:\n  tls:\n    certFile: %q\n    keyFile: %q\n", certFile, keyFile))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM)
	transport := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	t.Cleanup(transport.CloseIdleConnections)
	client := &http.Client{Transport: transport, Timeout: 10 * time.Second}
	url := strings.Replace(e.proc.API, "http://", "https://", 1) + "/v1/chat/completions"
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`

	plain, err := http.Post(e.proc.API+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err == nil {
		plain.Body.Close()
		if plain.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP to the TLS listener: %d; want refused", plain.StatusCode)
		}
	}

	user := "tls-" + randomID()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-Id", user)
	req.Header.Set("X-Plan", "free")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("a stream over TLS: %v\n%s", err, e.proc.Output())
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.TLS == nil || !strings.Contains(string(data), "[DONE]") {
		t.Fatalf("a stream over TLS: %d, TLS %v, %q; want the llm's stream", resp.StatusCode, resp.TLS != nil, data)
	}
	e.awaitUsed(t, user, 0, 5*time.Second)
	if status, _ := servetest.Get(e.proc.Ops + "/readyz"); status != http.StatusOK {
		t.Errorf("ops /readyz over plain HTTP: %d; want 200", status)
	}
}
