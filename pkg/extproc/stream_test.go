package extproc_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/joishi/limiter/internal/envoytest"
	"github.com/joishi/limiter/pkg/extproc"
)

// Each way an Envoy stream ends releases its slot, and the slot is held
// until then: the sequences are those Envoy sends for each processing
// mode and each end.
func TestSlotReleasedOnEveryEnd(t *testing.T) {
	e := newEnv(t, envOptions{})
	for _, tt := range []struct {
		name string
		// run plays the stream after a granted request_headers; it
		// returns whether the slot must already be free before Envoy
		// closes the gRPC stream (the response's end was seen).
		run func(t *testing.T, st *envoytest.Stream) (endSeen bool)
		end func(st *envoytest.Stream)
	}{
		{
			name: "headers only: Envoy closes the stream when the HTTP stream is done",
			run: func(t *testing.T, st *envoytest.Stream) bool {
				mustContinue(t)(st.ResponseHeaders(envoytest.Headers(":status", "200", "content-type", "text/event-stream"), false))
				return false
			},
			end: (*envoytest.Stream).Close,
		},
		{
			name: "response headers with end of stream (no body)",
			run: func(t *testing.T, st *envoytest.Stream) bool {
				mustContinue(t)(st.ResponseHeaders(envoytest.Headers(":status", "204"), true))
				return true
			},
			end: (*envoytest.Stream).Close,
		},
		{
			name: "streamed response body to its end of stream",
			run: func(t *testing.T, st *envoytest.Stream) bool {
				mustContinue(t)(st.ResponseHeaders(envoytest.Headers(":status", "200"), false))
				for range 3 {
					mustContinue(t)(st.ResponseBody([]byte("data: {}\n\n"), false))
				}
				mustContinue(t)(st.ResponseBody([]byte("data: [DONE]\n\n"), true))
				return true
			},
			end: (*envoytest.Stream).Close,
		},
		{
			name: "streamed body then trailers",
			run: func(t *testing.T, st *envoytest.Stream) bool {
				mustContinue(t)(st.ResponseHeaders(envoytest.Headers(":status", "200", "content-type", "application/grpc"), false))
				mustContinue(t)(st.ResponseBody([]byte{0, 0, 0, 0, 2, 8, 1}, false))
				mustContinue(t)(st.ResponseTrailers(envoytest.Headers("grpc-status", "0")))
				return true
			},
			end: (*envoytest.Stream).Close,
		},
		{
			name: "client cancels mid-body: Envoy resets the stream",
			run: func(t *testing.T, st *envoytest.Stream) bool {
				mustContinue(t)(st.ResponseHeaders(envoytest.Headers(":status", "200"), false))
				mustContinue(t)(st.ResponseBody([]byte("data: {}\n\n"), false))
				return false
			},
			end: (*envoytest.Stream).Reset,
		},
		{
			name: "Envoy closes the stream before any response (message timeout, upstream reset)",
			run:  func(t *testing.T, st *envoytest.Stream) bool { return false },
			end:  (*envoytest.Stream).Close,
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			user := newUser()
			st := e.open(t)
			grant(t, st, user, "one")
			if got := e.Used(t, user); got != 1 {
				t.Fatalf("after the grant the user holds %d slots, want 1", got)
			}
			if tt.run(t, st) {
				e.AwaitUsed(t, user, 0, time.Second)
			} else if got := e.Used(t, user); got != 1 {
				t.Fatalf("before the stream ended the user holds %d slots, want 1", got)
			}
			tt.end(st)
			e.AwaitUsed(t, user, 0, time.Second)
			// The slot is free for the user's next stream.
			next := e.open(t)
			grant(t, next, user, "one")
			next.Close()
			e.AwaitUsed(t, user, 0, time.Second)
		})
	}
}

// mustContinue fails the test unless an answer is a CONTINUE:
// mustContinue(t)(st.ResponseHeaders(...)).
func mustContinue(t *testing.T) func(*extprocv3.ProcessingResponse, error) *extprocv3.ProcessingResponse {
	return func(resp *extprocv3.ProcessingResponse, err error) *extprocv3.ProcessingResponse {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetImmediateResponse() != nil {
			t.Fatalf("answered an ImmediateResponse %v, want CONTINUE", resp.GetImmediateResponse())
		}
		return resp
	}
}

