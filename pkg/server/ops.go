package server

import (
	"net/http"

	"github.com/joishi/limiter/internal/opsmux"
)

// OpsHandler serves the ops listener: /healthz (the process answers),
// /readyz (the tier table has synced and the server is not draining; not
// tied to Redis, or a Redis outage would turn fail-open into fail-closed at
// the load balancer, except that Options.RedisAnswered may hold a starting
// replica back: serve's holds it while its Redis client warms up, for a
// bounded time, and with redis.requiredForReadiness until Redis first
// answers) and /metrics.
func (s *Server) OpsHandler() http.Handler {
	return opsmux.Handler(s.opts.Metrics,
		opsmux.Check{Reason: "draining", Failing: s.draining.Load},
		opsmux.Check{Reason: "tiers not synced yet", Failing: func() bool { return !s.lim.Tiers().IsSynced() }},
		opsmux.Check{Reason: "redis has not answered yet", Failing: func() bool { return s.opts.RedisAnswered != nil && !s.opts.RedisAnswered() }},
	)
}
