package extproc_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/joishi/limiter/internal/envoytest"
	"github.com/joishi/limiter/pkg/extproc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// gRPC health answers SERVING once the tiers have synced (the test stack's
// static table is synced at once), for the ext_proc service and for "".
func TestHealthServing(t *testing.T) {
	e := newEnv(t, envOptions{})
	client := healthpb.NewHealthClient(e.envoy.Conn())
	for _, service := range []string{"", "envoy.service.ext_proc.v3.ExternalProcessor"} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		cancel()
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health of %q: %v, %v; want SERVING", service, resp, err)
		}
	}
}

// On shutdown, a stream still open after the grace has its slot released
// and its gRPC stream closed with OK, so that Envoy carries on with the
// HTTP stream without the filter rather than failing it; a stream that
// ends within the grace is waited for.
func TestDrainReleasesAndClosesWithOK(t *testing.T) {
	e := newEnv(t, envOptions{grace: 500 * time.Millisecond})
	long, short := newUser(), newUser()
	stLong := e.open(t)
	grant(t, stLong, long, "one")
	mustContinue(t)(stLong.ResponseHeaders(envoytest.Headers(":status", "200"), false))
	stShort := e.open(t)
	grant(t, stShort, short, "one")

	start := time.Now()
	e.stop()
	time.Sleep(100 * time.Millisecond)
	// Within the grace the short stream completes normally.
	mustContinue(t)(stShort.ResponseHeaders(envoytest.Headers(":status", "204"), true))
	e.AwaitUsed(t, short, 0, time.Second)
	stShort.Close()

	if err := stLong.AwaitEnd(5 * time.Second); err != nil {
		t.Fatalf("the long stream ended with %v, want OK", err)
	}
	if took := time.Since(start); took < 400*time.Millisecond {
		t.Errorf("the long stream was ended after %s, before the 500ms grace", took)
	}
	e.AwaitUsed(t, long, 0, time.Second)
	select {
	case err := <-e.done:
		if err == nil || !strings.Contains(err.Error(), "1 streams still open") {
			t.Errorf("Run returned %v, want the count of streams released at the end of the grace", err)
		}
		e.done <- err // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the grace")
	}
}

// A request whose slot waits for its body (a body: pool source) holds
// none yet. When the drain's grace ends before Envoy sends the body, it is
// answered 503 limiter_unavailable and counted refused, as a wait the
// drain ends is, rather than closed with OK: Envoy would pass it upstream
// holding no slot (here past model=big's cap, which another stream holds).
func TestTheDrainRefusesARequestAwaitingItsBody(t *testing.T) {
	const grace = 300 * time.Millisecond
	o := bodyEnvOptions(t, filterv3.ProcessingMode_BUFFERED, modelBody)
	o.grace = grace
	e := newEnv(t, o)
	holder := e.open(t)
	heldHeaders(t, e, holder, newUser())
	grantedAtBody(t)(holder.RequestBody([]byte(`{"model":"big"}`), true))

	// A raw stream: the answer comes with no message of Envoy's to answer.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := extprocv3.NewExternalProcessorClient(e.envoy.Conn()).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	user := newUser()
	if err := c.Send(&extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", user, "x-plan", "three")}},
	}); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Recv()
	if err != nil || resp.GetRequestHeaders() == nil {
		t.Fatalf("request_headers answered %v, %v; want CONTINUE (the slot waits for the body)", resp, err)
	}
	if _, ok := envoytest.HeaderValue(resp.GetRequestHeaders().GetResponse().GetHeaderMutation(), extproc.DefaultStreamIDHeader); ok {
		t.Fatal("a slot was taken at the request headers")
	}

	start := time.Now()
	e.stop() // Envoy is still buffering the client's body
	resp, err = c.Recv()
	if err != nil {
		t.Fatalf("the request awaiting its body got no answer at the end of the grace (%v): "+
			"Envoy would pass it upstream holding no slot; want 503 limiter_unavailable", err)
	}
	ir, body := immediate(t, resp)
	if ir.GetStatus().GetCode() != 503 || body.Error.Code != "limiter_unavailable" || !strings.Contains(body.Error.Message, "shutting down") {
		t.Errorf("got %d %s (%q), want 503 limiter_unavailable saying the limiter is shutting down",
			ir.GetStatus().GetCode(), body.Error.Code, body.Error.Message)
	}
	if took := time.Since(start); took < grace-50*time.Millisecond {
		t.Errorf("answered %s after the drain began, before the %s grace ended: the body might still have come", took, grace)
	}
	if _, err := c.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("after the answer: %v, want the stream closed with OK", err)
	}
	if got, want := e.Metric(t, `limiter_streams_refused_total{mode="extproc",reason="unavailable"}`), "1"; got != want {
		t.Errorf(`limiter_streams_refused_total{reason="unavailable"} = %q, want %s`, got, want)
	}
	if got := e.Used(t, user); got != 0 {
		t.Errorf("the refused user holds %d slots, want 0", got)
	}
	select {
	case err := <-e.done:
		e.done <- err // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the grace")
	}
}
