package hold

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/joishi/limiter/pkg/limiter"
)

// Error types, as OpenAI's API names them: the SDKs raise their errors
// from the status, and show type, code and message.
const (
	TypeRateLimit      = "rate_limit_error"
	TypeInvalidRequest = "invalid_request_error"
	TypeServer         = "server_error"
)

// Codes of the refusals that the front ends holding streams (the proxy,
// the ext_proc server) answer themselves.
const (
	CodeLimitReached        = "stream_limit_reached"
	CodePoolLimitReached    = "pool_limit_reached"
	CodeUnknownPool         = "unknown_pool"
	CodeInvalidPoolKey      = "invalid_pool_key"
	CodeInvalidBody         = "invalid_body"
	CodeBodyTooLarge        = "request_too_large"
	CodeUnauthenticated     = "unauthenticated"
	CodePlanNotAllowed      = "plan_not_allowed"
	CodeUnknownPlan         = "unknown_plan"
	CodeInvalidUserID       = "invalid_user_id"
	CodeInvalidLabel        = "invalid_label"
	CodeHeadersTooLarge     = "headers_too_large"
	CodeInvalidTarget       = "invalid_target"
	CodeUnavailable         = "limiter_unavailable"
	CodeSlotLost            = "slot_lost"
	CodeUpstreamUnavailable = "upstream_unavailable"
	CodeUpstreamTimeout     = "upstream_timeout"
	CodeInternal            = "internal_error"
)

// ErrorBody is the error of a Refusal, in the shape of OpenAI's errors
// ({"error": {"message", "type", "param", "code"}}), plus the limiter's
// own figures on stream_limit_reached.
type ErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
	// On stream_limit_reached: when the user's earliest slot expires, and
	// the slots used of the limit. On pool_limit_reached: the same of the
	// pool key that refused.
	RetryAfterMs *int64 `json:"retry_after_ms,omitempty"`
	Used         *int   `json:"used,omitempty"`
	Limit        *int   `json:"limit,omitempty"`
	// Pool and Key name the pool key of a pool_limit_reached.
	Pool string `json:"pool,omitempty"`
	Key  string `json:"key,omitempty"`
	// WaitedMs is how long the request waited in line before it was
	// refused; absent when it did not wait.
	WaitedMs *int64 `json:"waited_ms,omitempty"`
}

// Refusal is an answer that ends a request before it reaches the
// upstream: a status, headers and a JSON error body (DESIGN §12).
type Refusal struct {
	Status int
	// Headers are set beside content-type: application/json and
	// cache-control: no-store; names are lower case.
	Headers [][2]string
	Error   ErrorBody
}

// Refused is a refusal of status; a 503 says Retry-After: 1.
func Refused(status int, typ, code, message string) Refusal {
	r := Refusal{Status: status, Error: ErrorBody{Type: typ, Code: code, Message: message}}
	if status == http.StatusServiceUnavailable {
		r.Headers = [][2]string{{"retry-after", "1"}}
	}
	return r
}

// Limited is the refusal of a user who holds the plan's limit: 429,
// Retry-After (seconds, rounded up), and x-should-retry: false. The
// official OpenAI SDKs retry a 429 by themselves (twice by default),
// sleeping for as long as Retry-After says: here that is when the user's
// earliest slot expires, about a slot TTL (2 minutes by default) away
// while that stream is alive, so the retries would hold the caller's
// request for minutes and then fail the same. The header makes them
// raise RateLimitError at once; the application decides what to tell the
// user.
func Limited(res limiter.AcquireResult) Refusal {
	if res.RefusedBy != nil {
		return poolLimited(res)
	}
	ms := res.RetryAfter.Milliseconds()
	used, limit := res.Used, res.Limit
	msg := "this account already has " + strconv.Itoa(used) + " of its " + strconv.Itoa(limit) + " concurrent streams open; wait for one to finish"
	if res.Waited > 0 {
		msg = "this account already has " + strconv.Itoa(used) + " of its " + strconv.Itoa(limit) + " concurrent streams open, and none finished in the " +
			res.Waited.Round(time.Millisecond).String() + " this request waited in line"
	}
	return limitedRefusal(res.RetryAfter, ErrorBody{
		Type: TypeRateLimit, Code: CodeLimitReached,
		Message:      msg,
		RetryAfterMs: &ms, Used: &used, Limit: &limit,
	}, res.Waited)
}

