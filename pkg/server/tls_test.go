package server_test

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/apitest"
	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/server"
)

// tlsCallerLines add certificate callers to callerLines: by DNS name, and
// one by common name.
const tlsCallerLines = callerLines +
	"chat.example   -  three,one\n" +
	"batch.example  -  one\n" +
	"ops.example    -  *\n" +
	"cn-caller      -  three\n"

// mtlsEnv is the API served over TLS by Run, with client certificates of
// its CA naming callers.
type mtlsEnv struct {
	url  string
	ca   *testenv.CA
	pool *x509.CertPool // trusts the server's certificate
	dir  string
}

func newMTLSEnv(t *testing.T) (*mtlsEnv, *authEnv) {
	t.Helper()
	dir := t.TempDir()
	ca := testenv.NewCA(t)
	certFile, keyFile := ca.IssueFiles(t, dir, "server", testenv.CertSpec{CommonName: "limiter", IPs: []string{"127.0.0.1"}})
	e, callers := newAuthEnv(t, writeCallers(t, tlsCallerLines), 0)
	srv := server.New(e.lim, server.Options{Callers: callers})
	addr, _ := runServerOn(t, srv, server.Listeners{TLS: server.TLSFiles{CertFile: certFile, KeyFile: keyFile, ClientCAFile: ca.File(t, dir)}})
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM)
	return &mtlsEnv{url: "https://" + addr, ca: ca, pool: pool, dir: dir}, e
}

