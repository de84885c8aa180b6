// Package server serves the limiter's HTTP API and its ops endpoints
// (health, readiness, metrics). It maps limiter outcomes to HTTP; all
// limiting logic lives in pkg/limiter.
package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync/atomic"
	"time"

	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/ratelog"
)

// Options configure a Server. Zero values take the documented defaults.
type Options struct {
	// Logger receives request failures and lifecycle events. Default
	// slog.Default().
	Logger *slog.Logger
	// Metrics serves GET /metrics on the ops listener. Default: 404.
	Metrics http.Handler
	// Middleware wraps the API and admin handlers (tracing, for one).
	// Default none.
	Middleware func(http.Handler) http.Handler
	// Admin, when set, is served on the admin listener (AdminHandler):
	// the admin API and page (pkg/admin), never on the API listener.
	// Default nil: no admin listener.
	Admin AdminRoutes
	// Callers, when set, authenticates every call of the slot API
	// (/v1/slots/*, /v1/tiers) and scopes it to the caller's plans.
	// Default nil: the slot API is open to anyone who reaches it.
	Callers *Callers
	// RedisAnswered, when set, holds /readyz at 503 until it returns true
	// (redis.requiredForReadiness: a replica whose Redis never answered is
	// not ready). Once true it must stay true: readiness gates the start,
	// it never follows Redis. Default nil: readiness ignores Redis.
	RedisAnswered func() bool
}

// failureLogEvery bounds the "request failed" lines, as the limiter's
// degraded warnings are bounded: during an outage every request of a
// Closed plan fails alike.
const failureLogEvery = 10 * time.Second

// Server is the HTTP face of a Limiter.
type Server struct {
	lim      *limiter.Limiter
	opts     Options
	log      *slog.Logger
	draining atomic.Bool
	// waitsOver ends when the server starts draining: acquires waiting
	// for a slot are answered then (ErrShuttingDown), not cut at the
	// grace's end.
	waitsOver context.Context
	endWaits  context.CancelFunc
	// listening holds the Timeouts Run serves with; before Run, the
	// defaults.
	listening atomic.Pointer[Timeouts]
	// Failed requests, rate-limited: 500s (a refusing Redis, a bug) apart
	// from 503s (an outage), so a flood of the one never hides the other.
	failedInternal    *ratelog.Logger
	failedUnavailable *ratelog.Logger
}

// New returns a Server for lim.
func New(lim *limiter.Limiter, opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	waitsOver, endWaits := context.WithCancel(context.Background())
	return &Server{
		lim: lim, opts: opts, log: opts.Logger,
		failedInternal:    ratelog.New(opts.Logger, failureLogEvery),
		failedUnavailable: ratelog.New(opts.Logger, failureLogEvery),
		waitsOver:         waitsOver, endWaits: endWaits,
	}
}

// ErrShuttingDown ends an acquire's wait when the server starts draining
// (503 limiter_unavailable): the client retries, and another replica
// takes it. It wraps limiter.ErrShuttingDown, so that the limiter counts
// the wait failed, not cancelled: the client did not leave.
var ErrShuttingDown = fmt.Errorf("this limiter replica is %w and ended the acquire's wait; retry: another replica takes it", limiter.ErrShuttingDown)

// timeouts returns the listeners' timeouts.
func (s *Server) timeouts() Timeouts {
	if t := s.listening.Load(); t != nil {
		return *t
	}
	return Timeouts{}.WithDefaults()
}

// Handler returns the API listener's routes: the slot API of
// api/openapi.yaml.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	s.route(mux, "POST", httpapi.PathAcquire, s.authenticate(s.acquire))
	s.route(mux, "POST", httpapi.PathHeartbeat, s.authenticate(s.heartbeat))
	s.route(mux, "POST", httpapi.PathHeartbeats, s.authenticate(s.heartbeats))
	s.route(mux, "POST", httpapi.PathRelease, s.authenticate(s.release))
	s.route(mux, "GET", httpapi.PathTiers, s.authenticate(s.tiers))
	return s.wrap(mux)
}

// AdminHandler returns the admin listener's routes: the admin API and page
// of Options.Admin (none without it).
func (s *Server) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	if s.opts.Admin != nil {
		s.opts.Admin.Routes(mux)
	}
	return s.wrap(mux)
}

