package client

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/joishi/limiter/pkg/httpapi"
)

// Outcomes callers act on. An *Error matches them with errors.Is by its
// code; transport failures match ErrUnavailable.
var (
	// ErrLimitReached: Acquire was refused because the user already holds
	// as many streams as the plan allows (429 stream_limit_reached). It is
	// a result to show the user, never an outage.
	ErrLimitReached = errors.New("stream limit reached")
	// ErrPoolLimitReached: Acquire was refused because a pool key it named
	// (WithPools) holds its cap of streams, whoever's they are (429
	// pool_limit_reached): Error.Pool and Error.Key name it, Used, Limit
	// and RetryAfter are the key's. Not ErrLimitReached: the user's own
	// limit did not refuse it.
	ErrPoolLimitReached = errors.New("pool limit reached")
	// ErrUnknownPool: an Acquire, or an Admin call on a pool key, named a
	// pool the limiter does not hold (422 unknown_pool).
	ErrUnknownPool = errors.New("unknown pool")
	// ErrSlotLost: the slot expired or was released by someone else
	// (410 slot_lost). Lease.Err returns it once Lost fires for that reason.
	ErrSlotLost = errors.New("slot lost")
	// ErrUnavailable: the limiter could not decide. Returned for 503
	// limiter_unavailable (a tier that fails closed while Redis is down),
	// for 502/503/504 answers of anything in between, and when the service
	// cannot be reached or does not answer within the request timeout.
	ErrUnavailable = errors.New("limiter unavailable")
	// ErrUnknownPlan: the plan is not in the limiter's tier table (422).
	ErrUnknownPlan = errors.New("unknown plan")
	// ErrUnauthenticated: the service authenticates callers
	// (api.tokensFile) and the client sent no token it knows (401
	// unauthenticated; WithToken, LIMITER_TOKEN).
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrPlanNotAllowed: the caller may not use the plan asked for (403
	// plan_not_allowed): the service's api.tokensFile lists the caller's
	// plans. A lease whose heartbeat is refused so is lost with it.
	ErrPlanNotAllowed = errors.New("plan not allowed")
	// ErrNotSlotHolder: the service authenticates callers (api.tokensFile)
	// and the stream id is held by another caller (403 not_slot_holder):
	// a slot belongs to the caller that took it. Acquire returns it for a
	// stream id (WithStreamID) another caller holds, or that waits in the
	// queue under another caller, Lease.Release for a
	// slot another caller took over; the limiter changed nothing. A lease
	// whose heartbeat (or re-acquire, when degraded) is refused so is lost
	// with it. Support releases any slot through the admin API
	// (Admin.ReleaseAll).
	ErrNotSlotHolder = errors.New("not slot holder")
	// ErrInvalid: the request was refused as malformed (400
	// invalid_request, invalid_user_id, invalid_stream_id, invalid_label).
	ErrInvalid = errors.New("invalid request")
	// ErrClosed: the Client was closed. Acquire returns it after Close, and
	// Lease.Err returns it for leases the Client still held at Close.
	ErrClosed = errors.New("limiter client closed")
)

// IsLimited reports whether err says the user's stream limit is reached.
func IsLimited(err error) bool { return errors.Is(err, ErrLimitReached) }

// Error is a non-2xx answer of the limiter (or a per-slot error of a batch
// heartbeat). Match it with errors.Is against the sentinels above, or read
// Code (one of the httpapi.Code* constants).
type Error struct {
	// Status is the HTTP status; for a per-slot batch error, the status the
	// single-slot call would have answered.
	Status int
	// Code is the stable error code from the body. When the body is not
	// the limiter's JSON (a proxy's page), it is limiter_unavailable for
	// 502/503/504 and "http_<status>" otherwise; a 3xx is always
	// "http_<status>", its Message naming the Location not followed.
	Code string
	// Message is for humans.
	Message string
	// Used and Limit are the user's streams and the plan's cap; set on
	// stream_limit_reached. On pool_limit_reached, the pool key's.
	Used, Limit int
	// Pool and Key name the pool key that refused an acquire; set on
	// pool_limit_reached.
	Pool, Key string
	// RetryAfter is when a slot may free up at the earliest: retry_after_ms
	// of the body, else the Retry-After header. Zero when neither is given.
	RetryAfter time.Duration
	// Waited is how long an acquire that asked to wait (WithWait) waited
	// in the queue before its wait ran out; set on stream_limit_reached.
	Waited time.Duration
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "limiter: %s", e.Code)
	if e.Status != 0 {
		fmt.Fprintf(&b, " (HTTP %d)", e.Status)
	}
	if e.Message != "" {
		fmt.Fprintf(&b, ": %s", e.Message)
	}
	if e.Code == httpapi.CodePoolLimitReached {
		fmt.Fprintf(&b, " (pool %s=%s, used %d of %d, retry after %s)", e.Pool, e.Key, e.Used, e.Limit, e.RetryAfter)
	}
	if e.Code == httpapi.CodeStreamLimitReached {
		fmt.Fprintf(&b, " (used %d of %d, retry after %s", e.Used, e.Limit, e.RetryAfter)
		if e.Waited > 0 {
			fmt.Fprintf(&b, ", waited %s", e.Waited)
		}
		b.WriteString(")")
	}
	return b.String()
}

