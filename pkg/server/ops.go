package server

import (
	"net/http"
)

// OpsHandler serves the ops listener: /healthz (the process answers),
// /readyz (the tier table has synced and the server is not draining; not
// tied to Redis, or a Redis outage would turn fail-open into fail-closed at
// the load balancer, except that Options.RedisAnswered may hold a starting
// replica back: serve's holds it while its Redis client warms up, for a
// bounded time, and with redis.requiredForReadiness until Redis first
// answers) and /metrics.
func (s *Server) OpsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writePlain(w, http.StatusOK, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		switch {
		case s.draining.Load():
			writePlain(w, http.StatusServiceUnavailable, "draining\n")
		case !s.lim.Tiers().IsSynced():
			writePlain(w, http.StatusServiceUnavailable, "tiers not synced yet\n")
		case s.opts.RedisAnswered != nil && !s.opts.RedisAnswered():
			writePlain(w, http.StatusServiceUnavailable, "redis has not answered yet\n")
		default:
			writePlain(w, http.StatusOK, "ok\n")
		}
	})
	if s.opts.Metrics != nil {
		mux.Handle("GET /metrics", s.opts.Metrics)
	}
	return mux
}

func writePlain(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}
