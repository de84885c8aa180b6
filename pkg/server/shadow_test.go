package server_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/server"
	"github.com/joishi/limiter/pkg/tiers"
)

// A plan and a pool in shadow mode answer 200 where they would refuse,
// with would_refuse (and the pool key in would_refuse_by), every answer
// checked against the OpenAPI contract; GET /v1/tiers says which plan
// does not enforce.
func TestShadowScopesAnswerWouldRefuse(t *testing.T) {
	off := false
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", Keys: map[string]int{"big": 1}, Enforce: &off}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	lim := limitertest.New(t, limitertest.Options{Tiers: []tiers.Tier{
		tiers.Tier{Plan: "watch", MaxConcurrentStreams: 1, Enforce: &off}.WithDefaults(),
		tiers.Tier{Plan: "three", MaxConcurrentStreams: 3}.WithDefaults(),
	}, Limiter: limiter.Options{Pools: table}}).Limiter
	a := newAPIOf(t, server.New(lim, server.Options{}))
	suffix := time.Now().Format("150405.000000")
	acquire := func(user, plan string, pools map[string]string) httpapi.AcquireResponse {
		t.Helper()
		body := map[string]any{"user_id": user + suffix, "plan": plan, "wait_ms": 1000}
		if pools != nil {
			body["pools"] = pools
		}
		r := a.call(t, http.MethodPost, "/v1/slots/acquire", mustJSON(t, body), false)
		var out httpapi.AcquireResponse
		if r.status != http.StatusOK || json.Unmarshal(r.body, &out) != nil {
			t.Fatalf("acquire of %s on %s: %d %s; want 200", user, plan, r.status, r.body)
		}
		return out
	}
	if got := acquire("ana", "watch", nil); got.WouldRefuse != "" || got.WouldRefuseBy != nil {
		t.Errorf("ana's first: %+v; want no would_refuse", got)
	}
	if got := acquire("ana", "watch", nil); got.WouldRefuse != "stream_limit_reached" || got.Used != 2 || got.Limit != 1 || got.WouldRefuseBy != nil {
		t.Errorf("ana's second over a limit of 1: %+v; want would_refuse stream_limit_reached, used 2 of 1", got)
	}
	acquire("bo", "three", map[string]string{"model": "big"})
	got := acquire("cy", "three", map[string]string{"model": "big"})
	if got.WouldRefuse != "pool_limit_reached" || got.WouldRefuseBy == nil ||
		*got.WouldRefuseBy != (httpapi.PoolGrant{Pool: "model", Key: "big", Used: 2, Limit: 1}) {
		t.Errorf("cy on a full big: %+v (by %+v); want would_refuse pool_limit_reached by model=big, 2 of 1", got, got.WouldRefuseBy)
	}

	r := a.call(t, http.MethodGet, "/v1/tiers", nil, false)
	var listed httpapi.TiersResponse
	if r.status != http.StatusOK || json.Unmarshal(r.body, &listed) != nil {
		t.Fatalf("GET /v1/tiers: %d %s", r.status, r.body)
	}
	enforce := map[string]bool{}
	for _, tier := range listed.Tiers {
		enforce[tier.Plan] = tier.Enforce
	}
	if enforce["watch"] || !enforce["three"] {
		t.Errorf("GET /v1/tiers: enforce %v; want watch false, three true", enforce)
	}
}
