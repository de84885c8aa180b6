// Package admin serves the support staff's API (/v1/admin/...) and page
// (/admin/) on the admin listener (admin.addr): who holds a user's slots
// or a pool key's memberships, release a user's slots, set or remove a
// temporary override of a user's limit or a pool key's cap, read the
// recent actions. Every call, refused ones included, leaves one audit
// record. It reads bodies, answers and maps errors as the slot API does,
// through pkg/server; pkg/server serves it (server.Options.Admin).
package admin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/joishi/limiter/pkg/admin/adminui"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/ratelog"
	"github.com/joishi/limiter/pkg/server"
)

// Options configure the admin API and page.
type Options struct {
	// TokensFile holds one "name role token" per line (role viewer or
	// operator; '#' comments and blank lines allowed). Required.
	TokensFile string
	// TokensPollInterval is how often WatchTokens checks the file for
	// changes. Default 1s.
	TokensPollInterval time.Duration
	// AuditMaxLen caps the limiter's audit stream, in entries (trimmed
	// approximately: never below it). Default 10000.
	AuditMaxLen int
	// Logger receives one "admin audit" record per admin call and token
	// reloads. Default slog.Default().
	Logger *slog.Logger
}

// Admin serves the admin API and page. Every call, refused ones included,
// leaves one audit record: in the log and the audit stream, except a call
// without a known token, which is only logged (rate-limited; see
// auditor).
type Admin struct {
	lim    *limiter.Limiter
	tokens *server.AdminTokens
	audit  *auditor
	poll   time.Duration
	page   fs.FS // the admin page's files
}

// New reads the tokens file; an error names the file and the line.
func New(lim *limiter.Limiter, opts Options) (*Admin, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.TokensPollInterval <= 0 {
		opts.TokensPollInterval = time.Second
	}
	if opts.AuditMaxLen <= 0 {
		opts.AuditMaxLen = 10000
	}
	tokens, err := server.LoadAdminTokens(opts.TokensFile, opts.Logger)
	if err != nil {
		return nil, err
	}
	page, err := adminui.Files()
	if err != nil {
		return nil, fmt.Errorf("admin page: %w", err)
	}
	return &Admin{
		page:   page,
		lim:    lim,
		tokens: tokens,
		audit:  &auditor{log: opts.Logger, anonymous: ratelog.New(opts.Logger, anonymousLogEvery), lim: lim, maxLen: opts.AuditMaxLen},
		poll:   opts.TokensPollInterval,
	}, nil
}

// Tokens returns how many tokens are in force.
func (a *Admin) Tokens() int { return a.tokens.Len() }

// WatchTokens re-reads the tokens file when it changes, until ctx ends. A
// removed file revokes every token; a file that cannot be read or parsed
// is logged and the tokens read before stay in force.
func (a *Admin) WatchTokens(ctx context.Context) { a.tokens.Watch(ctx, a.poll) }

// Routes adds the admin API and page to mux (server.Server.AdminHandler
// does).
func (a *Admin) Routes(mux *http.ServeMux) {
	a.route(mux, httpapi.PathAdminUserSlots, adminRoute{method: http.MethodGet, action: httpapi.ActionListSlots, role: httpapi.RoleViewer, do: a.listSlots})
	a.route(mux, httpapi.PathAdminUserRelease, adminRoute{method: http.MethodPost, action: httpapi.ActionReleaseAll, role: httpapi.RoleOperator,
		do: a.releaseAll, audited: reasonOf(releaseReason)})
	a.routeOverride(mux, httpapi.PathAdminUserOverride, a.userScope())
	a.route(mux, httpapi.PathAdminPoolKey, adminRoute{method: http.MethodGet, action: httpapi.ActionListSlots, role: httpapi.RoleViewer, do: a.listPoolKey})
	a.routeOverride(mux, httpapi.PathAdminPoolKeyOverride, a.poolKeyScope())
	a.route(mux, httpapi.PathAdminAudit, adminRoute{method: http.MethodGet, action: httpapi.ActionReadAudit, role: httpapi.RoleViewer, do: a.readAudit})
	a.servePage(mux)
}

// adminRoute is one admin call: action served for method to callers of
// role (operator includes viewer).
type adminRoute struct {
	method, action, role string
	do                   adminHandler
	// audited, for a call that changes something, reads its body into the
	// call's record (its reason, and what an override asked for): a known
	// caller refused for its role is recorded with what it tried to do,
	// and why.
	audited func(http.ResponseWriter, *http.Request, *httpapi.AuditRecord)
}

// reasonOf is the audited of a call whose body the record keeps the
// reason of, which read returns.
func reasonOf(read func(http.ResponseWriter, *http.Request) (string, error)) func(http.ResponseWriter, *http.Request, *httpapi.AuditRecord) {
	return func(w http.ResponseWriter, r *http.Request, rec *httpapi.AuditRecord) {
		rec.Reason, _ = read(w, r)
	}
}

