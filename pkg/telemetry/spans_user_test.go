package telemetry_test

import (
	"context"
	"strings"
	"testing"

	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/telemetry"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestSpanErrorsCarryNoUserID: a failure recorded on the limiter's span
// (the status and the exception event) names its kind, never the error's
// text, which names the user: here another caller's acquire, heartbeat and
// release of a stream (DESIGN §19), each refused.
func TestSpanErrorsCarryNoUserID(t *testing.T) {
	ctx := context.Background()
	exported := newExporter()
	tel, err := telemetry.New(ctx, telemetry.Options{SpanExporter: exported})
	if err != nil {
		t.Fatal(err)
	}
	s := newStack(t, tel)
	user := "secret-user-" + randomID()
	stream := "stream-" + randomID()

	// Caller a takes the stream; caller b's acquire, heartbeat and release
	// of it are refused: it is a's (DESIGN §19).
	if res, err := s.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", StreamID: stream, Caller: "a"}); err != nil || !res.Granted {
		t.Fatalf("acquire by a: %+v, %v", res, err)
	}
	if _, err := s.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", StreamID: stream, Caller: "b"}); err == nil {
		t.Fatalf("acquire by b of a's stream: no error")
	}
	if _, err := s.lim.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: "three", StreamID: stream, Caller: "b"}); err == nil {
		t.Fatalf("heartbeat by b of a's stream: no error")
	}
	if _, err := s.lim.ReleaseAs(ctx, "b", user, stream); err == nil {
		t.Fatalf("release by b of a's stream: no error")
	}
	_ = tel.Shutdown(ctx)

	refused := 0
	for _, sp := range exported.GetSpans() {
		if sp.Status.Description == limiter.ErrNotSlotHolder.Error() {
			refused++
		}
	}
	if refused != 3 {
		t.Errorf("%d spans failed as %q, want 3 (acquire, heartbeat, release)", refused, limiter.ErrNotSlotHolder)
	}
	leaks := userIDLeaks(exported.GetSpans(), user)
	for _, l := range leaks {
		t.Error(l)
	}
}

func userIDLeaks(spans tracetest.SpanStubs, user string) []string {
	var out []string
	for _, sp := range spans {
		for _, kv := range sp.Attributes {
			if strings.Contains(kv.Value.Emit(), user) {
				out = append(out, "span "+sp.Name+" attribute "+string(kv.Key)+" carries the user id: "+kv.Value.Emit())
			}
		}
		if strings.Contains(sp.Status.Description, user) {
			out = append(out, "span "+sp.Name+" status description carries the user id: "+sp.Status.Description)
		}
		for _, ev := range sp.Events {
			for _, kv := range ev.Attributes {
				if strings.Contains(kv.Value.Emit(), user) {
					out = append(out, "span "+sp.Name+" event "+ev.Name+" attribute "+string(kv.Key)+" carries the user id: "+kv.Value.Emit())
				}
			}
		}
	}
	return out
}