// as returns an API client presenting a certificate for spec (none when
// spec is nil), issued by ca (the env's own when nil).
func (m *mtlsEnv) as(t *testing.T, spec *testenv.CertSpec, ca *testenv.CA) *api {
	t.Helper()
	cfg := &tls.Config{RootCAs: m.pool}
	if spec != nil {
		if ca == nil {
			ca = m.ca
		}
		certPEM, keyPEM := ca.Issue(t, *spec)
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	transport := &http.Transport{TLSClientConfig: cfg}
	t.Cleanup(transport.CloseIdleConnections)
	return &api{url: m.url, client: &http.Client{Transport: apitest.ValidatingTransport(t, transport), Timeout: 10 * time.Second}}
}

func dnsCert(name string) *testenv.CertSpec {
	return &testenv.CertSpec{CommonName: "ignored-" + name, DNSNames: []string{name}}
}

func TestAPIAuthMatrixOverMutualTLS(t *testing.T) {
	t.Parallel()
	m, e := newMTLSEnv(t)
	runAuthMatrix(t, e.lim, []matrixCaller{
		{name: "no certificate and no token", via: m.as(t, nil, nil)},
		{name: "a certificate of a name the file does not hold", via: m.as(t, dnsCert("stranger.example"), nil)},
		{name: "a certificate of a caller without the plan", caller: "batch.example", via: m.as(t, dnsCert("batch.example"), nil)},
		{name: "a certificate of a caller with the plan", caller: "chat.example", plan: true, via: m.as(t, dnsCert("chat.example"), nil)},
		{name: "a certificate of a caller with every plan (*)", caller: "ops.example", plan: true, via: m.as(t, dnsCert("ops.example"), nil)},
	})

	t.Run("a certificate without SANs is named by its common name", func(t *testing.T) {
		decode[httpapi.TiersResponse](t, m.as(t, &testenv.CertSpec{CommonName: "cn-caller"}, nil).call(t, "GET", httpapi.PathTiers, nil, false), http.StatusOK)
	})
	t.Run("a DNS name names the caller beside other SANs", func(t *testing.T) {
		spec := &testenv.CertSpec{CommonName: "cn-caller", DNSNames: []string{"chat.example"}, URIs: []string{"spiffe://cluster.local/ns/llm/sa/chat"}, IPs: []string{"10.0.0.7"}}
		r := m.as(t, spec, nil).callWith(t, "POST", httpapi.PathAcquire, mustJSON(t, httpapi.AcquireRequest{UserID: newUser(t), Plan: "one"}), false, nil)
		decode[httpapi.AcquireResponse](t, r, http.StatusOK)
	})
	// As crypto/tls since Go 1.15: a certificate with SANs is named by
	// them, so a CA that lets a requester choose the common name but not
	// the SANs issues no certificate of another caller.
	for _, c := range []struct {
		name string
		spec testenv.CertSpec
		sans string // the message names them
	}{
		{"a URI SAN without a DNS name is refused, not named by the common name",
			testenv.CertSpec{CommonName: "cn-caller", URIs: []string{"spiffe://cluster.local/ns/llm/sa/chat"}}, `URI "spiffe://cluster.local/ns/llm/sa/chat"`},
		{"an IP SAN without a DNS name is refused, not named by the common name",
			testenv.CertSpec{CommonName: "cn-caller", IPs: []string{"10.0.0.7"}}, "IP 10.0.0.7"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := m.as(t, &c.spec, nil).call(t, "GET", httpapi.PathTiers, nil, false)
			e := wantError(t, r, http.StatusUnauthorized, httpapi.CodeUnauthenticated)
			for _, want := range []string{c.sans, "no DNS name", "common name is not used"} {
				if !strings.Contains(e.Message, want) {
					t.Errorf("message: got %q, want it to say %q", e.Message, want)
				}
			}
		})
	}
	t.Run("the first DNS name names the caller, not the common name", func(t *testing.T) {
		r := m.as(t, &testenv.CertSpec{CommonName: "cn-caller", DNSNames: []string{"stranger.example"}}, nil).call(t, "GET", httpapi.PathTiers, nil, false)
		e := wantError(t, r, http.StatusUnauthorized, httpapi.CodeUnauthenticated)
		if !strings.Contains(e.Message, `"stranger.example"`) {
			t.Errorf("message: got %q, want it to name the certificate's name", e.Message)
		}
	})
	t.Run("a token over TLS without a certificate", func(t *testing.T) {
		r := m.as(t, nil, nil).callWith(t, "POST", httpapi.PathAcquire, mustJSON(t, httpapi.AcquireRequest{UserID: newUser(t), Plan: "three"}), false, bearerHeader(chatToken))
		decode[httpapi.AcquireResponse](t, r, http.StatusOK)
	})
	t.Run("a certificate decides over a token", func(t *testing.T) {
		r := m.as(t, dnsCert("batch.example"), nil).callWith(t, "POST", httpapi.PathAcquire, mustJSON(t, httpapi.AcquireRequest{UserID: newUser(t), Plan: "three"}), false, bearerHeader(chatToken))
		wantError(t, r, http.StatusForbidden, httpapi.CodePlanNotAllowed)
	})
	t.Run("a certificate of another CA is refused in the handshake", func(t *testing.T) {
		other := m.as(t, dnsCert("chat.example"), testenv.NewCA(t))
		req, _ := http.NewRequest("GET", m.url+httpapi.PathTiers, nil)
		if resp, err := other.client.Do(req); err == nil {
			resp.Body.Close()
			t.Fatalf("GET with a certificate of another CA: got %d, want the handshake refused", resp.StatusCode)
		}
	})
	t.Run("plain HTTP is not served on the TLS listener", func(t *testing.T) {
		resp, err := http.Get("http" + strings.TrimPrefix(m.url, "https") + httpapi.PathTiers)
		if err == nil {
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("plain HTTP: got %d, want 400 (net/http's answer to HTTP on a TLS port)", resp.StatusCode)
			}
		}
	})
}

