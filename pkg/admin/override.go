package admin

import (
	"cmp"
	"net/http"
	"strconv"
	"time"

	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/server"
)

// overrideScope is whose limit an override route replaces: a user's, or a
// pool key's cap. The routes of both are one: the same body, bounds,
// audit and answers, bar the scope's own name.
type overrideScope struct {
	// noun names the scope in messages ("user", "pool key"), and limit
	// what an override replaces ("limit", "cap").
	noun, limit string
	// most bounds an override's max_concurrent_streams, as the scope's
	// own limit is bounded; bound says by what.
	most   int
	bound  string
	set    func(r *http.Request, req limiter.OverrideRequest) (limiter.Override, error)
	remove func(r *http.Request) (bool, error)
	// answer is the 200 body of a set, o the override it put in force.
	answer func(r *http.Request, o httpapi.AdminOverride, auditID string) any
}

// userScope is the scope of /v1/admin/users/{user_id}/override.
func (a *Admin) userScope() overrideScope {
	return overrideScope{
		noun: "user", limit: "limit", most: httpapi.MaxOverrideStreams, bound: "a tier's bound",
		set: func(r *http.Request, req limiter.OverrideRequest) (limiter.Override, error) {
			return a.lim.SetOverride(r.Context(), r.PathValue("user_id"), req)
		},
		remove: func(r *http.Request) (bool, error) { return a.lim.RemoveOverride(r.Context(), r.PathValue("user_id")) },
		answer: func(r *http.Request, o httpapi.AdminOverride, auditID string) any {
			return httpapi.AdminOverrideResponse{UserID: r.PathValue("user_id"), Override: o, AuditID: auditID}
		},
	}
}

// poolKeyScope is the scope of /v1/admin/pools/{pool}/keys/{key}/override.
func (a *Admin) poolKeyScope() overrideScope {
	return overrideScope{
		noun: "pool key", limit: "cap", most: httpapi.MaxPoolOverrideStreams, bound: "a pool's bound",
		set: func(r *http.Request, req limiter.OverrideRequest) (limiter.Override, error) {
			return a.lim.SetPoolOverride(r.Context(), r.PathValue("pool"), r.PathValue("key"), req)
		},
		remove: func(r *http.Request) (bool, error) {
			return a.lim.RemovePoolOverride(r.Context(), r.PathValue("pool"), r.PathValue("key"))
		},
		answer: func(r *http.Request, o httpapi.AdminOverride, auditID string) any {
			return httpapi.AdminPoolOverrideResponse{Pool: r.PathValue("pool"), Key: r.PathValue("key"), Override: o, AuditID: auditID}
		},
	}
}

// routeOverride serves setting (POST) and removing (DELETE) the override
// of scope on path.
func (a *Admin) routeOverride(mux *http.ServeMux, path string, scope overrideScope) {
	a.route(mux, path,
		adminRoute{method: http.MethodPost, action: httpapi.ActionSetOverride, role: httpapi.RoleOperator, do: a.setOverride(scope), audited: scope.auditBody},
		adminRoute{method: http.MethodDelete, action: httpapi.ActionRemoveOverride, role: httpapi.RoleOperator, do: a.removeOverride(scope), audited: reasonOf(scope.removalReason)})
}

// setOverride serves POST .../override: the scope's limit is
// max_concurrent_streams (a user's on every plan) until expires_in seconds
// from now; it replaces any override before it.
func (a *Admin) setOverride(scope overrideScope) adminHandler {
	return func(w http.ResponseWriter, r *http.Request, rec *httpapi.AuditRecord) (any, error) {
		req, err := scope.overrideBody(w, r, rec)
		if err != nil {
			return nil, err
		}
		o, err := scope.set(r, limiter.OverrideRequest{
			MaxConcurrentStreams: *req.MaxConcurrentStreams,
			For:                  time.Duration(*req.ExpiresIn) * time.Second,
			Actor:                rec.Actor,
			Reason:               rec.Reason,
		})
		if err != nil {
			return nil, err
		}
		rec.Override = &httpapi.AuditOverride{MaxConcurrentStreams: o.MaxConcurrentStreams, ExpiresAt: o.ExpiresAt}
		return scope.answer(r, adminOverride(o), rec.AuditID), nil
	}
}

