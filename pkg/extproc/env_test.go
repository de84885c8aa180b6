package extproc_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/joishi/limiter/internal/envoytest"
	"github.com/joishi/limiter/internal/holdtest"
	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/extproc"
	"github.com/joishi/limiter/pkg/hold"
	"github.com/joishi/limiter/pkg/identity"
	"github.com/joishi/limiter/pkg/server"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// envoyToken is the Envoy caller's token in the tests' API tokens file.
const envoyToken = "envoy-token-0123456789abcdef"

// env is an ext_proc server on a limiter on the shared standalone Redis,
// served on a loopback port, and an Envoy connected to it.
type env struct {
	*holdtest.Env
	spans *tracetest.SpanRecorder
	addr  string
	envoy *envoytest.Envoy
	stop  context.CancelFunc
	done  chan error
}

type envOptions struct {
	stack    limitertest.Options
	identity identity.Options
	extproc  extproc.Options
	// callers is the API tokens file's content; "" leaves the API open.
	callers string
	// envoy configures the Envoy; its Token defaults to envoyToken.
	envoy envoytest.Options
	grace time.Duration
	// wait is the holder's Options.Wait (extproc.wait).
	wait time.Duration
}

func newEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	held := holdtest.New(t, holdtest.Options{Stack: o.stack, Hold: hold.Options{Mode: "extproc", Wait: o.wait}})
	spans := tracetest.NewSpanRecorder()
	o.extproc.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	ident, err := identity.New(o.identity)
	if err != nil {
		t.Fatal(err)
	}
	if o.callers != "" {
		path := filepath.Join(t.TempDir(), "api-tokens")
		if err := os.WriteFile(path, []byte(o.callers), 0o600); err != nil {
			t.Fatal(err)
		}
		if o.extproc.Callers, err = server.LoadCallers(server.CallersOptions{TokensFile: path}); err != nil {
			t.Fatal(err)
		}
		if o.envoy.Token == "" {
			o.envoy.Token = envoyToken
		}
	}
	o.extproc.Tiers = held.Stack.Table
	srv, err := extproc.New(held.Holder, ident, o.extproc)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := extproc.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if o.grace == 0 {
		o.grace = 5 * time.Second
	}
	ctx, stop := context.WithCancel(context.Background())
	e := &env{Env: held, spans: spans, addr: ln.Addr().String(), stop: stop, done: make(chan error, 1)}
	go func() { e.done <- srv.Run(ctx, ln, nil, o.grace) }()
	t.Cleanup(func() {
		stop()
		<-e.done
	})
	if o.envoy.MessageTimeout == 0 {
		o.envoy.MessageTimeout = 5 * time.Second // a loaded machine must not fail these
	}
	if e.envoy, err = envoytest.Dial(e.addr, o.envoy); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.envoy.Close() })
	return e
}

func (e *env) open(t *testing.T) *envoytest.Stream {
	t.Helper()
	st, err := e.envoy.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

func newUser() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "u-" + hex.EncodeToString(b[:])
}

// grant sends request headers for user and plan and fails the test unless
// the stream is granted; it returns the stream id set for the upstream.
func grant(t *testing.T, st *envoytest.Stream, user, plan string) string {
	t.Helper()
	resp, err := st.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", user, "x-plan", plan), false)
	if err != nil {
		t.Fatalf("request_headers: %v", err)
	}
	common := resp.GetRequestHeaders().GetResponse()
	if common == nil || common.GetStatus() != extprocv3.CommonResponse_CONTINUE {
		t.Fatalf("request_headers answered %v, want CONTINUE", resp)
	}
	id, ok := envoytest.HeaderValue(common.GetHeaderMutation(), extproc.DefaultStreamIDHeader)
	if !ok || id == "" {
		t.Fatalf("request_headers answer sets no %s header: %v", extproc.DefaultStreamIDHeader, resp)
	}
	return id
}

// immediate returns the ImmediateResponse of resp, failing the test if it
// is none; its body decoded.
func immediate(t *testing.T, resp *extprocv3.ProcessingResponse) (*extprocv3.ImmediateResponse, holdtest.ErrorBody) {
	t.Helper()
	ir := resp.GetImmediateResponse()
	if ir == nil {
		t.Fatalf("answer %v, want an ImmediateResponse", resp)
	}
	var body holdtest.ErrorBody
	if err := json.Unmarshal(ir.GetBody(), &body); err != nil {
		t.Fatalf("ImmediateResponse body %q: %v", ir.GetBody(), err)
	}
	if ct, _ := envoytest.HeaderValue(ir.GetHeaders(), "content-type"); ct != "application/json" {
		t.Errorf("ImmediateResponse content-type %q, want application/json", ct)
	}
	return ir, body
}
