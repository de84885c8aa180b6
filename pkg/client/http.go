package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/joishi/limiter/pkg/httpapi"
	"go.opentelemetry.io/otel/propagation"
)

const (
	userAgent = "joishi-limiter-go-client"
	// maxAnswerBytes bounds what is read of an answer: a full batch answer
	// is about 100 KiB.
	maxAnswerBytes = 4 << 20
	// maxInFlight bounds the concurrent requests of one heartbeat tick or
	// of Close.
	maxInFlight = 4
)

// post sends in as JSON to path, with the W3C trace context of ctx's span
// so that the caller's trace continues through the limiter into Redis, and
// decodes a 2xx answer into out. A non-2xx answer is an *Error. A transport
// failure or the request timeout matches ErrUnavailable; the end of ctx
// itself is returned as ctx's error.
func (c *Client) post(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("limiter: POST %s: encoding request: %w", path, err)
	}
	callCtx, cancel := context.WithTimeout(ctx, c.reqTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(callCtx, http.MethodPost, c.base+path, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("limiter: POST %s: %w", path, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", userAgent)
	// Not the global propagator: the application may never have set one.
	// A transport wrapper (otelhttp) may replace it with its client span's.
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(req.Header))

	resp, err := c.http.Do(req)
	if err != nil {
		return c.transportError(ctx, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1))
	if err != nil {
		return c.transportError(ctx, path, err)
	}
	if len(data) > maxAnswerBytes {
		return fmt.Errorf("limiter: POST %s: answer exceeds %d bytes", path, maxAnswerBytes)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return answerError(resp, data)
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("limiter: POST %s: decoding answer (HTTP %d): %w", path, resp.StatusCode, err)
	}
	return nil
}

func (c *Client) transportError(ctx context.Context, path string, err error) error {
	if ctx.Err() != nil {
		// The caller gave up; that says nothing about the limiter.
		return fmt.Errorf("limiter: POST %s: %w", path, context.Cause(ctx))
	}
	return fmt.Errorf("limiter: POST %s: %w: %w", path, ErrUnavailable, err)
}

// answerError converts a non-2xx answer into an *Error.
func answerError(resp *http.Response, data []byte) *Error {
	var body httpapi.ErrorResponse
	var e *Error
	if err := json.Unmarshal(data, &body); err == nil && body.Error.Code != "" {
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
