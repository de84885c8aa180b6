package extproc_test

import (
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/joishi/limiter/internal/envoytest"
	"go.opentelemetry.io/otel/attribute"
)

// The stream metrics are the proxy's, labelled mode="extproc": active,
// held by end, refused by reason; and each Envoy stream is one span that
// names its stream id and its end.
func TestMetricsAndSpans(t *testing.T) {
	e := newEnv(t, envOptions{})
	user := newUser()
	st := e.open(t)
	id := grant(t, st, user, "one")
	if got := e.Metric(t, `limiter_streams_active{mode="extproc"}`); got != "1" {
		t.Errorf("streams_active while streaming: %q, want 1", got)
	}
	refused := e.open(t)
	if _, err := refused.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", user, "x-plan", "one"), false); err != nil {
		t.Fatal(err)
	}
	refused.Close()
	mustContinue(t)(st.ResponseHeaders(envoytest.Headers(":status", "204"), true))
	st.Close()
	e.AwaitUsed(t, user, 0, time.Second)

	for series, want := range map[string]string{
		`limiter_streams_active{mode="extproc"}`:                       "0",
		`limiter_streams_held_total{end="complete",mode="extproc"}`:    "1",
		`limiter_streams_refused_total{mode="extproc",reason="limit"}`: "1",
	} {
		if got := e.Metric(t, series); got != want {
			t.Errorf("%s = %q, want %s", series, got, want)
		}
	}

	deadline := time.Now().Add(2 * time.Second)
	for len(e.spans.Ended()) < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	var granted bool
	for _, s := range e.spans.Ended() {
		if s.Name() != "extproc.stream" {
			continue
		}
		attrs := map[attribute.Key]attribute.Value{}
		for _, a := range s.Attributes() {
			attrs[a.Key] = a.Value
		}
		if attrs["limiter.stream_id"].AsString() == id {
			granted = true
			if got := attrs["limiter.end"].AsString(); got != "complete" {
				t.Errorf("the granted stream's span: limiter.end %q, want complete", got)
			}
		}
	}
	if !granted {
		t.Errorf("no extproc.stream span carries the stream id %s among %d spans", id, len(e.spans.Ended()))
	}
}

// In FULL_DUPLEX_STREAMED mode Envoy forwards only what the processor
// sends back: each body chunk is returned as it came.
func TestFullDuplexBodyIsEchoed(t *testing.T) {
	e := newEnv(t, envOptions{envoy: envoytest.Options{ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}})
	user := newUser()
	st := e.open(t)
	grant(t, st, user, "one")
	mustContinue(t)(st.ResponseHeaders(envoytest.Headers(":status", "200"), false))
	for i, chunk := range []string{"data: {}\n\n", "data: [DONE]\n\n"} {
		eos := i == 1
		resp := mustContinue(t)(st.ResponseBody([]byte(chunk), eos))
		got := resp.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if string(got.GetBody()) != chunk || got.GetEndOfStream() != eos {
			t.Errorf("chunk %d echoed as %q (end %v), want %q (end %v)", i, got.GetBody(), got.GetEndOfStream(), chunk, eos)
		}
	}
	e.AwaitUsed(t, user, 0, time.Second)
}
