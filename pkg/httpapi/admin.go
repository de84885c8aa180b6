package httpapi

import (
	"net/url"
	"strings"
	"time"
)

// Routes of the admin API and page, served on the admin listener
// (admin.addr) only when admin.tokensFile is set; the API listener answers
// them 404 like any unknown path.
const (
	// PathAdminUserSlots lists one user's live slots (role viewer or operator).
	PathAdminUserSlots = "/v1/admin/users/{user_id}/slots"
	// PathAdminUserRelease releases every slot of one user (role operator).
	PathAdminUserRelease = "/v1/admin/users/{user_id}/release"
	// PathAdminUserOverride sets (POST) or removes (DELETE) one user's
	// temporary override of the limit (role operator).
	PathAdminUserOverride = "/v1/admin/users/{user_id}/override"
	// PathAdminPoolKey shows one pool key: its holders, waiters, cap and
	// override (role viewer or operator).
	PathAdminPoolKey = "/v1/admin/pools/{pool}/keys/{key}"
	// PathAdminPoolKeyOverride sets (POST) or removes (DELETE) one pool
	// key's temporary override of its cap (role operator).
	PathAdminPoolKeyOverride = "/v1/admin/pools/{pool}/keys/{key}/override"
	// PathAdminAudit lists the most recent admin calls (role viewer or operator).
	PathAdminAudit = "/v1/admin/audit"
	// PathAdminPage is the admin page, served on the admin listener.
	PathAdminPage = "/admin/"
)

// Bounds of admin requests.
const (
	// MaxReasonLength bounds the reason of a release, in characters.
	MaxReasonLength = 500
	// DefaultAuditLimit is how many records GET /v1/admin/audit returns
	// when no limit is asked; MaxAuditLimit the most it returns.
	DefaultAuditLimit = 50
	MaxAuditLimit     = 1000
	// MaxOverrideStreams bounds a user's override's
	// max_concurrent_streams, as a tier's maxConcurrentStreams is bounded;
	// MaxPoolOverrideStreams a pool key's, as a pool's caps are.
	MaxOverrideStreams     = 1000
	MaxPoolOverrideStreams = 100000
	// MinOverrideExpiresIn and MaxOverrideExpiresIn bound an override's
	// expires_in, in seconds: a minute to 30 days.
	MinOverrideExpiresIn = 60
	MaxOverrideExpiresIn = 30 * 24 * 3600
)

// Headers of admin answers.
const (
	// HeaderAuditID carries the audit_id of the record every admin call
	// writes, refused calls included.
	HeaderAuditID = "X-Audit-Id"
	// HeaderAdminRole carries the caller's role (viewer or operator) on
	// every answer to a caller whose token is known.
	HeaderAdminRole = "X-Admin-Role"
)

// Admin roles, from the tokens file.
const (
	// RoleViewer may list slots and read the audit.
	RoleViewer = "viewer"
	// RoleOperator may also release a user's slots and set or remove an
	// override.
	RoleOperator = "operator"
)

// Admin actions, as recorded in the audit. A call on a pool key records
// the same actions as on a user (list_slots lists its holders), naming the
// pool key instead of the user.
const (
	ActionListSlots  = "list_slots"
	ActionReleaseAll = "release_all"
	ActionReadAudit  = "read_audit"

	ActionSetOverride    = "set_override"
	ActionRemoveOverride = "remove_override"
)

// OutcomeOK is the audit outcome of a call that succeeded; a refused or
// failed call records its error code instead.
const OutcomeOK = "ok"

// AdminUserSlotsPath is PathAdminUserSlots for userID (escaped).
func AdminUserSlotsPath(userID string) string {
	return "/v1/admin/users/" + segment(userID) + "/slots"
}

// AdminUserReleasePath is PathAdminUserRelease for userID (escaped).
func AdminUserReleasePath(userID string) string {
	return "/v1/admin/users/" + segment(userID) + "/release"
}

// AdminUserOverridePath is PathAdminUserOverride for userID (escaped).
func AdminUserOverridePath(userID string) string {
	return "/v1/admin/users/" + segment(userID) + "/override"
}

