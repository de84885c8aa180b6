package server

import (
	"cmp"
	"net/http"
	"time"

	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
)

// setOverride serves POST /v1/admin/users/{user_id}/override: the user's
// limit is max_concurrent_streams, on every plan, until expires_in
// seconds from now; it replaces any override before it.
func (a *Admin) setOverride(w http.ResponseWriter, r *http.Request, rec *httpapi.AuditRecord) (any, error) {
	req, reason, err := overrideBody(w, r)
	rec.Reason = reason
	if err != nil {
		return nil, err
	}
	o, err := a.lim.SetOverride(r.Context(), r.PathValue("user_id"), limiter.OverrideRequest{
		MaxConcurrentStreams: *req.MaxConcurrentStreams,
		For:                  time.Duration(*req.ExpiresIn) * time.Second,
		Actor:                rec.Actor,
		Reason:               reason,
	})
	if err != nil {
		return nil, err
	}
	rec.Override = &httpapi.AuditOverride{MaxConcurrentStreams: o.MaxConcurrentStreams, ExpiresAt: o.ExpiresAt}
	return httpapi.AdminOverrideResponse{UserID: r.PathValue("user_id"), Override: adminOverride(o), AuditID: rec.AuditID}, nil
}

// removeOverride serves DELETE /v1/admin/users/{user_id}/override: the
// plan's limit applies again from the user's next acquire.
func (a *Admin) removeOverride(w http.ResponseWriter, r *http.Request, rec *httpapi.AuditRecord) (any, error) {
	reason, err := removalReason(w, r)
	rec.Reason = reason
	if err != nil {
		return nil, err
	}
	removed, err := a.lim.RemoveOverride(r.Context(), r.PathValue("user_id"))
	if err != nil {
		return nil, err
	}
	rec.OverrideRemoved = &removed
	return httpapi.AdminOverrideRemoveResponse{Removed: removed, AuditID: rec.AuditID}, nil
}

// overrideBody decodes an override's body and checks that every field is
// there and in bounds; the reason comes back cleaned for the audit.
func overrideBody(w http.ResponseWriter, r *http.Request) (httpapi.AdminOverrideRequest, string, error) {
	var req httpapi.AdminOverrideRequest
	err := decode(w, r, httpapi.MaxBodyBytes, &req)
	reason, rerr := checkReason(req.Reason, "this user's limit is overridden")
	if err != nil {
		return req, reason, err
	}
	switch n, d := req.MaxConcurrentStreams, req.ExpiresIn; {
	case n == nil:
		err = badRequest("max_concurrent_streams is required: the user's limit while the override is in force, 0 to %d", httpapi.MaxOverrideStreams)
	case *n < 0 || *n > httpapi.MaxOverrideStreams:
		err = badRequest("max_concurrent_streams must be 0 to %d (a tier's bound), got %d", httpapi.MaxOverrideStreams, *n)
	case d == nil:
		err = badRequest("expires_in is required: how long the override stays in force, in seconds (%d to %d)", httpapi.MinOverrideExpiresIn, httpapi.MaxOverrideExpiresIn)
	case *d < httpapi.MinOverrideExpiresIn || *d > httpapi.MaxOverrideExpiresIn:
		err = badRequest("expires_in must be %d to %d seconds (a minute to 30 days), got %d", httpapi.MinOverrideExpiresIn, httpapi.MaxOverrideExpiresIn, *d)
	}
	return req, reason, cmp.Or(err, rerr)
}

// overrideReason is the reason of an override's body, for the audit of a
// refused call.
func overrideReason(w http.ResponseWriter, r *http.Request) (string, error) {
	_, reason, err := overrideBody(w, r)
	return reason, err
}

// removalReason decodes the body of an override's removal and returns its
// reason (see checkReason).
func removalReason(w http.ResponseWriter, r *http.Request) (string, error) {
	var req httpapi.AdminOverrideRemoveRequest
	err := decode(w, r, httpapi.MaxBodyBytes, &req)
	reason, rerr := checkReason(req.Reason, "this user's override is removed")
	return reason, cmp.Or(err, rerr)
}

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