// A certificate rotated on disk is served from the next handshake, without
// a restart.
func TestAPICertificateRotation(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := testenv.NewCA(t)
	certFile, keyFile := ca.IssueFiles(t, dir, "server", testenv.CertSpec{CommonName: "first", IPs: []string{"127.0.0.1"}})
	lim := limitertest.New(t, limitertest.Options{}).Limiter
	addr, _ := runServerOn(t, server.New(lim, server.Options{}), server.Listeners{TLS: server.TLSFiles{CertFile: certFile, KeyFile: keyFile}})
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM)
	served := func() string {
		t.Helper()
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	if got := served(); got != "first" {
		t.Fatalf("served certificate: got %q, want first", got)
	}
	certPEM, keyPEM := ca.Issue(t, testenv.CertSpec{CommonName: "second", IPs: []string{"127.0.0.1"}})
	for path, data := range map[string][]byte{certFile: certPEM, keyFile: keyPEM} {
		tmp := filepath.Join(dir, "tmp")
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		stamp := time.Now().Add(time.Minute) // a new mtime, whatever the clock's resolution
		if err := os.Chtimes(tmp, stamp, stamp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	if got := served(); got != "second" {
		t.Errorf("served certificate after the rotation: got %q, want second", got)
	}
}

// With http.tls set, the admin listener is served over TLS with the API's
// certificate: an operator's token, which releases anyone's slots, never
// crosses the network in the clear. It asks for no client certificate
// (the admin API knows its callers by their tokens), even when the API
// takes them, and the listening line names it https://.
func TestAdminListenerServesTLSWithTheAPICertificate(t *testing.T) {
	t.Parallel()
	lim := limitertest.New(t, limitertest.Options{}).Limiter
	dir := t.TempDir()
	ca := testenv.NewCA(t)
	certFile, keyFile := ca.IssueFiles(t, dir, "server", testenv.CertSpec{CommonName: "limiter", IPs: []string{"127.0.0.1"}})
	log := &logSink{}
	srv := server.New(lim, server.Options{Admin: newAdmin(t, lim), Logger: slog.New(slog.NewJSONHandler(log, nil))})
	adminAddr := testenv.FreeAddr(t)
	runServerOn(t, srv, server.Listeners{Admin: adminAddr, TLS: server.TLSFiles{CertFile: certFile, KeyFile: keyFile, ClientCAFile: ca.File(t, dir)}})
	awaitAccepting(t, adminAddr)

	var askedForCertificate atomic.Bool
	transport := &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: ca.Pool(),
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			askedForCertificate.Store(true)
			return &tls.Certificate{}, nil // none: the admin API must not need one
		},
	}}
	t.Cleanup(transport.CloseIdleConnections)
	overTLS := &http.Client{Transport: apitest.ValidatingAdminTransport(t, transport), Timeout: 10 * time.Second}
	audit := func(t *testing.T, hc *http.Client, scheme string) (*http.Response, error) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, scheme+"://"+adminAddr+httpapi.PathAdminAudit, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+adminToken)
		return hc.Do(req)
	}

	t.Run("an operator's call over https, trusting the CA, is answered", func(t *testing.T) {
		resp, err := audit(t, overTLS, "https")
		if err != nil {
			t.Fatalf("GET %s over https: %v", httpapi.PathAdminAudit, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		decode[httpapi.AuditResponse](t, reply{status: resp.StatusCode, header: resp.Header, body: body}, http.StatusOK)
		if got := resp.TLS.PeerCertificates[0].Subject.CommonName; got != "limiter" {
			t.Errorf("served certificate: got %q, want the API's, limiter", got)
		}
		if askedForCertificate.Load() {
			t.Errorf("the handshake asked for a client certificate, want none asked for on the admin listener")
		}
	})
	t.Run("plain HTTP is not served", func(t *testing.T) {
		resp, err := audit(t, &http.Client{Timeout: 10 * time.Second}, "http")
		if err == nil {
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("plain HTTP: got %d, want 400 (net/http's answer to HTTP on a TLS port)", resp.StatusCode)
			}
		}
	})
	t.Run("a client not trusting the CA is refused in the handshake", func(t *testing.T) {
		if resp, err := audit(t, &http.Client{Timeout: 10 * time.Second}, "https"); err == nil {
			resp.Body.Close()
			t.Errorf("https without the CA: got %d, want the certificate refused", resp.StatusCode)
		}
	})
	t.Run("the listening line names the admin listener https://", func(t *testing.T) {
		want := `"admin":"https://` + adminAddr + `"`
		for deadline := time.Now().Add(5 * time.Second); !strings.Contains(log.String(), want); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("log: got %s, want a listening line holding %s", log.String(), want)
			}
		}
	})
}