// AdminPoolKeyPath is PathAdminPoolKey for key of pool (escaped: a key
// such as meta-llama/Llama-3.1-70B-Instruct is one segment,
// meta-llama%2FLlama-3.1-70B-Instruct).
func AdminPoolKeyPath(pool, key string) string {
	return "/v1/admin/pools/" + segment(pool) + "/keys/" + segment(key)
}

// AdminPoolKeyOverridePath is PathAdminPoolKeyOverride for key of pool
// (escaped).
func AdminPoolKeyOverridePath(pool, key string) string {
	return AdminPoolKeyPath(pool, key) + "/override"
}

// segment escapes s, a user id, a pool's name or a pool key, as one path
// segment. A dot-only one is written %2E...: url.PathEscape leaves dots
// alone, and a "." or ".." segment would be resolved away as "this" or
// "parent" directory.
func segment(s string) string {
	if s != "" && strings.Trim(s, ".") == "" {
		return strings.Repeat("%2E", len(s))
	}
	return url.PathEscape(s)
}

// AdminSlotsResponse is the 200 answer of GET /v1/admin/users/{user_id}/slots.
type AdminSlotsResponse struct {
	UserID string `json:"user_id"`
	// Used counts the user's live slots; Slots are the first 1,000 of
	// them to expire.
	Used  int         `json:"used"`
	Slots []AdminSlot `json:"slots"`
	// Override is the user's override of the limit in force; absent when
	// none.
	Override *AdminOverride `json:"override,omitempty"`
	// Queue are the acquires waiting for one of the user's slots
	// (wait_ms), first served first: by priority, then arrival.
	Queue []AdminTicket `json:"queue"`
	// PlanLimits are the limits of the plans the user's slots were taken
	// under and its waiting acquires ask under, by plan name; a plan since
	// removed shows its last definition, an unknown one is left out. A
	// user has no one limit: each acquire is judged by its own plan's
	// (the override's while one is in force) against every slot the user
	// holds, whatever their plans.
	PlanLimits []AdminPlanLimit `json:"plan_limits"`
}

// AdminPlanLimit is one plan's limit: how many streams a user may hold
// when it acquires under the plan.
type AdminPlanLimit struct {
	Plan  string `json:"plan"`
	Limit int    `json:"limit"`
	// Enforce is false for a plan in shadow mode (enforce: false, DESIGN
	// §18): its limit refuses nothing, so the user may hold more than
	// Limit, each slot above it counted as a would-be refusal. Always
	// sent; nil from a server older than the field, which enforces.
	Enforce *bool `json:"enforce,omitempty"`
}

// AdminTicket is one acquire waiting in a queue: a user's, or a pool
// key's (a waiter), with what its acquire recorded.
type AdminTicket struct {
	// UserID is the waiting stream's user: on a pool key's waiters only
	// (a user's queue is the user's).
	UserID   string `json:"user_id,omitempty"`
	StreamID string `json:"stream_id"`
	// Place is 1 for the acquire served next.
	Place int `json:"place"`
	// Priority is its plan's priority (0-9, higher served first), which
	// orders the queue (DESIGN §17).
	Priority int `json:"priority"`
	// Plan is the plan it asks under, Caller the API caller that asked
	// (absent on an open API), Label what the caller said it is; each
	// absent when not recorded.
	Plan   string `json:"plan,omitempty"`
	Caller string `json:"caller,omitempty"`
	Label  string `json:"label,omitempty"`
	// WaitingSince is when it joined the queue (Redis time).
	WaitingSince time.Time `json:"waiting_since"`
	// WaitedMs is how long it had waited when Redis answered.
	WaitedMs int64 `json:"waited_ms"`
	// ExpiresAt is when its place lapses unless the server it waits on
	// refreshes it (every few seconds while it waits).
	ExpiresAt time.Time `json:"expires_at"`
}

