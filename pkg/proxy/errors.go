package proxy

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"

	"github.com/joishi/limiter/pkg/limiter"
)

// Error types, as OpenAI's API names them: SDKs raise their errors from
// the status, and show type, code and message.
const (
	typeRateLimit      = "rate_limit_error"
	typeInvalidRequest = "invalid_request_error"
	typeServer         = "server_error"
)

// Error codes of the proxy's own answers.
const (
	codeLimitReached        = "stream_limit_reached"
	codeUnauthenticated     = "unauthenticated"
	codeUnknownPlan         = "unknown_plan"
	codeInvalidUserID       = "invalid_user_id"
	codeInvalidLabel        = "invalid_label"
	codeHeadersTooLarge     = "headers_too_large"
	codeUnavailable         = "limiter_unavailable"
	codeUpstreamUnavailable = "upstream_unavailable"
	codeUpstreamTimeout     = "upstream_timeout"
	codeInternal            = "internal_error"
)

// apiError is the body of every answer the proxy gives itself, in the
// shape of OpenAI's: {"error": {"message", "type", "param", "code"}},
// plus the limiter's own figures on a 429.
type apiError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
	// On stream_limit_reached: when the user's earliest slot expires,
	// and the slots used of the limit.
	RetryAfterMs *int64 `json:"retry_after_ms,omitempty"`
	Used         *int   `json:"used,omitempty"`
	Limit        *int   `json:"limit,omitempty"`
}

func writeError(w http.ResponseWriter, status int, e apiError) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Error apiError `json:"error"`
	}{e})
}

// writeLimited answers a request refused because its user holds the
// plan's limit: 429, Retry-After (seconds, rounded up), and
// x-should-retry: false. The official OpenAI SDKs retry a 429 by
// themselves (twice by default), sleeping for as long as Retry-After
// says: here that is when the user's earliest slot expires, about a slot
// TTL (2 minutes by default) away while that stream is alive, so the
// retries would hold the caller's request for minutes and then fail the
// same. The header makes them raise RateLimitError at once; the
// application decides what to tell the user.
func writeLimited(w http.ResponseWriter, res limiter.AcquireResult) {
	ms := res.RetryAfter.Milliseconds()
	w.Header().Set("Retry-After", strconv.FormatInt(max(1, int64(math.Ceil(res.RetryAfter.Seconds()))), 10))
	w.Header().Set("X-Should-Retry", "false")
	used, limit := res.Used, res.Limit
	writeError(w, http.StatusTooManyRequests, apiError{
		Type: typeRateLimit, Code: codeLimitReached,
		Message:      "this account already has " + strconv.Itoa(res.Used) + " of its " + strconv.Itoa(res.Limit) + " concurrent streams open; wait for one to finish",
		RetryAfterMs: &ms, Used: &used, Limit: &limit,
	})
}