// The stream id goes upstream on the request and back to the client on
// the response, replacing one the client sent.
func TestStreamIDHeaderBothWays(t *testing.T) {
	e := newEnv(t, envOptions{})
	st := e.open(t)
	resp, err := st.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions",
		"x-user-id", newUser(), "x-plan", "one", extproc.DefaultStreamIDHeader, "forged"), true)
	if err != nil {
		t.Fatal(err)
	}
	set := resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders()
	if len(set) != 1 || set[0].GetAppendAction().String() != "OVERWRITE_IF_EXISTS_OR_ADD" {
		t.Fatalf("request_headers mutation %v, want one header overwriting the client's", set)
	}
	upstream := string(set[0].GetHeader().GetRawValue())
	if upstream == "forged" || upstream == "" {
		t.Fatalf("stream id sent upstream %q, want the slot's own", upstream)
	}
	resp = mustContinue(t)(st.ResponseHeaders(envoytest.Headers(":status", "200"), false))
	if got, _ := envoytest.HeaderValue(resp.GetResponseHeaders().GetResponse().GetHeaderMutation(), extproc.DefaultStreamIDHeader); got != upstream {
		t.Errorf("stream id sent to the client %q, want %q as upstream", got, upstream)
	}
}

// A slot is kept alive past its TTL while the response streams, by the
// holder's heartbeat whether or not body chunks arrive.
func TestSlotOutlivesItsTTLWhileStreaming(t *testing.T) {
	e := newEnv(t, envOptions{})
	user := newUser()
	st := e.open(t)
	grant(t, st, user, "short-one") // TTL 300ms, heartbeat 100ms
	mustContinue(t)(st.ResponseHeaders(envoytest.Headers(":status", "200"), false))
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		mustContinue(t)(st.ResponseBody([]byte("data: {}\n\n"), false))
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // no chunk for longer than the TTL
	if got := e.Used(t, user); got != 1 {
		t.Fatalf("after 1.5s (TTL 300ms) the streaming user holds %d slots, want 1", got)
	}
	// And the limit holds all along.
	other := e.open(t)
	resp, err := other.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", user, "x-plan", "short-one"), false)
	if err != nil {
		t.Fatal(err)
	}
	if ir, _ := immediate(t, resp); ir.GetStatus().GetCode() != 429 {
		t.Errorf("a second stream got %d, want 429", ir.GetStatus().GetCode())
	}
	st.Close()
	e.AwaitUsed(t, user, 0, time.Second)
}

