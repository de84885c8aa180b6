package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/joishi/limiter/pkg/httpapi"
	"go.opentelemetry.io/otel/propagation"
)

const (
	userAgent = "joishi-limiter-go-client"
	// maxAnswerBytes bounds what is read of a slot API answer: a full
	// batch answer is about 100 KiB.
	maxAnswerBytes = 4 << 20
	// maxInFlight bounds the concurrent requests of one heartbeat tick or
	// of Close.
	maxInFlight = 4
)

// endpoint is one limiter listener and how to call it; Client and Admin
// each hold one.
type endpoint struct {
	base      string // no trailing slash
	http      *http.Client
	timeout   time.Duration // of each call
	token     string        // sent as a bearer token; none when empty
	maxAnswer int           // bytes of an answer read at the most
}

// parseBaseURL checks a base URL and returns it without a trailing slash.
func parseBaseURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("base URL %q: %w", raw, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("base URL must be http(s)://host[:port][/prefix], got %q", raw)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("base URL must have no query or fragment, got %q", raw)
	}
	return strings.TrimSuffix(u.String(), "/"), nil
}

// do sends in as JSON (no body when in is nil) to path, with the W3C trace
// context of ctx's span so that the caller's trace continues through the
// limiter into Redis, and decodes a 2xx answer into out. A non-2xx answer
// is an *Error. A transport failure or the request timeout matches
// ErrUnavailable; the end of ctx itself is returned as ctx's error.
func (e *endpoint) do(ctx context.Context, method, path string, in, out any) error {
	return e.doWithin(ctx, e.timeout, method, path, in, out)
}

// doWithin is do with the call bounded by timeout instead of the
// endpoint's: an acquire that may wait has its wait on top.
func (e *endpoint) doWithin(ctx context.Context, timeout time.Duration, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		// Not HTML-escaped: '<' in an id would take 6 bytes where it takes
		// 1, and a batch of 1000 valid ids grow past the server's bound.
		var data bytes.Buffer
		enc := json.NewEncoder(&data)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(in); err != nil {
			return fmt.Errorf("limiter: %s %s: encoding request: %w", method, path, err)
		}
		body = &data
	}
	callCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(callCtx, method, e.base+path, body)
	if err != nil {
		return fmt.Errorf("limiter: %s %s: %w", method, path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", userAgent)
	if e.token != "" {
		req.Header.Set("Authorization", "Bearer "+e.token)
	}
	// Not the global propagator: the application may never have set one.
	// A transport wrapper (otelhttp) may replace it with its client span's.
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(req.Header))

	resp, err := e.http.Do(req)
	if err != nil {
		return transportError(ctx, method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, int64(e.maxAnswer)+1))
	if err != nil {
		return transportError(ctx, method, path, err)
	}
	if len(data) > e.maxAnswer {
		return fmt.Errorf("limiter: %s %s: answer exceeds %d bytes", method, path, e.maxAnswer)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return answerError(resp, data)
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("limiter: %s %s: decoding answer (HTTP %d): %w", method, path, resp.StatusCode, err)
	}
	return nil
}

func transportError(ctx context.Context, method, path string, err error) error {
	if ctx.Err() != nil {
		// The caller gave up; that says nothing about the limiter.
		return fmt.Errorf("limiter: %s %s: %w", method, path, context.Cause(ctx))
	}
	return fmt.Errorf("limiter: %s %s: %w: %w", method, path, ErrUnavailable, err)
}

// answerError converts a non-2xx answer into an *Error; a 3xx (which the
// client's own HTTP client does not follow) names its Location.
func answerError(resp *http.Response, data []byte) *Error {
	var body httpapi.ErrorResponse
	var e *Error
	if resp.StatusCode >= 300 && resp.StatusCode <= 399 {
		// Never the limiter's: it redirects none of its routes.
		to := resp.Header.Get("Location")
		if to == "" {
			to = "nowhere (no Location)"
		}
		e = &Error{Status: resp.StatusCode, Code: codeOfStatus(resp.StatusCode), Message: "redirected to " + to + ": the client follows no redirect"}
	} else if err := json.Unmarshal(data, &body); err == nil && body.Error.Code != "" {
		e = fromWire(resp.StatusCode, body.Error)
	} else {
		msg := strings.TrimSpace(string(data))
		if len(msg) > 200 {
			msg = msg[:200] + "…"
		}
		if msg == "" {
			msg = http.StatusText(resp.StatusCode)
		}
		e = &Error{Status: resp.StatusCode, Code: codeOfStatus(resp.StatusCode), Message: msg}
	}
	if e.RetryAfter == 0 {
		e.RetryAfter = retryAfterHeader(resp.Header.Get("Retry-After"), time.Now())
	}
	return e
}

// definite reports whether err is the limiter's answer about the request
// itself, as opposed to a failure to get one (transport, timeout, 5xx),
// after which the same request may well succeed.
func definite(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	return !errors.Is(e, ErrUnavailable) && e.Status < 500
}
