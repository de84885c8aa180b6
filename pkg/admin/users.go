package admin

import (
	"cmp"
	"net/http"
	"slices"

	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/server"
)

// listSlots serves GET /v1/admin/users/{user_id}/slots: the user's live
// slots, override and waiting acquires (by priority, then arrival).
func (a *Admin) listSlots(_ http.ResponseWriter, r *http.Request, _ *httpapi.AuditRecord) (any, error) {
	slots, err := a.lim.Slots(r.Context(), r.PathValue("user_id"))
	if err != nil {
		return nil, err
	}
	out := httpapi.AdminSlotsResponse{UserID: slots.UserID, Used: slots.Used, Slots: make([]httpapi.AdminSlot, len(slots.Slots)),
		Override: adminOverrideOf(slots.Override), Queue: make([]httpapi.AdminTicket, len(slots.Queue))}
	for i, s := range slots.Slots {
		out.Slots[i] = adminSlot(s)
	}
	for i, t := range slots.Queue {
		out.Queue[i] = adminTicket(t)
	}
	out.PlanLimits = a.planLimits(slots)
	return out, nil
}

// planLimits are the limits of the plans slots holds and waits under,
// by plan name, each saying whether it refuses (a plan in shadow mode
// does not, so the user may hold more). A listing cannot tell one limit
// of the user: the next acquire's plan decides it, so the page shows
// each plan's.
func (a *Admin) planLimits(slots limiter.UserSlots) []httpapi.AdminPlanLimit {
	plans := make([]string, 0, len(slots.Slots)+len(slots.Queue))
	for _, s := range slots.Slots {
		plans = append(plans, s.Plan)
	}
	for _, t := range slots.Queue {
		plans = append(plans, t.Plan)
	}
	slices.Sort(plans)
	out := []httpapi.AdminPlanLimit{}
	for _, plan := range slices.Compact(plans) {
		if tier, ok := a.lim.Tiers().LookupHeld(plan); ok && plan != "" {
			out = append(out, httpapi.AdminPlanLimit{Plan: plan, Limit: tier.MaxConcurrentStreams, Enforce: new(tier.Enforced())})
		}
	}
	return out
}

// adminTicket is t as the admin API shows it.
func adminTicket(t limiter.Ticket) httpapi.AdminTicket {
	return httpapi.AdminTicket{StreamID: t.StreamID, Place: t.Place, Priority: t.Priority, Plan: t.Plan, Caller: t.Caller, Label: t.Label,
		WaitingSince: t.Since, WaitedMs: t.Waited.Milliseconds(), ExpiresAt: t.ExpiresAt}
}

// adminSlot is s as the admin API shows it.
func adminSlot(s limiter.Slot) httpapi.AdminSlot {
	slot := httpapi.AdminSlot{StreamID: s.StreamID, ExpiresAt: s.ExpiresAt, TTLMs: s.TTL.Milliseconds(),
		Caller: s.Caller, Plan: s.Plan, Label: s.Label}
	if !s.StartedAt.IsZero() {
		started, age := s.StartedAt, s.Age.Milliseconds()
		slot.StartedAt, slot.AgeMs = &started, &age
	}
	return slot
}

// releaseAll serves POST /v1/admin/users/{user_id}/release.
func (a *Admin) releaseAll(w http.ResponseWriter, r *http.Request, rec *httpapi.AuditRecord) (any, error) {
	reason, err := releaseReason(w, r)
	rec.Reason = reason
	if err != nil {
		return nil, err
	}
	ids, err := a.lim.ReleaseAll(r.Context(), r.PathValue("user_id"), rec.AuditID)
	if err != nil {
		return nil, err
	}
	rec.Released = nonNil(ids)
	return httpapi.AdminReleaseResponse{Released: rec.Released, AuditID: rec.AuditID}, nil
}

// releaseReason decodes a release's body and returns its reason (see
// checkReason).
func releaseReason(w http.ResponseWriter, r *http.Request) (string, error) {
	var req httpapi.AdminReleaseRequest
	err := server.Decode(w, r, httpapi.MaxBodyBytes, &req)
	reason, rerr := checkReason(req.Reason, "every slot of this user is released")
	return reason, cmp.Or(err, rerr)
}
