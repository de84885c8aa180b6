// Package opsmux is the handler of the ops listener, the same for `limiter
// serve` and `limiter proxy`: /healthz, /readyz and /metrics. Each passes
// in what holds its replica back from ready.
package opsmux

import "net/http"

// Check is one reason a replica is not ready yet.
type Check struct {
	// Reason is the body of /readyz while the check fails, without the
	// newline: "draining".
	Reason string
	// Failing reports whether the replica is held back for Reason now.
	Failing func() bool
}

// Handler serves /healthz (the process answers: 200 "ok"), /readyz (503
// with the Reason of the first of checks failing, in their order; else 200
// "ok") and, when metrics is not nil, /metrics. Every body but metrics' is
// one line of plain text.
func Handler(metrics http.Handler, checks ...Check) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { plain(w, http.StatusOK, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		for _, c := range checks {
			if c.Failing() {
				plain(w, http.StatusServiceUnavailable, c.Reason)
				return
			}
		}
		plain(w, http.StatusOK, "ok")
	})
	if metrics != nil {
		mux.Handle("GET /metrics", metrics)
	}
	return mux
}

func plain(w http.ResponseWriter, status int, line string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(line + "\n"))
}