// poolLimited is the refusal of a stream a pool key's cap refused:
// pool_limit_reached, naming the pool and key, never the user's
// stream_limit_reached (the user may hold none of their own).
func poolLimited(res limiter.AcquireResult) Refusal {
	p := res.RefusedBy
	ms := p.RetryAfter.Milliseconds()
	used, limit := p.Used, p.Limit
	whose := "the pool's cap"
	if p.Overridden {
		whose = "a support override of the key's cap"
	}
	msg := fmt.Sprintf("pool %s=%s holds %d of its %d concurrent streams (%s, shared by every user); wait for one to finish", p.Pool, p.Key, used, limit, whose)
	if p.Waited > 0 { // in the key's queue, not only the user's
		msg = fmt.Sprintf("pool %s=%s holds %d of its %d concurrent streams (%s, shared by every user), and none finished in the %s this request waited in line",
			p.Pool, p.Key, used, limit, whose, res.Waited.Round(time.Millisecond))
	}
	return limitedRefusal(p.RetryAfter, ErrorBody{
		Type: TypeRateLimit, Code: CodePoolLimitReached,
		Message:      msg,
		RetryAfterMs: &ms, Used: &used, Limit: &limit,
		Pool: p.Pool, Key: p.Key,
	}, res.Waited)
}

// limitedRefusal is a 429 of body: Retry-After (seconds, rounded up) and
// x-should-retry: false (see Limited).
func limitedRefusal(retryAfter time.Duration, body ErrorBody, waited time.Duration) Refusal {
	if waited > 0 {
		ms := waited.Milliseconds()
		body.WaitedMs = &ms
	}
	return Refusal{
		Status: http.StatusTooManyRequests,
		Headers: [][2]string{
			{"retry-after", strconv.FormatInt(max(1, int64(math.Ceil(retryAfter.Seconds()))), 10)},
			{"x-should-retry", "false"},
		},
		Error: body,
	}
}

// AcquireRefusal is the refusal of an acquire that failed with err: the
// plan is unknown, the user id or label cannot be used, or the store is down
// (or its replicas did not confirm the slot) on a Closed plan, or the holder
// is closing. known is false for any other
// error, answered as internal_error: the caller logs it (unless its
// request is gone, and nobody reads the answer).
func AcquireRefusal(err error) (r Refusal, known bool) {
	var poolErr *limiter.PoolUnavailableError
	switch {
	case errors.Is(err, limiter.ErrUnknownPlan):
		return Refused(http.StatusUnprocessableEntity, TypeInvalidRequest, CodeUnknownPlan,
			"the plan of this request is not one the limiter knows"), true
	case errors.Is(err, limiter.ErrInvalidUserID):
		return Refused(http.StatusBadRequest, TypeInvalidRequest, CodeInvalidUserID, err.Error()), true
	case errors.Is(err, limiter.ErrInvalidLabel):
		return Refused(http.StatusBadRequest, TypeInvalidRequest, CodeInvalidLabel, err.Error()), true
	case errors.Is(err, limiter.ErrUnknownPool):
		return Refused(http.StatusUnprocessableEntity, TypeInvalidRequest, CodeUnknownPool, err.Error()), true
	case errors.Is(err, limiter.ErrInvalidPoolKey):
		return Refused(http.StatusBadRequest, TypeInvalidRequest, CodeInvalidPoolKey, err.Error()), true
	case errors.Is(err, ErrClosed):
		return Refused(http.StatusServiceUnavailable, TypeServer, CodeUnavailable,
			"this stream limiter is shutting down; retry shortly"), true
	case errors.Is(err, limiter.ErrUnconfirmed):
		return Refused(http.StatusServiceUnavailable, TypeServer, CodeUnavailable,
			"the stream limiter's store granted the slot, but fewer of its replicas than it requires (redis.syncReplicas) confirmed it, and this plan fails closed; retry shortly"), true
	case errors.As(err, &poolErr) && errors.Is(err, limiter.ErrUnavailable):
		return Refused(http.StatusServiceUnavailable, TypeServer, CodeUnavailable,
			fmt.Sprintf("the stream limiter cannot reach its store and pool %q fails closed; retry shortly", poolErr.Pool)), true
	case errors.Is(err, limiter.ErrUnavailable):
		return Refused(http.StatusServiceUnavailable, TypeServer, CodeUnavailable,
			"the stream limiter cannot reach its store and this plan fails closed; retry shortly"), true
	case errors.Is(err, limiter.ErrSlotLost):
		// Its slot was released (by support) while it waited for a pool
		// key: it joins nothing, as ext_proc cuts a stream so released.
		return Refused(http.StatusServiceUnavailable, TypeServer, CodeSlotLost,
			"this request's slot was released while it waited for a pool key (support released the user's streams); retry"), true
	}
	return Refused(http.StatusInternalServerError, TypeServer, CodeInternal, "the stream limiter failed; its log says why"), false
}

// Body is r's JSON body, newline-terminated.
func (r Refusal) Body() []byte {
	body, _ := json.Marshal(struct {
		Error ErrorBody `json:"error"`
	}{r.Error})
	return append(body, '\n')
}

// Write answers r on w.
func (r Refusal) Write(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	for _, kv := range r.Headers {
		h.Set(kv[0], kv[1])
	}
	w.WriteHeader(r.Status)
	_, _ = w.Write(r.Body())
}