// AdminSlot is one live slot, earliest expiry first, with what its
// acquire recorded.
type AdminSlot struct {
	// UserID is the holder's user: on a pool key's holders only (a user's
	// slots are the user's).
	UserID    string    `json:"user_id,omitempty"`
	StreamID  string    `json:"stream_id"`
	ExpiresAt time.Time `json:"expires_at"`
	// TTLMs is the time left before the slot expires, as Redis saw it.
	TTLMs int64 `json:"ttl_ms"`
	// StartedAt is when the slot was taken (Redis time), and AgeMs how
	// long ago, as Redis saw it; absent for a slot whose record holds no
	// start (taken by an older version).
	StartedAt *time.Time `json:"started_at,omitempty"`
	AgeMs     *int64     `json:"age_ms,omitempty"`
	// Caller names the API caller that took it (absent on an open API),
	// Plan the plan it was granted under, Label what the caller said it
	// is; each absent when not recorded.
	Caller string `json:"caller,omitempty"`
	Plan   string `json:"plan,omitempty"`
	Label  string `json:"label,omitempty"`
}

// AdminOverride is a user's temporary override of the limit: while in
// force, every acquire of the user is judged by MaxConcurrentStreams
// instead of the plan's limit. A pool key's is the same: every stream that
// joins the key is judged by it instead of the pool's cap.
type AdminOverride struct {
	MaxConcurrentStreams int       `json:"max_concurrent_streams"`
	SetAt                time.Time `json:"set_at"`
	ExpiresAt            time.Time `json:"expires_at"`
	// TTLMs is the time left before it expires, as Redis saw it.
	TTLMs int64 `json:"ttl_ms"`
	// Actor is the name of the admin token that set it.
	Actor  string `json:"actor"`
	Reason string `json:"reason"`
}

// AdminOverrideRequest is the body of POST /v1/admin/users/{user_id}/override.
// Every field is required (the numbers are pointers so that a missing one
// is told from 0).
type AdminOverrideRequest struct {
	// MaxConcurrentStreams is the user's limit while in force: 0 to
	// MaxOverrideStreams (0: the user may not stream).
	MaxConcurrentStreams *int `json:"max_concurrent_streams"`
	// ExpiresIn is how long it stays in force, in seconds:
	// MinOverrideExpiresIn to MaxOverrideExpiresIn.
	ExpiresIn *int64 `json:"expires_in"`
	// Reason: 1 to MaxReasonLength characters, recorded with the override
	// and in the audit.
	Reason string `json:"reason"`
}

// AdminOverrideResponse is the 200 answer of POST /v1/admin/users/{user_id}/override.
type AdminOverrideResponse struct {
	UserID   string        `json:"user_id"`
	Override AdminOverride `json:"override"`
	AuditID  string        `json:"audit_id"`
}

// AdminPoolKeyResponse is the 200 answer of GET
// /v1/admin/pools/{pool}/keys/{key}.
type AdminPoolKeyResponse struct {
	Pool string `json:"pool"`
	Key  string `json:"key"`
	// Used is the key's live memberships: its holders, listed or not.
	Used int `json:"used"`
	// Limit is the pool's cap of the key: its own, else the pool's
	// default; absent when the pool caps neither (no stream joins the
	// key). An override in force replaces it.
	Limit *int `json:"limit,omitempty"`
	// Enforce is false for a pool in shadow mode (enforce: false, DESIGN
	// §18): its caps refuse nothing, so Used may be above Limit. Always
	// sent; nil from a server older than the field, which enforces.
	Enforce *bool `json:"enforce,omitempty"`
	// Override is the key's override of the cap in force; absent when
	// none.
	Override *AdminOverride `json:"override,omitempty"`
	// Holders are the key's live memberships, earliest expiry first, each
	// naming its user: the first 1,000 (Used counts them all).
	Holders []AdminSlot `json:"holders"`
	// Waiters are the acquires waiting for the key (wait_ms) in the order
	// they are served: by priority, then the user holding fewest of the
	// key's memberships, then the user waiting for fewest, then arrival;
	// each naming its user.
	Waiters []AdminTicket `json:"waiters"`
	// Deleted: the pool is no longer configured. Its holders run on by
	// its last definition until they end (Limit and Enforce are that
	// definition's, from a replica that saw it; absent Limit from one
	// started since); no stream joins its keys, and an override can be
	// removed but not set.
	Deleted bool `json:"deleted,omitempty"`
}

