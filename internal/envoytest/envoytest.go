// Package envoytest plays Envoy's ext_proc filter against an ext_proc
// server, for tests where Envoy itself cannot run. It sends the message
// sequences Envoy sends, built from go-control-plane's types as Envoy's
// documented protocol (envoy.service.ext_proc.v3 and the filter's
// ProcessingMode) describes them:
//
//   - one bidirectional gRPC stream per HTTP stream, opened on the first
//     message; the first message carries protocol_config;
//   - request_headers (names lower-cased, values in raw_value,
//     pseudo-headers included; end_of_stream when there is no body), then,
//     as the processing mode says, request_body (BUFFERED: the whole body
//     in one message, with end_of_stream unless trailers follow; STREAMED:
//     one per chunk), request_trailers, response_headers, response_body
//     chunks (STREAMED: one per chunk, the last with end_of_stream unless
//     trailers follow) and response_trailers;
//   - every message answered by exactly one response of the matching kind,
//     or an ImmediateResponse, within message_timeout; anything else is
//     spurious. A response carrying only override_message_timeout
//     restarts the message's timer with that value instead, once per
//     message, when it is within 1ms..max_message_timeout (unset: never);
//     otherwise Envoy ignores it;
//   - after an ImmediateResponse, and when the HTTP stream ends however it
//     ends, Envoy closes the gRPC stream: a half-close immediately
//     followed by a reset (Close). A downstream reset or Envoy dying
//     resets it without the half-close (Reset, or closing the connection).
//
// None of this was checked against a running Envoy here: it is the
// protocol as documented, which the tests hold the server to.
package envoytest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
)

// DefaultMessageTimeout is Envoy's default message_timeout.
const DefaultMessageTimeout = 200 * time.Millisecond

// Envoy is one Envoy's connection to an ext_proc server: every stream it
// opens shares it, as Envoy's gRPC client multiplexes them.
type Envoy struct {
	conn *grpc.ClientConn
	opts Options
}

// Options describe the Envoy.
type Options struct {
	// Token, when set, is sent as "authorization: Bearer <token>" on
	// every stream, as grpc_service.initial_metadata would.
	Token string
	// DialOptions replace the default (plaintext) transport credentials.
	DialOptions []grpc.DialOption
	// MessageTimeout bounds the wait for each response, as the filter's
	// message_timeout does. Default 200ms, Envoy's default; tests on a
	// loaded machine may give more.
	MessageTimeout time.Duration
	// MaxMessageTimeout is the filter's max_message_timeout: the longest
	// override_message_timeout taken. Default 0: overrides are ignored,
	// as Envoy ignores them without it.
	MaxMessageTimeout time.Duration
	// RequestBodyMode and ResponseBodyMode are the body modes announced
	// in protocol_config. Default NONE. The stream sends what its caller
	// sends (RequestBody, ResponseBody): the modes only say what Envoy
	// would.
	RequestBodyMode, ResponseBodyMode filterv3.ProcessingMode_BodySendMode
}

// Dial connects to the ext_proc server at addr.
func Dial(addr string, opts Options) (*Envoy, error) {
	if opts.MessageTimeout == 0 {
		opts.MessageTimeout = DefaultMessageTimeout
	}
	dial := opts.DialOptions
	if len(dial) == 0 {
		dial = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conn, err := grpc.NewClient(addr, dial...)
	if err != nil {
		return nil, err
	}
	return &Envoy{conn: conn, opts: opts}, nil
}

// Close closes the connection, resetting every stream on it (Envoy
// restarting).
func (e *Envoy) Close() error { return e.conn.Close() }

// Conn is the underlying connection (for the health service).
func (e *Envoy) Conn() *grpc.ClientConn { return e.conn }

// Stream is one HTTP stream through the filter.
type Stream struct {
	e      *Envoy
	ctx    context.Context
	cancel context.CancelFunc
	grpc   extprocv3.ExternalProcessor_ProcessClient
	first  bool
	// Metadata, when set before the first message, is sent as its
	// metadata_context (the namespaces the filter forwards).
	Metadata *corev3.Metadata
	// Overrides are the override_message_timeout values the server sent,
	// taken or not, in order.
	Overrides []time.Duration
}

// Open opens a stream. It is opened for real on the first message, as
// Envoy opens it lazily.
func (e *Envoy) Open(ctx context.Context) (*Stream, error) {
	ctx, cancel := context.WithCancel(ctx)
	if e.opts.Token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+e.opts.Token)
	}
	c, err := extprocv3.NewExternalProcessorClient(e.conn).Process(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	return &Stream{e: e, ctx: ctx, cancel: cancel, grpc: c, first: true}, nil
}