// wrap answers mux's unknown paths 404, and so a path not in its
// canonical form (//v1/..., /v1/./slots/...), which the mux would
// redirect, and adds the access log, panic recovery and
// Options.Middleware.
func (s *Server) wrap(mux *http.ServeMux) http.Handler {
	notFound := func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, httpapi.Error{Code: httpapi.CodeNotFound, Message: "no route " + r.Method + " " + r.URL.Path})
	}
	mux.HandleFunc("/", notFound)
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.EscapedPath()
		if p != "" && p != cleanPath(p) { // as the mux sees it: an escaped "." is a user id
			r.Pattern = "/" // the route of the mux's own 404, not the path: it may name a user
			notFound(w, r)
			return
		}
		if escapedSlash(p) {
			serveEscapedSlash(mux, w, r, p)
			return
		}
		mux.ServeHTTP(w, r)
	})
	h = s.logAccess(h)
	h = s.recoverPanics(h)
	if s.opts.Middleware != nil {
		h = s.opts.Middleware(h)
	}
	return h
}

// route registers handler for method and path, and a JSON 405 for the
// path's other methods, HEAD included (a GET pattern would serve it).
func (s *Server) route(mux *http.ServeMux, method, path string, handler http.HandlerFunc) {
	mux.HandleFunc(method+" "+path, handler)
	notAllowed := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", method)
		writeError(w, http.StatusMethodNotAllowed, httpapi.Error{Code: httpapi.CodeMethodNotAllowed, Message: path + " accepts " + method + " only"})
	}
	mux.HandleFunc(path, notAllowed)
	if method == http.MethodGet {
		mux.HandleFunc(http.MethodHead+" "+path, notAllowed)
	}
}

// escapedSlash reports whether the escaped path p has a segment that is
// an escaped slash alone: a user id or a pool key "/" (%2F). Every
// request's path passes it, so it allocates nothing.
func escapedSlash(p string) bool {
	for {
		i := strings.IndexByte(p, '/')
		if i < 0 {
			return false
		}
		p = p[i+1:]
		if seg, _, _ := strings.Cut(p, "/"); strings.EqualFold(seg, "%2F") {
			return true
		}
	}
}

// serveEscapedSlash serves the escaped path p, one of whose segments is
// an escaped slash alone. The mux would take that segment for a trailing
// slash, which no wildcard matches, and answer 404: it routes a copy of
// the request whose such segments are a stand-in no path segment of a
// route is (%00), and the route's wildcards are then given p's own
// segments.
func serveEscapedSlash(mux *http.ServeMux, w http.ResponseWriter, r *http.Request, p string) {
	segs := strings.Split(p, "/")
	stand := make([]string, len(segs))
	for i, seg := range segs {
		stand[i] = seg
		if strings.EqualFold(seg, "%2F") {
			stand[i] = "%00"
		}
	}
	u, err := url.Parse(strings.Join(stand, "/"))
	if err != nil { // p parsed once already, and its copy parses alike
		mux.ServeHTTP(w, r)
		return
	}
	standIn := r.Clone(r.Context())
	standIn.URL = u
	h, pattern := mux.Handler(standIn)
	r.Pattern = pattern
	route := pattern
	if i := strings.IndexByte(route, ' '); i >= 0 {
		route = route[i+1:] // after its method
	}
	for i, part := range strings.Split(route, "/") {
		if name, ok := strings.CutPrefix(part, "{"); ok && i < len(segs) {
			if value, err := url.PathUnescape(segs[i]); err == nil {
				r.SetPathValue(strings.TrimSuffix(name, "}"), value)
			}
		}
	}
	h.ServeHTTP(w, r)
}

// cleanPath is p as http.ServeMux cleans it before routing (path.Clean,
// keeping a trailing slash): a path that differs from it is one the mux
// would redirect.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p)
	if p[len(p)-1] == '/' && np != "/" {
		np += "/"
	}
	return np
}

func (s *Server) recoverPanics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.ErrorContext(r.Context(), "handler panicked", "path", r.URL.Path, "panic", v)
				writeError(w, http.StatusInternalServerError, httpapi.Error{Code: httpapi.CodeInternal, Message: "internal error"})
			}
		}()
		next.ServeHTTP(w, r)
	})
}
