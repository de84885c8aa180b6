package admin

import (
	"net/http"

	"github.com/joishi/limiter/pkg/httpapi"
)

// listPoolKey serves GET /v1/admin/pools/{pool}/keys/{key}: the key's
// holders, its cap and its override, listed as a user's slots are (a pool
// key's memberships are slots that name their user).
func (a *Admin) listPoolKey(_ http.ResponseWriter, r *http.Request, _ *httpapi.AuditRecord) (any, error) {
	listed, err := a.lim.PoolSlots(r.Context(), r.PathValue("pool"), r.PathValue("key"))
	if err != nil {
		return nil, err
	}
	out := httpapi.AdminPoolKeyResponse{Pool: listed.Pool, Key: listed.Key, Used: listed.Used,
		Override: adminOverrideOf(listed.Override), Holders: make([]httpapi.AdminSlot, len(listed.Holders))}
	if listed.Capped {
		out.Limit = &listed.Limit
	}
	for i, h := range listed.Holders {
		out.Holders[i] = adminSlot(h.Slot)
		out.Holders[i].UserID = h.UserID
	}
	return out, nil
}
