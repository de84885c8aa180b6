package extproc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/envoytest"
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