// Headers builds a header map as Envoy sends it: names lower-cased,
// values in raw_value. pairs are name, value, name, value...
func Headers(pairs ...string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(pairs); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: strings.ToLower(pairs[i]), RawValue: []byte(pairs[i+1])})
	}
	return m
}

// RequestHeaders returns the request headers of a POST to path, with
// extra headers (name, value pairs).
func RequestHeaders(path string, extra ...string) *corev3.HeaderMap {
	return Headers(append([]string{
		":method", "POST", ":path", path, ":authority", "llm.example", ":scheme", "https",
		"content-type", "application/json", "x-request-id", "5f0c7e7e-0000-4000-8000-000000000000",
	}, extra...)...)
}

// JWTPayloadMetadata is the dynamic metadata jwt_authn sets with
// payload_in_metadata: key under its namespace.
func JWTPayloadMetadata(namespace, key string, claims map[string]any) (*corev3.Metadata, error) {
	payload, err := structpb.NewStruct(claims)
	if err != nil {
		return nil, err
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		namespace: {Fields: map[string]*structpb.Value{key: structpb.NewStructValue(payload)}},
	}}, nil
}

// ErrSpurious: the server answered with a response of another kind than
// the message it was sent, which Envoy counts as spurious and after which
// it ignores the stream.
var ErrSpurious = errors.New("spurious response")

// ErrTimeout: no response within the message timeout.
var ErrTimeout = errors.New("message timeout")

// send sends req and waits for its response; want is the response kind
// that matches it (an ImmediateResponse matches too, except after the
// response started, where Envoy takes it as well).
func (s *Stream) send(req *extprocv3.ProcessingRequest, matches func(*extprocv3.ProcessingResponse) bool) (*extprocv3.ProcessingResponse, error) {
	if s.first {
		req.ProtocolConfig = &extprocv3.ProtocolConfiguration{
			RequestBodyMode:  s.e.opts.RequestBodyMode,
			ResponseBodyMode: s.e.opts.ResponseBodyMode,
		}
		req.MetadataContext = s.Metadata
		s.first = false
	}
	if err := s.grpc.Send(req); err != nil {
		if errors.Is(err, io.EOF) {
			// The server ended the stream (a refusal before any message):
			// its status comes with the next receive, as gRPC has it.
			if _, rerr := s.grpc.Recv(); rerr != nil {
				err = rerr
			}
		}
		return nil, fmt.Errorf("send: %w", err)
	}
	type result struct {
		resp *extprocv3.ProcessingResponse
		err  error
	}
	got := make(chan result, 1)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			resp, err := s.grpc.Recv()
			select {
			case got <- result{resp, err}:
			case <-stop:
				return
			}
			if err != nil || resp.GetOverrideMessageTimeout() == nil || resp.GetResponse() != nil {
				return
			}
		}
	}()
	timeout := s.e.opts.MessageTimeout
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	overridden := false
	for {
		select {
		case r := <-got:
			if r.err != nil {
				return nil, fmt.Errorf("recv: %w", r.err)
			}
			if o := r.resp.GetOverrideMessageTimeout(); o != nil && r.resp.GetResponse() == nil {
				d := o.AsDuration()
				s.Overrides = append(s.Overrides, d)
				if !overridden && d >= time.Millisecond && d <= s.e.opts.MaxMessageTimeout {
					overridden, timeout = true, d
					timer.Reset(d)
				}
				continue
			}
			if _, immediate := r.resp.GetResponse().(*extprocv3.ProcessingResponse_ImmediateResponse); !immediate && !matches(r.resp) {
				return r.resp, fmt.Errorf("%w: %T answering %T", ErrSpurious, r.resp.GetResponse(), req.GetRequest())
			}
			return r.resp, nil
		case <-timer.C:
			return nil, fmt.Errorf("%w: no answer to %T within %s", ErrTimeout, req.GetRequest(), timeout)
		}
	}
}

