package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/joishi/limiter/internal/envoytest"
	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// A serve process with api.tokensFile and http.tls.* authenticates Envoy
// on its ext_proc listener as the slot API authenticates callers: a
// bearer token in the gRPC metadata (a static Envoy's initial_metadata),
// or a client certificate naming a caller (Envoy Gateway), each scoped to
// its plans; over the API's TLS.
func TestExtProcAuthentication(t *testing.T) {
	dir := t.TempDir()
	ca := testenv.NewCA(t)
	certFile, keyFile := ca.IssueFiles(t, dir, "server", testenv.CertSpec{CommonName: "limiter", IPs: []string{"127.0.0.1"}})
	const token = "envoy-token-0123456789abcdef"
	tokens := filepath.Join(dir, "api-tokens")
	if err := os.WriteFile(tokens, []byte("envoy "+token+" free\nenvoy-gateway.llm - paid\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := serveConfig(testenv.Cluster(t), "e2e-extproc-auth:"+randomID()+":", incidentTiers) + fmt.Sprintf(`
api:
  tokensFile: %q
http:
  tls:
    certFile: %q
    keyFile: %q
    clientCAFile: %q
`, tokens, certFile, keyFile, ca.File(t, dir))
	p := servetest.Start(t, servetest.Options{Config: cfg, AwaitRedis: true, ExtProc: true})

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.PEM)
	dial := func(t *testing.T, token string, cert *tls.Certificate) *envoytest.Envoy {
		t.Helper()
		conf := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
		if cert != nil {
			conf.Certificates = []tls.Certificate{*cert}
		}
		e, err := envoytest.Dial(p.ExtProc, envoytest.Options{Token: token, MessageTimeout: extprocMessageTimeout,
			DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(conf))}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		return e
	}
	clientPEM, clientKey := ca.Issue(t, testenv.CertSpec{CommonName: "gw", DNSNames: []string{"envoy-gateway.llm"}})
	clientCert, err := tls.X509KeyPair(clientPEM, clientKey)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("bearer token in the gRPC metadata", func(t *testing.T) {
		e := dial(t, token, nil)
		if _, resp := request(t, e, "u-"+randomID(), "free"); !granted(resp) {
			t.Errorf("plan free: %v, want CONTINUE", resp)
		}
		if _, resp := request(t, e, "u-"+randomID(), "paid"); statusOf(resp) != 403 {
			t.Errorf("plan paid, outside the caller's plans: %v, want a 403 ImmediateResponse", resp)
		}
	})
	t.Run("client certificate", func(t *testing.T) {
		e := dial(t, "", &clientCert)
		if _, resp := request(t, e, "u-"+randomID(), "paid"); !granted(resp) {
			t.Errorf("plan paid: %v, want CONTINUE", resp)
		}
	})
	t.Run("no credentials", func(t *testing.T) {
		e := dial(t, "", nil)
		st, err := e.Open(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		_, err = st.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", "u-"+randomID(), "x-plan", "free"), false)
		if status.Code(errors.Unwrap(err)) != codes.Unauthenticated {
			t.Errorf("got %v, want Unauthenticated", err)
		}
	})
}
