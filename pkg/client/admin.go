package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/joishi/limiter/pkg/httpapi"
)

// maxAdminAnswerBytes bounds what is read of an admin answer: a user may
// hold 100,000 slots (the most a tier allows), over 10 MiB of JSON with
// generated stream ids.
const maxAdminAnswerBytes = 16 << 20

// Admin calls the limiter's admin API (/v1/admin/...) with one token. The
// API is served on the admin listener (admin.addr) when the service has
// admin.tokensFile set; elsewhere every call fails with a 404 *Error. Every call, refused ones included,
// is audited by the service under the token's name. An Admin is safe for
// concurrent use and holds no goroutine.
//
// A refused call is an *Error like those of Client: Code
// httpapi.CodeUnauthorized (401, unknown or missing token),
// httpapi.CodeForbidden (403, a viewer's token on an operator's call) or
// httpapi.CodeInvalidRequest (400, matching ErrInvalid). A service that
// cannot be reached matches ErrUnavailable.
type Admin struct {
	api endpoint
}

// NewAdmin returns an Admin of the limiter at baseURL (its admin listener,
// e.g. "http://limiter-admin.default.svc:8081", "https://..." when the
// service has http.tls set: WithTLSConfig then names the CA of its
// certificate unless the system's roots trust it; a path prefix is kept)
// that sends token as a bearer token. Of the options, WithHTTPClient,
// WithTransport, WithTLSConfig and WithRequestTimeout apply; the token,
// heartbeat and logging options have nothing to act on. It does not touch
// the network.
func NewAdmin(baseURL, token string, opts ...Option) (*Admin, error) {
	base, err := parseBaseURL(baseURL)
	if err != nil {
		return nil, fmt.Errorf("limiter admin client: %w", err)
	}
	if strings.TrimSpace(token) == "" {
		return nil, errors.New("limiter admin client: token must not be empty")
	}
	var cfg config
	for _, opt := range opts {
		if err := opt(&cfg); err != nil {
			return nil, fmt.Errorf("limiter admin client: %w", err)
		}
	}
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("limiter admin client: %w", err)
	}
	hc, _ := cfg.build()
	return &Admin{api: endpoint{base: base, http: hc, timeout: cfg.requestTimeout, token: token, maxAnswer: maxAdminAnswerBytes}}, nil
}

// Slots lists userID's live slots, earliest expiry first (GET
// /v1/admin/users/{user_id}/slots; role viewer or operator).
func (a *Admin) Slots(ctx context.Context, userID string) (httpapi.AdminSlotsResponse, error) {
	var out httpapi.AdminSlotsResponse
	err := a.api.do(ctx, http.MethodGet, httpapi.AdminUserSlotsPath(userID), nil, &out)
	return out, err
}

// ReleaseAll releases every slot of userID (POST
// /v1/admin/users/{user_id}/release; role operator): the holders' next
// heartbeat is answered 410 slot_lost. reason is required (at most
// httpapi.MaxReasonLength characters) and recorded in the audit; the
// service refuses a missing or longer one with ErrInvalid.
func (a *Admin) ReleaseAll(ctx context.Context, userID, reason string) (httpapi.AdminReleaseResponse, error) {
	var out httpapi.AdminReleaseResponse
	err := a.api.do(ctx, http.MethodPost, httpapi.AdminUserReleasePath(userID), httpapi.AdminReleaseRequest{Reason: reason}, &out)
	return out, err
}

// SetOverride overrides userID's limit (POST
// /v1/admin/users/{user_id}/override; role operator): until expiresIn from
// now, every acquire of the user, on any plan, is judged by maxStreams
// instead of the plan's limit. It replaces any override before it and
// lapses by itself. maxStreams is 0 to httpapi.MaxOverrideStreams,
// expiresIn a whole number of seconds from httpapi.MinOverrideExpiresIn to
// httpapi.MaxOverrideExpiresIn, and reason is required (at most
// httpapi.MaxReasonLength characters); the service refuses anything else
// with ErrInvalid, naming the field and its bound.
func (a *Admin) SetOverride(ctx context.Context, userID string, maxStreams int, expiresIn time.Duration, reason string) (httpapi.AdminOverrideResponse, error) {
	var out httpapi.AdminOverrideResponse
	err := a.setOverride(ctx, httpapi.AdminUserOverridePath(userID), maxStreams, expiresIn, reason, &out)
	return out, err
}

