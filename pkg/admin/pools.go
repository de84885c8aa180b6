package admin

import (
	"net/http"

	"github.com/joishi/limiter/pkg/httpapi"
)

// listPoolKey serves GET /v1/admin/pools/{pool}/keys/{key}: the key's
// holders, its waiters in serve order, its cap, whether the cap refuses
// (not in shadow mode) and its override, listed as a user's slots and
// queue are (a pool key's memberships and tickets name their user).
func (a *Admin) listPoolKey(_ http.ResponseWriter, r *http.Request, _ *httpapi.AuditRecord) (any, error) {
	listed, err := a.lim.PoolSlots(r.Context(), r.PathValue("pool"), r.PathValue("key"))
	if err != nil {
		return nil, err
	}
	out := httpapi.AdminPoolKeyResponse{Pool: listed.Pool, Key: listed.Key, Used: listed.Used, Enforce: new(listed.Enforce),
		Override: adminOverrideOf(listed.Override), Holders: make([]httpapi.AdminSlot, len(listed.Holders)),
		Waiters: make([]httpapi.AdminTicket, len(listed.Waiters)), Deleted: listed.Deleted}
	if listed.Capped {
		out.Limit = &listed.Limit
	}
	for i, h := range listed.Holders {
		out.Holders[i] = adminSlot(h.Slot)
		out.Holders[i].UserID = h.UserID
	}
	for i, w := range listed.Waiters {
		out.Waiters[i] = adminTicket(w.Ticket)
		out.Waiters[i].UserID = w.UserID
	}
	return out, nil
}
