// Package opsmux is the handler of the ops listener, the same for `limiter
// serve` and `limiter proxy`: /healthz, /readyz and /metrics. Each passes
// in what holds its replica back from ready.
package opsmux

import (
	"encoding/json"
	"net/http"
	"path"

	"github.com/joishi/limiter/pkg/httpapi"
)

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
// "ok") and, when metrics is not nil, /metrics, to GET and HEAD. Every
// body but metrics' is one line of plain text; another method is 405, and
// another path (or one not in its canonical form) 404, each with the
// API's JSON error, as the other listeners answer.
func Handler(metrics http.Handler, checks ...Check) http.Handler {
	mux := http.NewServeMux()
	route := func(path string, h http.Handler) {
		mux.Handle("GET "+path, h)
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", "GET, HEAD")
			jsonError(w, http.StatusMethodNotAllowed, httpapi.CodeMethodNotAllowed, path+" accepts GET (or HEAD) only")
		})
	}
	route("/healthz", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { plain(w, http.StatusOK, "ok") }))
	route("/readyz", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		for _, c := range checks {
			if c.Failing() {
				plain(w, http.StatusServiceUnavailable, c.Reason)
				return
			}
		}
		plain(w, http.StatusOK, "ok")
	}))
	if metrics != nil {
		route("/metrics", metrics)
	}
	notFound := func(w http.ResponseWriter, r *http.Request) {
		jsonError(w, http.StatusNotFound, httpapi.CodeNotFound, "no route "+r.Method+" "+r.URL.Path)
	}
	mux.HandleFunc("/", notFound)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := r.URL.EscapedPath(); p != "" && p != path.Clean(p) {
			notFound(w, r) // not redirected: no ops path ends in a slash
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// jsonError answers status with the API's error body of code.
func jsonError(w http.ResponseWriter, status int, code, message string) {
	body, _ := json.Marshal(httpapi.ErrorResponse{Error: httpapi.Error{Code: code, Message: message}})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

func plain(w http.ResponseWriter, status int, line string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(line + "\n"))
}