// Observability mode: Envoy expects no answers; the slot is held all the
// same.
func TestObservabilityModeSendsNoAnswer(t *testing.T) {
	e := newEnv(t, envOptions{envoy: envoytest.Options{MessageTimeout: 300 * time.Millisecond}})
	user := newUser()
	st := e.open(t)
	_, err := st.Send(&extprocv3.ProcessingRequest{ObservabilityMode: true, Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", user, "x-plan", "one")}}})
	if err == nil {
		t.Fatal("the server answered a message in observability mode")
	}
	e.AwaitUsed(t, user, 1, time.Second)
	st.Close()
	e.AwaitUsed(t, user, 0, time.Second)
}

// A slot lost while its stream runs (support released it) cuts the
// stream at the next message Envoy sends, as the proxy cuts it.
func TestLostSlotCutsAtTheNextMessage(t *testing.T) {
	e := newEnv(t, envOptions{})
	user := newUser()
	st := e.open(t)
	grant(t, st, user, "short-one") // heartbeat every 100ms
	mustContinue(t)(st.ResponseHeaders(envoytest.Headers(":status", "200"), false))
	if _, err := e.Stack.Limiter.ReleaseAll(context.Background(), user, "test-call"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		resp, err := st.ResponseBody([]byte("data: {}\n\n"), false)
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetImmediateResponse() != nil {
			_, body := immediate(t, resp)
			if body.Error.Code != "slot_lost" {
				t.Errorf("cut with code %q, want slot_lost", body.Error.Code)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stream was not cut 2s after its slot was released (heartbeat 100ms)")
		}
		time.Sleep(20 * time.Millisecond)
	}
	st.Close()
	if got := e.Used(t, user); got != 0 {
		t.Errorf("the user holds %d slots, want 0", got)
	}
}

// Trailers are a message like any other: after the slot was lost (support
// released it) the request's trailers and the response's are answered
// with the ImmediateResponse slot_lost, not CONTINUE, and the stream is
// counted lost, as the proxy counts a stream whose slot was lost however
// it ends.
func TestLostSlotCutsAtTheTrailers(t *testing.T) {
	for _, tc := range []struct {
		name string
		// before plays the stream after a granted request_headers, up to
		// where its slot is lost.
		before   func(t *testing.T, st *envoytest.Stream)
		trailers func(st *envoytest.Stream) (*extprocv3.ProcessingResponse, error)
	}{
		{
			name:   "request trailers (request_trailer_mode SEND)",
			before: func(t *testing.T, st *envoytest.Stream) {},
			trailers: func(st *envoytest.Stream) (*extprocv3.ProcessingResponse, error) {
				return st.RequestTrailers(envoytest.Headers("x-body-sha256", "0"))
			},
		},
		{
			name: "response trailers of a gRPC upstream (response_trailer_mode SEND)",
			before: func(t *testing.T, st *envoytest.Stream) {
				mustContinue(t)(st.ResponseHeaders(envoytest.Headers(":status", "200", "content-type", "application/grpc"), false))
				mustContinue(t)(st.ResponseBody([]byte{0, 0, 0, 0, 2, 8, 1}, false))
			},
			trailers: func(st *envoytest.Stream) (*extprocv3.ProcessingResponse, error) {
				return st.ResponseTrailers(envoytest.Headers("grpc-status", "0"))
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{envoy: envoytest.Options{ResponseBodyMode: filterv3.ProcessingMode_STREAMED}})
			user := newUser()
			st := e.open(t)
			grant(t, st, user, "short-one") // heartbeat every 100ms
			tc.before(t, st)
			if _, err := e.Stack.Limiter.ReleaseAll(context.Background(), user, "test-call"); err != nil {
				t.Fatal(err)
			}
			const lost = `limiter_streams_lost_total{mode="extproc"}`
			deadline := time.Now().Add(2 * time.Second)
			for e.Metric(t, lost) != "1" {
				if time.Now().After(deadline) {
					t.Fatalf("%s = %q 2s after the slot was released (heartbeat 100ms), want 1", lost, e.Metric(t, lost))
				}
				time.Sleep(20 * time.Millisecond)
			}
			resp, err := tc.trailers(st)
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetImmediateResponse() == nil {
				t.Fatalf("the trailers after the slot was lost were answered %v, want the ImmediateResponse slot_lost", resp)
			}
			if _, body := immediate(t, resp); body.Error.Code != "slot_lost" {
				t.Errorf("cut with code %q, want slot_lost", body.Error.Code)
			}
			st.Close()
			for end, want := range map[string]string{"lost": "1", "complete": "0"} {
				series := `limiter_streams_held_total{end="` + end + `",mode="extproc"}`
				if got := e.Metric(t, series); got != want {
					t.Errorf("%s = %q, want %q", series, got, want)
				}
			}
		})
	}
}

// Envoy closes its side of the gRPC stream however the HTTP stream ends:
// done, or reset by its client. Where Envoy streams the response body, the
// response's end is a message (the last chunk's end_of_stream, or the
// trailers), and a close before it is the client leaving mid-response,
// counted client_gone as the proxy counts it; where it sends no body, or
// one buffered message, the close after the response headers is the end,
// complete.
func TestEnvoyClosingTheStreamEndsItByTheBodyMode(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode filterv3.ProcessingMode_BodySendMode
		// run plays the stream after a granted request_headers.
		run  func(t *testing.T, st *envoytest.Stream)
		want string
	}{
		{
			name: "STREAMED, closed after a chunk without end_of_stream",
			mode: filterv3.ProcessingMode_STREAMED,
			run: func(t *testing.T, st *envoytest.Stream) {
				mustContinue(t)(st.ResponseHeaders(envoytest.Headers(":status", "200", "content-type", "text/event-stream"), false))
				mustContinue(t)(st.ResponseBody([]byte("data: {}\n\n"), false))
			},
			want: "client_gone",
		},
		{
			name: "STREAMED, closed after the response headers, before any chunk",
			mode: filterv3.ProcessingMode_STREAMED,
			run: func(t *testing.T, st *envoytest.Stream) {
				mustContinue(t)(st.ResponseHeaders(envoytest.Headers(":status", "200", "content-type", "text/event-stream"), false))
			},
			want: "client_gone",
		},
		{
			name: "FULL_DUPLEX_STREAMED, closed after a chunk without end_of_stream",
			mode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			run: func(t *testing.T, st *envoytest.Stream) {
				mustContinue(t)(st.ResponseHeaders(envoytest.Headers(":status", "200"), false))
				mustContinue(t)(st.ResponseBody([]byte("data: {}\n\n"), false))
			},
			want: "client_gone",
		},
		{
			name: "STREAMED, the last chunk with end_of_stream",
			mode: filterv3.ProcessingMode_STREAMED,
			run: func(t *testing.T, st *envoytest.Stream) {
				mustContinue(t)(st.ResponseHeaders(envoytest.Headers(":status", "200"), false))
				mustContinue(t)(st.ResponseBody([]byte("data: {}\n\n"), false))
				mustContinue(t)(st.ResponseBody([]byte("data: [DONE]\n\n"), true))
			},
			want: "complete",
		},
		{
			name: "NONE, closed after the response headers",
			mode: filterv3.ProcessingMode_NONE,
			run: func(t *testing.T, st *envoytest.Stream) {
				mustContinue(t)(st.ResponseHeaders(envoytest.Headers(":status", "200", "content-type", "text/event-stream"), false))
			},
			want: "complete",
		},
		{
			name: "BUFFERED, the body without end_of_stream (trailers skipped)",
			mode: filterv3.ProcessingMode_BUFFERED,
			run: func(t *testing.T, st *envoytest.Stream) {
				mustContinue(t)(st.ResponseHeaders(envoytest.Headers(":status", "200", "content-type", "application/grpc"), false))
				mustContinue(t)(st.ResponseBody([]byte{0, 0, 0, 0, 2, 8, 1}, false))
			},
			want: "complete",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{envoy: envoytest.Options{ResponseBodyMode: tc.mode}})
			user := newUser()
			st := e.open(t)
			grant(t, st, user, "one")
			tc.run(t, st)
			if err := st.HalfClose(5 * time.Second); err != nil {
				t.Fatalf("after Envoy's half-close the server ended the stream with %v, want OK", err)
			}
			e.AwaitUsed(t, user, 0, time.Second)
			awaitEnded(t, e, tc.want)
		})
	}

	// An Envoy that announces no body mode (protocol_config without one)
	// streams the response body when a chunk comes without end_of_stream.
	t.Run("no mode announced, closed after a chunk without end_of_stream", func(t *testing.T) {
		e := newEnv(t, envOptions{})
		user := newUser()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		c, err := extprocv3.NewExternalProcessorClient(e.envoy.Conn()).Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, req := range []*extprocv3.ProcessingRequest{
			{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
				Headers: envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", user, "x-plan", "one")}}},
			{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
				Headers: envoytest.Headers(":status", "200")}}},
			{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("data: {}\n\n")}}},
		} {
			if err := c.Send(req); err != nil {
				t.Fatal(err)
			}
			if resp, err := c.Recv(); err != nil || resp.GetImmediateResponse() != nil {
				t.Fatalf("%T answered %v, %v; want CONTINUE", req.GetRequest(), resp, err)
			}
		}
		if err := c.CloseSend(); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("after Envoy's half-close: %v, want the stream closed with OK", err)
		}
		e.AwaitUsed(t, user, 0, time.Second)
		awaitEnded(t, e, "client_gone")
	})
}

// awaitEnded waits up to a second for e's one stream to be counted ended
// with end, and fails the test unless it is, and only with end.
func awaitEnded(t *testing.T, e *env, end string) {
	t.Helper()
	series := func(end string) string { return `limiter_streams_held_total{end="` + end + `",mode="extproc"}` }
	deadline := time.Now().Add(time.Second)
	for e.Metric(t, series(end)) != "1" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	for _, other := range []string{"complete", "client_gone", "lost", "shutdown"} {
		want := "0"
		if other == end {
			want = "1"
		}
		if got := e.Metric(t, series(other)); got != want {
			t.Errorf("%s = %q, want %q", series(other), got, want)
		}
	}
}
