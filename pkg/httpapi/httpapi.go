// Package httpapi holds the JSON bodies of the limiter's HTTP API (see
// api/openapi.yaml), shared by the server and the Go client. It has no
// dependencies beyond the standard library, so importing the client does
// not pull in the server.
package httpapi

import "time"

// Paths of the API.
const (
	PathAcquire    = "/v1/slots/acquire"
	PathHeartbeat  = "/v1/slots/heartbeat"
	PathHeartbeats = "/v1/slots/heartbeats"
	PathRelease    = "/v1/slots/release"
	PathTiers      = "/v1/tiers"
)

// Limits of request bodies.
const (
	// MaxBodyBytes bounds every request body.
	MaxBodyBytes = 64 << 10
	// MaxBatch bounds the slots of one POST /v1/slots/heartbeats.
	MaxBatch = 1000
	// MaxLabelBytes bounds an acquire's label.
	MaxLabelBytes = 128
)

// AcquireRequest is the body of POST /v1/slots/acquire.
type AcquireRequest struct {
	UserID string `json:"user_id"`
	Plan   string `json:"plan"`
	// StreamID is optional; a random one is made when empty. Giving one
	// makes retries idempotent: a waiting acquire retried under its stream
	// id keeps its place in the queue.
	StreamID string `json:"stream_id,omitempty"`
	// Label is optional: what the caller says the stream is (a pod, a
	// model, a request id), kept with the slot for support to see. At
	// most MaxLabelBytes bytes, no whitespace, control or invisible characters.
	Label string `json:"label,omitempty"`
	// WaitMs, when > 0, asks to wait up to that many milliseconds for one
	// of the user's slots when all are held, first come first served,
	// instead of a 429 at once. It is capped by the plan's maxWait
	// (max_wait_ms of GET /v1/tiers); 0 or absent: no waiting.
	WaitMs int64 `json:"wait_ms,omitempty"`
	// Pools names the pool keys the stream joins, pool → key
	// ({"model": "gpt-4o", "org": "acme"}), at most MaxPools: each capped
	// key must have room too. Absent: none.
	Pools map[string]string `json:"pools,omitempty"`
}

// MaxPools bounds the pools one acquire may name.
const MaxPools = 4

// PoolGrant is one pool key a granted stream joined.
type PoolGrant struct {
	Pool  string `json:"pool"`
	Key   string `json:"key"`
	Used  int    `json:"used"`
	Limit int    `json:"limit"`
}

// AcquireResponse is the 200 answer of POST /v1/slots/acquire.
type AcquireResponse struct {
	Granted             bool      `json:"granted"`
	StreamID            string    `json:"stream_id"`
	Used                int       `json:"used"`
	Limit               int       `json:"limit"`
	ExpiresAt           time.Time `json:"expires_at"`
	TTLMs               int64     `json:"ttl_ms"`
	HeartbeatIntervalMs int64     `json:"heartbeat_interval_ms"`
	// Pruned counts the user's slots that had expired unreleased and were
	// reclaimed by this acquire.
	Pruned   int  `json:"pruned"`
	Degraded bool `json:"degraded"`
	// WaitedMs is how long the acquire waited in the queue before it was
	// granted; absent when it was granted at once.
	WaitedMs int64 `json:"waited_ms,omitempty"`
	// Pools are the capped pool keys the stream joined, in the order of
	// the pools' names; absent when it joined none.
	Pools []PoolGrant `json:"pools,omitempty"`
	// WouldRefuse is the code of the 429 a scope in shadow mode (a plan's
	// or pool's enforce: false) would have answered, and did not:
	// stream_limit_reached (Used counts the slot, above Limit) or
	// pool_limit_reached (WouldRefuseBy names the pool key). Absent when
	// no scope would have refused.
	WouldRefuse string `json:"would_refuse,omitempty"`
	// WouldRefuseBy is the pool key of a would_refuse pool_limit_reached,
	// with its live memberships and cap.
	WouldRefuseBy *PoolGrant `json:"would_refuse_by,omitempty"`
}

// HeartbeatRequest is the body of POST /v1/slots/heartbeat, and one slot of
// a batch.
type HeartbeatRequest struct {
	UserID   string `json:"user_id"`
	Plan     string `json:"plan"`
	StreamID string `json:"stream_id"`
}

// HeartbeatResponse is the 200 answer of POST /v1/slots/heartbeat.
type HeartbeatResponse struct {
	Alive     bool      `json:"alive"`
	ExpiresAt time.Time `json:"expires_at"`
	Degraded  bool      `json:"degraded"`
}

// HeartbeatsRequest is the body of POST /v1/slots/heartbeats.
type HeartbeatsRequest struct {
	Slots []HeartbeatRequest `json:"slots"`
}