// setOverride posts an override to path and decodes the answer into out.
func (a *Admin) setOverride(ctx context.Context, path string, maxStreams int, expiresIn time.Duration, reason string, out any) error {
	if expiresIn%time.Second != 0 {
		return fmt.Errorf("limiter admin client: the override's duration must be whole seconds, got %s", expiresIn)
	}
	seconds := int64(expiresIn / time.Second)
	req := httpapi.AdminOverrideRequest{MaxConcurrentStreams: &maxStreams, ExpiresIn: &seconds, Reason: reason}
	return a.api.do(ctx, http.MethodPost, path, req, out)
}

// RemoveOverride ends userID's override now (DELETE
// /v1/admin/users/{user_id}/override; role operator): the plan's limit
// applies again from the user's next acquire. Removed in the answer says
// whether one was in force. reason is required, as for ReleaseAll.
func (a *Admin) RemoveOverride(ctx context.Context, userID, reason string) (httpapi.AdminOverrideRemoveResponse, error) {
	var out httpapi.AdminOverrideRemoveResponse
	err := a.api.do(ctx, http.MethodDelete, httpapi.AdminUserOverridePath(userID), httpapi.AdminOverrideRemoveRequest{Reason: reason}, &out)
	return out, err
}

// PoolKey shows key of pool: who holds it (each holder's user, stream and
// record), its cap and its override in force (GET
// /v1/admin/pools/{pool}/keys/{key}; role viewer or operator). A pool the
// service does not hold is an *Error with code httpapi.CodeUnknownPool; a
// key outside 1-128 bytes of [A-Za-z0-9._:/@-] matches ErrInvalid
// (httpapi.CodeInvalidPoolKey). Keys are case-sensitive; one holding '/'
// is sent escaped.
func (a *Admin) PoolKey(ctx context.Context, pool, key string) (httpapi.AdminPoolKeyResponse, error) {
	var out httpapi.AdminPoolKeyResponse
	err := a.api.do(ctx, http.MethodGet, httpapi.AdminPoolKeyPath(pool, key), nil, &out)
	return out, err
}

// SetPoolOverride overrides the cap of key of pool (POST
// /v1/admin/pools/{pool}/keys/{key}/override; role operator): until
// expiresIn from now, every stream that joins the key is judged by
// maxStreams instead of the pool's cap: 0 to
// httpapi.MaxPoolOverrideStreams, as a pool's caps are bounded. The
// other bounds and the reason are SetOverride's; a key the pool does not
// cap takes no override (ErrInvalid).
func (a *Admin) SetPoolOverride(ctx context.Context, pool, key string, maxStreams int, expiresIn time.Duration, reason string) (httpapi.AdminPoolOverrideResponse, error) {
	var out httpapi.AdminPoolOverrideResponse
	err := a.setOverride(ctx, httpapi.AdminPoolKeyOverridePath(pool, key), maxStreams, expiresIn, reason, &out)
	return out, err
}

// RemovePoolOverride ends the override of key of pool now (DELETE
// /v1/admin/pools/{pool}/keys/{key}/override; role operator): the pool's
// cap applies again from the next stream that joins the key. reason is
// required, as for ReleaseAll.
func (a *Admin) RemovePoolOverride(ctx context.Context, pool, key, reason string) (httpapi.AdminOverrideRemoveResponse, error) {
	var out httpapi.AdminOverrideRemoveResponse
	err := a.api.do(ctx, http.MethodDelete, httpapi.AdminPoolKeyOverridePath(pool, key), httpapi.AdminOverrideRemoveRequest{Reason: reason}, &out)
	return out, err
}

// Audit lists the most recent admin calls, newest first, as many as the
// service returns by default (httpapi.DefaultAuditLimit) (GET
// /v1/admin/audit; role viewer or operator).
func (a *Admin) Audit(ctx context.Context) (httpapi.AuditResponse, error) {
	return a.AuditLast(ctx, 0)
}

// AuditLast lists the n most recent admin calls, newest first: 1 to
// httpapi.MaxAuditLimit, or 0 for the service's default (GET
// /v1/admin/audit?limit=n; role viewer or operator).
func (a *Admin) AuditLast(ctx context.Context, n int) (httpapi.AuditResponse, error) {
	path := httpapi.PathAdminAudit
	if n != 0 {
		path += "?limit=" + strconv.Itoa(n)
	}
	var out httpapi.AuditResponse
	err := a.api.do(ctx, http.MethodGet, path, nil, &out)
	return out, err
}