// AdminPoolOverrideResponse is the 200 answer of POST
// /v1/admin/pools/{pool}/keys/{key}/override. Its body is an
// AdminOverrideRequest, as for a user; DELETE's are
// AdminOverrideRemoveRequest and AdminOverrideRemoveResponse.
type AdminPoolOverrideResponse struct {
	Pool     string        `json:"pool"`
	Key      string        `json:"key"`
	Override AdminOverride `json:"override"`
	AuditID  string        `json:"audit_id"`
}

// AdminOverrideRemoveRequest is the body of DELETE /v1/admin/users/{user_id}/override.
type AdminOverrideRemoveRequest struct {
	// Reason is required, as for a release.
	Reason string `json:"reason"`
}

// AdminOverrideRemoveResponse is the 200 answer of DELETE /v1/admin/users/{user_id}/override.
type AdminOverrideRemoveResponse struct {
	// Removed: an override was in force and is gone; false when there was
	// none (never set, removed, or expired).
	Removed bool   `json:"removed"`
	AuditID string `json:"audit_id"`
}

// AdminReleaseRequest is the body of POST /v1/admin/users/{user_id}/release.
type AdminReleaseRequest struct {
	// Reason is required: 1 to MaxReasonLength characters once whitespace
	// runs are collapsed. It is recorded in the audit.
	Reason string `json:"reason"`
}

// AdminReleaseResponse is the 200 answer of POST /v1/admin/users/{user_id}/release.
type AdminReleaseResponse struct {
	// Released are the stream ids of the live slots freed (those that had
	// expired unreleased are removed too, not listed). Their holders' next
	// heartbeat answers 410 slot_lost.
	Released []string `json:"released"`
	AuditID  string   `json:"audit_id"`
}

// AuditResponse is the 200 answer of GET /v1/admin/audit: newest first.
type AuditResponse struct {
	Records []AuditRecord `json:"records"`
}

// AuditRecord is what one admin call leaves in the audit. Strings that come
// from the caller have their control characters replaced by U+FFFD.
type AuditRecord struct {
	AuditID string    `json:"audit_id"`
	Time    time.Time `json:"time"`
	// Actor is the token's name; empty when the token was missing or unknown.
	Actor string `json:"actor"`
	// Role is the token's role; empty when the token was missing or unknown.
	Role   string `json:"role"`
	Action string `json:"action"`
	// UserID names the user of a call on a user; Pool and Key the pool key
	// of a call on a pool key.
	UserID string `json:"user_id,omitempty"`
	Pool   string `json:"pool,omitempty"`
	Key    string `json:"key,omitempty"`
	// Released are the stream ids a release freed.
	Released []string `json:"released,omitempty"`
	// Override is the override a set_override call put in force.
	Override *AuditOverride `json:"override,omitempty"`
	// Asked is what a set_override call's body asked for, refused or
	// not: a refused call's record says what it tried to put in force.
	Asked *AuditOverrideAsked `json:"asked,omitempty"`
	// OverrideRemoved says whether a remove_override call found one in
	// force.
	OverrideRemoved *bool  `json:"override_removed,omitempty"`
	Reason          string `json:"reason,omitempty"`
	Remote          string `json:"remote"`
	// ForwardedFor is the X-Forwarded-For header as received: unverified.
	ForwardedFor string `json:"forwarded_for,omitempty"`
	// Outcome is OutcomeOK or the error code answered.
	Outcome string `json:"outcome"`
	Status  int    `json:"status"`
	// Detail says why a call was refused or failed.
	Detail string `json:"detail,omitempty"`
}

// AuditOverride is what the audit keeps of an override set.
type AuditOverride struct {
	MaxConcurrentStreams int       `json:"max_concurrent_streams"`
	ExpiresAt            time.Time `json:"expires_at"`
}

// AuditOverrideAsked is what the audit keeps of the override a
// set_override body asked for: each field as sent, when it was read as a
// whole number (a value that was not is left out, and the record's detail
// names it), so nothing the caller sends is kept unbounded.
type AuditOverrideAsked struct {
	MaxConcurrentStreams *int   `json:"max_concurrent_streams,omitempty"`
	ExpiresIn            *int64 `json:"expires_in,omitempty"`
}
