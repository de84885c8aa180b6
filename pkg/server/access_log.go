package server

import (
	"context"
	"log/slog"
	"net/http"
	"time"
)

// requestInfo is what a request's handlers learn that the access log
// reports: who called.
type requestInfo struct {
	caller string // the API caller's name; "" when the API is open
}

type infoKey struct{}

func infoOf(ctx context.Context) *requestInfo {
	info, _ := ctx.Value(infoKey{}).(*requestInfo)
	return info
}

// logAccess logs one "request" line per request at DEBUG (log.level
// debug): method, route, status, duration and caller. At other levels it
// only carries the requestInfo for the failure log.
func (s *Server) logAccess(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info := &requestInfo{}
		ctx := context.WithValue(r.Context(), infoKey{}, info)
		inner := r.WithContext(ctx)
		// The mux sets the route's pattern on the request it is given: hand
		// it back to the layers outside, whose spans and metrics name the
		// route by it.
		defer func() { r.Pattern = inner.Pattern }()
		if !s.log.Enabled(ctx, slog.LevelDebug) {
			next.ServeHTTP(w, inner)
			return
		}
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		start := time.Now()
		next.ServeHTTP(rec, inner)
		s.log.LogAttrs(ctx, slog.LevelDebug, "request",
			slog.String("method", r.Method),
			// The route's pattern, not the path: admin paths hold user ids.
			slog.String("route", inner.Pattern),
			slog.Int("status", rec.status),
			slog.Duration("duration", time.Since(start)),
			slog.String("caller", info.caller),
			slog.String("remote", r.RemoteAddr),
		)
	})
}

// statusRecorder remembers the status a handler answered.
type statusRecorder struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
}

func (s *statusRecorder) WriteHeader(status int) {
	if !s.wroteHeader {
		s.status, s.wroteHeader = status, true
	}
	s.ResponseWriter.WriteHeader(status)
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