// Is matches e against the package's sentinel errors by code.
func (e *Error) Is(target error) bool {
	if target == ErrInvalid {
		return invalidCode(e.Code)
	}
	for _, s := range sentinelCodes {
		if target == s.err {
			return e.Code == s.code
		}
	}
	return false
}

// sentinelCodes pair each sentinel but ErrInvalid (which several codes
// match: invalidCode) with the code an *Error matches it by.
var sentinelCodes = []struct {
	err  error
	code string
}{
	{ErrLimitReached, httpapi.CodeStreamLimitReached},
	{ErrPoolLimitReached, httpapi.CodePoolLimitReached},
	{ErrUnknownPool, httpapi.CodeUnknownPool},
	{ErrSlotLost, httpapi.CodeSlotLost},
	{ErrUnavailable, httpapi.CodeUnavailable},
	{ErrUnknownPlan, httpapi.CodeUnknownPlan},
	{ErrUnauthenticated, httpapi.CodeUnauthenticated},
	{ErrPlanNotAllowed, httpapi.CodePlanNotAllowed},
	{ErrNotSlotHolder, httpapi.CodeNotSlotHolder},
}

func invalidCode(code string) bool {
	switch code {
	case httpapi.CodeInvalidRequest, httpapi.CodeInvalidUserID, httpapi.CodeInvalidStreamID, httpapi.CodeInvalidLabel, httpapi.CodeInvalidPoolKey:
		return true
	}
	return false
}

// fromWire converts a wire error; status is the HTTP status it came with.
func fromWire(status int, we httpapi.Error) *Error {
	e := &Error{Status: status, Code: we.Code, Message: we.Message, Pool: we.Pool, Key: we.Key}
	if we.Used != nil {
		e.Used = *we.Used
	}
	if we.Limit != nil {
		e.Limit = *we.Limit
	}
	if we.RetryAfterMs != nil {
		e.RetryAfter = time.Duration(*we.RetryAfterMs) * time.Millisecond
	}
	if we.WaitedMs != nil {
		e.Waited = time.Duration(*we.WaitedMs) * time.Millisecond
	}
	return e
}

// statusOf is the status a single-slot call answers for code, so a batch's
// per-slot error reads like the single call's.
func statusOf(code string) int {
	switch code {
	case httpapi.CodeSlotLost:
		return http.StatusGone
	case httpapi.CodeUnknownPlan:
		return http.StatusUnprocessableEntity
	case httpapi.CodePlanNotAllowed, httpapi.CodeNotSlotHolder:
		return http.StatusForbidden
	case httpapi.CodeUnavailable:
		return http.StatusServiceUnavailable
	case httpapi.CodeInternal:
		return http.StatusInternalServerError
	}
	if invalidCode(code) {
		return http.StatusBadRequest
	}
	return 0
}

// codeOfStatus names a status whose body is not the limiter's JSON.
func codeOfStatus(status int) string {
	switch status {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return httpapi.CodeUnavailable
	}
	return "http_" + strconv.Itoa(status)
}

// maxRetryAfterHeader bounds what a Retry-After header can say: a day,
// far past any wait an acquire retries after.
const maxRetryAfterHeader = 24 * time.Hour

// retryAfterHeader parses Retry-After: delay seconds (digits only; more
// than a day reads as a day) or an HTTP date.
func retryAfterHeader(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if digits := strings.TrimSpace(v); digits != "" && strings.Trim(digits, "0123456789") == "" {
		secs, err := strconv.ParseUint(digits, 10, 64)
		if err != nil || secs > uint64(maxRetryAfterHeader/time.Second) {
			return maxRetryAfterHeader
		}
		return time.Duration(secs) * time.Second
	}
	if at, err := http.ParseTime(v); err == nil && at.After(now) {
		return at.Sub(now)
	}
	return 0
}
