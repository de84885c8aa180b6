package telemetry

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/semconv/v1.43.0/httpconv"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// httpScope is the instrumentation scope of the HTTP server's spans and
// metrics.
const httpScope = meterName + "/http"

// httpMetrics are the HTTP server's instruments, as OpenTelemetry's
// semantic conventions name them (http_server_request_duration_seconds,
// http_server_request_body_size_bytes, http_server_response_body_size_bytes
// once exported), with otelhttp's buckets.
type httpMetrics struct {
	duration metric.Float64Histogram
	request  metric.Int64Histogram
	response metric.Int64Histogram
	labels   labelCache
}

func newHTTPMetrics(mp metric.MeterProvider) (*httpMetrics, error) {
	m := mp.Meter(httpScope)
	duration, err1 := httpconv.NewServerRequestDuration(m, metric.WithExplicitBucketBoundaries(
		0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10))
	request, err2 := httpconv.NewServerRequestBodySize(m)
	response, err3 := httpconv.NewServerResponseBodySize(m)
	for _, err := range []error{err1, err2, err3} {
		if err != nil {
			return nil, err
		}
	}
	return &httpMetrics{duration: duration.Inst(), request: request.Inst(), response: response.Inst()}, nil
}

// Middleware records the HTTP server metrics of every request and, when
// spans are recorded (an exporter is configured), traces it as a server
// span named by its route ("POST /v1/slots/acquire"), continuing the
// caller's trace context. It is a server.Options.Middleware.
//
// It does what otelhttp's handler did, with the same metrics, attributes
// and span, for less: the metrics' attribute sets are built once per
// route, method, status and protocol, the response writer and body
// counter are pooled, and without an exporter no trace context is read
// and no span started, since nothing would be recorded.
func (t *Telemetry) Middleware(next http.Handler) http.Handler {
	h := &httpServer{next: next, metrics: t.httpMetrics}
	if _, off := t.TracerProvider.(noop.TracerProvider); !off {
		h.tracer, h.propagator = t.TracerProvider.Tracer(httpScope), t.Propagator
	}
	return h
}

type httpServer struct {
	next    http.Handler
	metrics *httpMetrics
	// tracer is nil when spans are not recorded.
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
}

var recorders = sync.Pool{New: func() any { return new(recorder) }}

func (h *httpServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := recorders.Get().(*recorder)
	rec.reset(w)
	if body := r.Body; body != nil && body != http.NoBody {
		// A body of its own, not the pooled recorder's: a reverse
		// proxy's transport may still be reading it (sending it
		// upstream) after the handler returned and the recorder went
		// back to the pool.
		rec.body = &countingBody{ReadCloser: body}
		r.Body = rec.body
		// net/http looks at the body it made once the handler returns.
		defer func() { r.Body = body }()
	}

	served, span := r, trace.Span(nil)
	if h.tracer != nil {
		ctx := h.propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span = h.tracer.Start(ctx, spanName(r), trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(requestTraceAttrs(r)...))
		defer span.End()
		served = r.WithContext(ctx)
	}
	h.next.ServeHTTP(rec, served)

	if span != nil && span.IsRecording() {
		endServerSpan(span, served, rec)
	}
	ctx := served.Context()
	labels := h.metrics.labels.get(served, rec.status).opts
	h.metrics.duration.Record(ctx, float64(time.Since(start))/float64(time.Second), labels...)
	h.metrics.request.Record(ctx, rec.bodyRead(), labels...)
	h.metrics.response.Record(ctx, rec.written, labels...)
	rec.reset(nil)
	recorders.Put(rec)
}

// spanName is the route's pattern once the mux has matched it, the method
// before.
func spanName(r *http.Request) string {
	if r.Pattern != "" {
		return r.Pattern
	}
	return r.Method
}

// endServerSpan names the span by its route and records the answer.
func endServerSpan(span trace.Span, r *http.Request, rec *recorder) {
	if r.Pattern != "" {
		span.SetName(r.Pattern)
	}
	switch status := rec.status; {
	case status < 100 || status >= 600:
		span.SetStatus(codes.Error, "Invalid HTTP status code "+strconv.Itoa(status))
	case status >= 500:
		span.SetStatus(codes.Error, "")
	}
	span.SetAttributes(responseTraceAttrs(r, rec)...)
}

// recorder is the response writer the handler is given: it notes the
// status and the bytes written and, through body, the bytes read.
type recorder struct {
	w           http.ResponseWriter
	status      int
	wroteHeader bool
	written     int64
	body        *countingBody // nil: no request body
}

// bodyRead is how many bytes of the request body were read so far.
func (rec *recorder) bodyRead() int64 {
	if rec.body == nil {
		return 0
	}
	return rec.body.n.Load()
}

func (rec *recorder) reset(w http.ResponseWriter) {
	*rec = recorder{w: w, status: http.StatusOK}
}

func (rec *recorder) Header() http.Header { return rec.w.Header() }

func (rec *recorder) WriteHeader(status int) {
	if !rec.wroteHeader && status >= 200 { // 1xx answers are not the answer
		rec.status, rec.wroteHeader = status, true
	}
	rec.w.WriteHeader(status)
}

func (rec *recorder) Write(b []byte) (int, error) {
	rec.wroteHeader = true
	n, err := rec.w.Write(b)
	rec.written += int64(n)
	return n, err
}

func (rec *recorder) Flush() {
	rec.wroteHeader = true
	if f, ok := rec.w.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (rec *recorder) Unwrap() http.ResponseWriter { return rec.w }

// countingBody counts the bytes read from a request's body, which the
// handler's goroutine and a transport's may read.
type countingBody struct {
	io.ReadCloser
	n atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// standardMethod is the method as the semantic conventions record it:
// one of the methods of RFC 9110 and PATCH, uppercase, else _OTHER, so a
// client cannot make new series by inventing methods.
func standardMethod(method string) string {
	for _, m := range standardMethods {
		if method == m {
			return m
		}
	}
	for _, m := range standardMethods {
		if strings.EqualFold(method, m) {
			return m
		}
	}
	return "_OTHER"
}

var standardMethods = [...]string{
	http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodHead,
	http.MethodOptions, http.MethodPatch, http.MethodConnect, http.MethodTrace,
}

// httpRoute is the path part of a mux pattern ("POST /v1/x" -> "/v1/x").
func httpRoute(pattern string) string {
	if i := strings.IndexByte(pattern, '/'); i >= 0 {
		return pattern[i:]
	}
	return ""
}