// Send sends req as it is and waits for any answer: for messages the
// helpers below do not build (observability mode, flow control).
func (s *Stream) Send(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
	return s.send(req, func(*extprocv3.ProcessingResponse) bool { return true })
}

// RequestHeaders sends request_headers; eos says the request has no body.
func (s *Stream) RequestHeaders(h *corev3.HeaderMap, eos bool) (*extprocv3.ProcessingResponse, error) {
	return s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: h, EndOfStream: eos}}},
		func(r *extprocv3.ProcessingResponse) bool { return r.GetRequestHeaders() != nil })
}

// RequestBody sends a request body message: in BUFFERED mode the whole
// body, eos set unless trailers follow; in STREAMED mode one chunk, eos on
// the last.
func (s *Stream) RequestBody(body []byte, eos bool) (*extprocv3.ProcessingResponse, error) {
	return s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: eos}}},
		func(r *extprocv3.ProcessingResponse) bool { return r.GetRequestBody() != nil })
}

// RequestTrailers sends request_trailers (request_trailer_mode SEND).
func (s *Stream) RequestTrailers(h *corev3.HeaderMap) (*extprocv3.ProcessingResponse, error) {
	return s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
		RequestTrailers: &extprocv3.HttpTrailers{Trailers: h}}},
		func(r *extprocv3.ProcessingResponse) bool { return r.GetRequestTrailers() != nil })
}

// ResponseHeaders sends response_headers; eos says the response has no
// body.
func (s *Stream) ResponseHeaders(h *corev3.HeaderMap, eos bool) (*extprocv3.ProcessingResponse, error) {
	return s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: h, EndOfStream: eos}}},
		func(r *extprocv3.ProcessingResponse) bool { return r.GetResponseHeaders() != nil })
}

// ResponseBody sends one response body chunk (STREAMED mode); eos marks
// the last one when no trailers follow.
func (s *Stream) ResponseBody(chunk []byte, eos bool) (*extprocv3.ProcessingResponse, error) {
	return s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: chunk, EndOfStream: eos}}},
		func(r *extprocv3.ProcessingResponse) bool { return r.GetResponseBody() != nil })
}

// ResponseTrailers sends response_trailers (trailer mode SEND).
func (s *Stream) ResponseTrailers(h *corev3.HeaderMap) (*extprocv3.ProcessingResponse, error) {
	return s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
		ResponseTrailers: &extprocv3.HttpTrailers{Trailers: h}}},
		func(r *extprocv3.ProcessingResponse) bool { return r.GetResponseTrailers() != nil })
}

// Close ends the stream as Envoy's filter does when the HTTP stream is
// done, after an ImmediateResponse, or on a message timeout: a half-close
// immediately followed by a reset.
func (s *Stream) Close() {
	_ = s.grpc.CloseSend()
	s.cancel()
}

// HalfClose only half-closes the stream and waits up to within for the
// server to end it, returning the server's final status (nil: OK).
func (s *Stream) HalfClose(within time.Duration) error {
	defer s.cancel()
	if err := s.grpc.CloseSend(); err != nil {
		return err
	}
	return s.awaitEnd(within)
}

// CloseSend only half-closes the stream and returns at once: a message
// still waiting for its answer (in another goroutine) then gets the end
// of the stream, if the server ends it.
func (s *Stream) CloseSend() error { return s.grpc.CloseSend() }

// Reset resets the stream without a half-close, as a downstream reset
// or an aborted client does.
func (s *Stream) Reset() { s.cancel() }

// AwaitEnd waits up to within for the server to end the stream and
// returns its status: nil for OK.
func (s *Stream) AwaitEnd(within time.Duration) error { return s.awaitEnd(within) }

func (s *Stream) awaitEnd(within time.Duration) error {
	done := make(chan error, 1)
	go func() {
		for {
			if _, err := s.grpc.Recv(); err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				done <- err
				return
			}
		}
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(within):
		return fmt.Errorf("the server did not end the stream within %s", within)
	}
}

// HeaderValue returns the value a header mutation sets for name, and
// whether it sets one.
func HeaderValue(m *extprocv3.HeaderMutation, name string) (string, bool) {
	for _, h := range m.GetSetHeaders() {
		if h.GetHeader().GetKey() == name {
			if raw := h.GetHeader().GetRawValue(); len(raw) > 0 {
				return string(raw), true
			}
			return h.GetHeader().GetValue(), true
		}
	}
	return "", false
}