// removeOverride serves DELETE .../override: the plan's limit (the pool's
// cap) applies again from the next acquire.
func (a *Admin) removeOverride(scope overrideScope) adminHandler {
	return func(w http.ResponseWriter, r *http.Request, rec *httpapi.AuditRecord) (any, error) {
		reason, err := scope.removalReason(w, r)
		rec.Reason = reason
		if err != nil {
			return nil, err
		}
		removed, err := scope.remove(r)
		if err != nil {
			return nil, err
		}
		rec.OverrideRemoved = &removed
		return httpapi.AdminOverrideRemoveResponse{Removed: removed, AuditID: rec.AuditID}, nil
	}
}

// overrideBody decodes an override's body and checks that every field is
// there and in bounds. Whatever of it was read goes into rec, in bounds
// or not, so that a refused call's record says what it asked for: the
// reason cleaned, the numbers as sent (see httpapi.AuditOverrideAsked).
func (s overrideScope) overrideBody(w http.ResponseWriter, r *http.Request, rec *httpapi.AuditRecord) (httpapi.AdminOverrideRequest, error) {
	var req httpapi.AdminOverrideRequest
	err := server.Decode(w, r, httpapi.MaxBodyBytes, &req)
	reason, rerr := checkReason(req.Reason, "this "+s.noun+"'s "+s.limit+" is overridden")
	rec.Reason = reason
	if req.MaxConcurrentStreams != nil || req.ExpiresIn != nil {
		rec.Asked = &httpapi.AuditOverrideAsked{MaxConcurrentStreams: req.MaxConcurrentStreams, ExpiresIn: req.ExpiresIn}
	}
	if field, number, ok := server.OutOfRange(err); ok {
		err = s.outOfBound(field, number)
	}
	if err != nil {
		return req, err
	}
	switch n, d := req.MaxConcurrentStreams, req.ExpiresIn; {
	case n == nil:
		err = server.BadRequest("max_concurrent_streams is required: the %s's %s while the override is in force, 0 to %d", s.noun, s.limit, s.most)
	case *n < 0 || *n > s.most:
		err = s.outOfBound("max_concurrent_streams", strconv.Itoa(*n))
	case d == nil:
		err = server.BadRequest("expires_in is required: how long the override stays in force, in seconds (%d to %d)", httpapi.MinOverrideExpiresIn, httpapi.MaxOverrideExpiresIn)
	case *d < httpapi.MinOverrideExpiresIn || *d > httpapi.MaxOverrideExpiresIn:
		err = s.outOfBound("expires_in", strconv.FormatInt(*d, 10))
	}
	return req, cmp.Or(err, rerr)
}

// outOfBound refuses the number got, as sent, for field, naming its
// bound; a number past 64 bits too (server.OutOfRange).
func (s overrideScope) outOfBound(field, got string) error {
	if field == "max_concurrent_streams" {
		return server.BadRequest("max_concurrent_streams must be 0 to %d (%s), got %s", s.most, s.bound, got)
	}
	return server.BadRequest("expires_in must be %d to %d seconds (a minute to 30 days), got %s", httpapi.MinOverrideExpiresIn, httpapi.MaxOverrideExpiresIn, got)
}

// auditBody reads an override's body into rec (see overrideBody), for
// the record of a call refused before its body was read.
func (s overrideScope) auditBody(w http.ResponseWriter, r *http.Request, rec *httpapi.AuditRecord) {
	_, _ = s.overrideBody(w, r, rec)
}

// removalReason decodes the body of an override's removal and returns its
// reason (see checkReason).
func (s overrideScope) removalReason(w http.ResponseWriter, r *http.Request) (string, error) {
	var req httpapi.AdminOverrideRemoveRequest
	err := server.Decode(w, r, httpapi.MaxBodyBytes, &req)
	reason, rerr := checkReason(req.Reason, "this "+s.noun+"'s override is removed")
	return reason, cmp.Or(err, rerr)
}

// adminOverride is o as the admin API shows it.
func adminOverride(o limiter.Override) httpapi.AdminOverride {
	return httpapi.AdminOverride{
		MaxConcurrentStreams: o.MaxConcurrentStreams,
		SetAt:                o.SetAt,
		ExpiresAt:            o.ExpiresAt,
		TTLMs:                o.TTL.Milliseconds(),
		Actor:                o.Actor,
		Reason:               o.Reason,
	}
}

// adminOverrideOf is adminOverride of o, a listing's override in force;
// nil when none.
func adminOverrideOf(o *limiter.Override) *httpapi.AdminOverride {
	if o == nil {
		return nil
	}
	view := adminOverride(*o)
	return &view
}
