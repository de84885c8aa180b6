package proxy_test

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/proxytest"
	"github.com/joishi/limiter/pkg/proxy"
)

// An https upstream that speaks HTTP/2 is reached over HTTP/2, with the
// CA of proxy.upstreamCAFile, and its stream flushed as it comes.
func TestHTTP2UpstreamOverTLS(t *testing.T) {
	up := newSSE()
	protos := make(chan string, 1)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		protos <- r.Proto
		up.ServeHTTP(w, r)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	transport, err := proxy.NewTransport(proxy.TransportOptions{CAFile: ca})
	if err != nil {
		t.Fatal(err)
	}
	target, _ := url.Parse(srv.URL)
	e := newEnv(t, nil, envOptions{upstream: srv.URL, proxy: proxy.Options{Upstream: target, Transport: transport}})
	user := newUser()
	resp := e.do(t, e.request(t, context.Background(), "POST", "/v1/chat/completions", user, "one", strings.NewReader(`{"stream":true}`)))
	defer resp.Body.Close()
	<-up.started
	if proto := <-protos; proto != "HTTP/2.0" {
		t.Errorf("the upstream saw %s, want HTTP/2.0", proto)
	}
	got, _ := proxytest.SSEData(resp.Body)
	up.tokens <- "hi"
	if chunk := next(t, got, 2*time.Second); !strings.Contains(chunk, `"hi"`) {
		t.Errorf("chunk %q, want the token", chunk)
	}
	close(up.tokens)
	next(t, got, 2*time.Second)
	e.AwaitUsed(t, user, 0, time.Second)
}

func TestNewTransportRefusesABadCAFile(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "ca.pem")
	_ = os.WriteFile(bad, []byte("not a certificate"), 0o600)
	for _, file := range []string{bad, bad + ".missing"} {
		if _, err := proxy.NewTransport(proxy.TransportOptions{CAFile: file}); err == nil {
			t.Errorf("NewTransport(CAFile %s) accepted it", file)
		}
	}
}