// route serves each of routes on path, and answers any other method on
// path 405 (HEAD included), audited as the first route's action like
// every call.
func (a *Admin) route(mux *http.ServeMux, path string, routes ...adminRoute) {
	methods := make([]string, len(routes))
	for i, rt := range routes {
		mux.HandleFunc(rt.method+" "+path, a.call(rt))
		methods[i] = rt.method
	}
	allow := strings.Join(methods, ", ")
	notAllowed := func(w http.ResponseWriter, r *http.Request) {
		rec := a.newRecord(w, r, routes[0].action)
		// Name a known caller in the record; a 405 needs no token, so a
		// missing or unknown one is no reason to answer otherwise.
		if token, ok := a.identify(r); ok {
			rec.Actor, rec.Role = token.Name, token.Role
			w.Header().Set(httpapi.HeaderAdminRole, token.Role)
		}
		w.Header().Set("Allow", allow)
		a.refuse(w, r, rec, http.StatusMethodNotAllowed, httpapi.Error{
			Code:    httpapi.CodeMethodNotAllowed,
			Message: r.Method + " is not allowed: " + path + " accepts " + strings.Join(methods, " or ") + " only",
		})
	}
	mux.HandleFunc(path, notAllowed)
	if slices.Contains(methods, http.MethodGet) {
		// A GET pattern serves HEAD too: a HEAD would read Redis and be
		// audited as the call it is not.
		mux.HandleFunc(http.MethodHead+" "+path, notAllowed)
	}
}

// adminHandler does the work of one admin call: it fills rec (released
// ids) and returns the 200 body.
type adminHandler func(w http.ResponseWriter, r *http.Request, rec *httpapi.AuditRecord) (any, error)

// call authenticates the caller, requires rt's role, runs rt's handler,
// answers, and writes the one audit record of the call before answering,
// so a caller who sees the answer can find the record.
func (a *Admin) call(rt adminRoute) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		rec := a.newRecord(w, r, rt.action)
		var body any
		err := a.authorize(w, r, rt.role, &rec)
		switch {
		case err == nil && rt.audited != nil:
			// A call that changes something runs whole once it starts, its
			// caller there or not (bounded by the per-call deadlines): one
			// cut short by a hang-up could land in Redis and skip the rest
			// (a released stream's pool memberships, the overrides' index),
			// and its record would say outcome_unknown of what took effect.
			body, err = rt.do(w, r.WithContext(context.WithoutCancel(r.Context())), &rec)
		case err == nil:
			body, err = rt.do(w, r, &rec)
		case errors.Is(err, server.ErrAdminForbidden) && rt.audited != nil:
			// Record what a known caller tried to change, and why.
			rt.audited(w, r, &rec)
		}
		if err != nil {
			status, e := server.MapError(err)
			if status >= 500 {
				a.audit.log.WarnContext(r.Context(), "admin call failed", "audit_id", rec.AuditID, "err", err)
			}
			a.refuse(w, r, rec, status, e)
			return
		}
		rec.Outcome, rec.Status = httpapi.OutcomeOK, http.StatusOK
		a.audit.write(r.Context(), rec)
		server.WriteJSON(w, http.StatusOK, body)
	}
}

// newRecord starts the audit record of a call and names it in the answer.
func (a *Admin) newRecord(w http.ResponseWriter, r *http.Request, action string) httpapi.AuditRecord {
	rec := httpapi.AuditRecord{
		AuditID:      newAuditID(),
		Time:         time.Now().UTC(),
		Action:       action,
		UserID:       server.CleanID(r.PathValue("user_id"), maxAuditFieldBytes),
		Pool:         server.Clean(r.PathValue("pool"), maxAuditFieldBytes),
		Key:          server.Clean(r.PathValue("key"), maxAuditFieldBytes),
		Remote:       server.Clean(r.RemoteAddr, maxAuditFieldBytes),
		ForwardedFor: server.Clean(r.Header.Get("X-Forwarded-For"), maxAuditFieldBytes),
	}
	w.Header().Set(httpapi.HeaderAuditID, rec.AuditID)
	return rec
}

// refuse writes the audit record of a refused or failed call, then answers e.
func (a *Admin) refuse(w http.ResponseWriter, r *http.Request, rec httpapi.AuditRecord, status int, e httpapi.Error) {
	rec.Outcome, rec.Status, rec.Detail = e.Code, status, server.Clean(e.Message, maxAuditFieldBytes)
	a.audit.write(r.Context(), rec)
	server.WriteError(w, status, e)
}

// identify returns the token the caller presents, if it is known.
func (a *Admin) identify(r *http.Request) (server.AdminToken, bool) {
	presented, ok := server.BearerToken(r)
	if !ok {
		return server.AdminToken{}, false
	}
	return a.tokens.Lookup(presented)
}

// authorize checks the bearer token and the role it carries.
func (a *Admin) authorize(w http.ResponseWriter, r *http.Request, role string, rec *httpapi.AuditRecord) error {
	if _, ok := server.BearerToken(r); !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="limiter admin"`)
		if n := len(r.Header.Values("Authorization")); n > 1 {
			return server.AdminRefusal(server.ErrAdminUnauthorized, fmt.Sprintf("the request carries %d Authorization headers; send one", n))
		}
		return server.AdminRefusal(server.ErrAdminUnauthorized, `no admin token: send it as "Authorization: Bearer <token>"`)
	}
	token, ok := a.identify(r)
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="limiter admin", error="invalid_token"`)
		return server.AdminRefusal(server.ErrAdminUnauthorized, "unknown token")
	}
	rec.Actor, rec.Role = token.Name, token.Role
	w.Header().Set(httpapi.HeaderAdminRole, token.Role)
	if role == httpapi.RoleOperator && token.Role != httpapi.RoleOperator {
		return server.AdminRefusal(server.ErrAdminForbidden, fmt.Sprintf("role %s may not %s; it needs role %s", token.Role, strings.ReplaceAll(rec.Action, "_", " "), httpapi.RoleOperator))
	}
	return nil
}