// HeartbeatsResponse is the 200 answer of POST /v1/slots/heartbeats: one
// result per requested slot, in order.
type HeartbeatsResponse struct {
	Results []HeartbeatResult `json:"results"`
}

// HeartbeatResult is one slot's answer in a batch. Alive false with no
// Error means the slot is lost (what a single heartbeat answers with 410).
// Error is set when that slot could not be judged (invalid ids, unknown
// plan, Redis unavailable for a Closed tier).
type HeartbeatResult struct {
	StreamID  string     `json:"stream_id"`
	Alive     bool       `json:"alive"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	Degraded  bool       `json:"degraded"`
	Error     *Error     `json:"error,omitempty"`
}

// ReleaseRequest is the body of POST /v1/slots/release.
type ReleaseRequest struct {
	UserID   string `json:"user_id"`
	StreamID string `json:"stream_id"`
}

// ReleaseResponse is the 200 answer of POST /v1/slots/release.
type ReleaseResponse struct {
	Released bool `json:"released"`
	Degraded bool `json:"degraded"`
}

// TiersResponse is the 200 answer of GET /v1/tiers.
type TiersResponse struct {
	Tiers []Tier `json:"tiers"`
}

// Tier is one plan's limit as served by GET /v1/tiers.
type Tier struct {
	Plan                 string `json:"plan"`
	MaxConcurrentStreams int    `json:"max_concurrent_streams"`
	SlotTTLMs            int64  `json:"slot_ttl_ms"`
	HeartbeatIntervalMs  int64  `json:"heartbeat_interval_ms"`
	FailureMode          string `json:"failure_mode"`
	// MaxWaitMs caps the wait_ms of the plan's acquires; 0: they never
	// wait.
	MaxWaitMs int64 `json:"max_wait_ms"`
	// Enforce is false for a plan in shadow mode: its limit refuses
	// nothing, and says what it would refuse (would_refuse).
	Enforce bool `json:"enforce"`
}

// ErrorResponse is the body of every error answer.
type ErrorResponse struct {
	Error Error `json:"error"`
}

// Error describes what went wrong. Code is stable; Message is for humans.
// Used, Limit and RetryAfterMs are set on stream_limit_reached.
type Error struct {
	Code         string `json:"code"`
	Message      string `json:"message"`
	Used         *int   `json:"used,omitempty"`
	Limit        *int   `json:"limit,omitempty"`
	RetryAfterMs *int64 `json:"retry_after_ms,omitempty"`
	// StreamID is set on the limiter_unavailable of an acquire sent with
	// a stream id: that id. Redis may have taken the slot with only its
	// answer lost, so retry under this id, or release it. (The slot of an
	// id the server made is released by the server.)
	StreamID string `json:"stream_id,omitempty"`
	// WaitedMs is set on a stream_limit_reached that waited in the queue
	// (wait_ms) and timed out: how long it waited.
	WaitedMs *int64 `json:"waited_ms,omitempty"`
	// Pool and Key are set on a pool_limit_reached: the pool key whose cap
	// refused the stream (Used and Limit are that key's).
	Pool string `json:"pool,omitempty"`
	Key  string `json:"key,omitempty"`
}

// Error codes.
const (
	CodeInvalidRequest       = "invalid_request"        // 400: malformed body, unknown field, wrong type, too large
	CodeUnsupportedMediaType = "unsupported_media_type" // 415: a POST body not sent as application/json
	CodeInvalidUserID        = "invalid_user_id"        // 400
	CodeInvalidStreamID      = "invalid_stream_id"      // 400
	CodeInvalidLabel         = "invalid_label"          // 400
	CodeUnknownPlan          = "unknown_plan"           // 422
	CodeStreamLimitReached   = "stream_limit_reached"   // 429, with Retry-After
	CodePoolLimitReached     = "pool_limit_reached"     // 429, with Retry-After: a pool key's cap, not the user's
	CodeUnknownPool          = "unknown_pool"           // 422
	CodeInvalidPoolKey       = "invalid_pool_key"       // 400
	CodeSlotLost             = "slot_lost"              // 410
	CodeUnavailable          = "limiter_unavailable"    // 503
	CodeOutcomeUnknown       = "outcome_unknown"        // 503 (admin release, override removal): sent to Redis, no answer came back
	CodeNotFound             = "not_found"              // 404
	CodeMethodNotAllowed     = "method_not_allowed"     // 405
	CodeUnauthenticated      = "unauthenticated"        // 401: slot API, no or unknown caller token
	CodePlanNotAllowed       = "plan_not_allowed"       // 403: slot API, a plan outside the caller's
	CodeNotSlotHolder        = "not_slot_holder"        // 403: slot API, a stream another caller holds
	CodeUnauthorized         = "unauthorized"           // 401: admin API
	CodeForbidden            = "forbidden"              // 403: admin API
	CodeInternal             = "internal"               // 500
)
