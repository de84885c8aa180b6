package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/ratelog"
	"github.com/joishi/limiter/pkg/server/adminui"
)

// Outcomes of admin authentication, mapped to 401 and 403 by apiError.
var (
	errUnauthorized = errors.New("unauthorized")
	errForbidden    = errors.New("forbidden")
)

// authError is errUnauthorized or errForbidden with a message for the
// caller; the status already says which.
type authError struct {
	kind error
	msg  string
}

func (e *authError) Error() string { return e.msg }
func (e *authError) Unwrap() error { return e.kind }

// AdminOptions configure the admin API and page.
type AdminOptions struct {
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

// Admin serves the support staff's API (/v1/admin/...) and page (/admin/):
// inspect a user's slots, release them all, set or remove a temporary
// override of the user's limit, read the recent actions. Every
// call, refused ones included, leaves one audit record: in the log and the
// audit stream, except a call without a known token, which is only logged
// (rate-limited; see auditor).
type Admin struct {
	lim    *limiter.Limiter
	tokens *tokensFile[tokenSet]
	audit  *auditor
	poll   time.Duration
	page   fs.FS // the admin page's files
}

// NewAdmin reads the tokens file; an error names the file and the line.
func NewAdmin(lim *limiter.Limiter, opts AdminOptions) (*Admin, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.TokensPollInterval <= 0 {
		opts.TokensPollInterval = time.Second
	}
	if opts.AuditMaxLen <= 0 {
		opts.AuditMaxLen = 10000
	}
	tokens, err := loadAdminTokens(opts.TokensFile, opts.Logger)
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
func (a *Admin) Tokens() int { return len(a.tokens.current().tokens) }

// WatchTokens re-reads the tokens file when it changes, until ctx ends. A
// removed file revokes every token; a file that cannot be read or parsed
// is logged and the tokens read before stay in force.
func (a *Admin) WatchTokens(ctx context.Context) { a.tokens.watch(ctx, a.poll) }

// Routes adds the admin API and page to mux (Server.AdminHandler does).
func (a *Admin) Routes(mux *http.ServeMux) {
	a.route(mux, httpapi.PathAdminUserSlots, adminRoute{method: http.MethodGet, action: httpapi.ActionListSlots, role: httpapi.RoleViewer, do: a.listSlots})
	a.route(mux, httpapi.PathAdminUserRelease, adminRoute{method: http.MethodPost, action: httpapi.ActionReleaseAll, role: httpapi.RoleOperator,
		do: a.releaseAll, reason: releaseReason})
	a.route(mux, httpapi.PathAdminUserOverride,
		adminRoute{method: http.MethodPost, action: httpapi.ActionSetOverride, role: httpapi.RoleOperator, do: a.setOverride, reason: overrideReason},
		adminRoute{method: http.MethodDelete, action: httpapi.ActionRemoveOverride, role: httpapi.RoleOperator, do: a.removeOverride, reason: removalReason})
	a.route(mux, httpapi.PathAdminAudit, adminRoute{method: http.MethodGet, action: httpapi.ActionReadAudit, role: httpapi.RoleViewer, do: a.readAudit})
	a.servePage(mux)
}

// adminRoute is one admin call: action served for method to callers of
// role (operator includes viewer).
type adminRoute struct {
	method, action, role string
	do                   adminHandler
	// reason, for a call that changes something, reads the reason of its
	// body: a known caller refused for its role is recorded with what it
	// tried to do, and why.
	reason func(http.ResponseWriter, *http.Request) (string, error)
}

// route serves each of routes on path, and answers any other method on
// path 405, audited as the first route's action like every call.
func (a *Admin) route(mux *http.ServeMux, path string, routes ...adminRoute) {
	methods := make([]string, len(routes))
	for i, rt := range routes {
		mux.HandleFunc(rt.method+" "+path, a.call(rt))
		methods[i] = rt.method
	}
	allow := strings.Join(methods, ", ")
	mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
		rec := a.newRecord(w, r, routes[0].action)
		// Name a known caller in the record; a 405 needs no token, so a
		// missing or unknown one is no reason to answer otherwise.
		if token, ok := a.identify(r); ok {
			rec.Actor, rec.Role = token.name, token.role
			w.Header().Set(httpapi.HeaderAdminRole, token.role)
		}
		w.Header().Set("Allow", allow)
		a.refuse(w, r, rec, http.StatusMethodNotAllowed, httpapi.Error{
			Code:    httpapi.CodeMethodNotAllowed,
			Message: r.Method + " is not allowed: " + path + " accepts " + strings.Join(methods, " or ") + " only",
		})
	})
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
		case err == nil:
			body, err = rt.do(w, r, &rec)
		case errors.Is(err, errForbidden) && rt.reason != nil:
			// Record what a known caller tried to change, and why.
			rec.Reason, _ = rt.reason(w, r)
		}
		if err != nil {
			status, e := apiError(err)
			if status >= 500 {
				a.audit.log.WarnContext(r.Context(), "admin call failed", "audit_id", rec.AuditID, "err", err)
			}
			a.refuse(w, r, rec, status, e)
			return
		}
		rec.Outcome, rec.Status = httpapi.OutcomeOK, http.StatusOK
		a.audit.write(r.Context(), rec)
		writeJSON(w, http.StatusOK, body)
	}
}

// newRecord starts the audit record of a call and names it in the answer.
func (a *Admin) newRecord(w http.ResponseWriter, r *http.Request, action string) httpapi.AuditRecord {
	rec := httpapi.AuditRecord{
		AuditID:      newAuditID(),
		Time:         time.Now().UTC(),
		Action:       action,
		UserID:       clean(r.PathValue("user_id"), maxAuditFieldBytes),
		Remote:       clean(r.RemoteAddr, maxAuditFieldBytes),
		ForwardedFor: clean(r.Header.Get("X-Forwarded-For"), maxAuditFieldBytes),
	}
	w.Header().Set(httpapi.HeaderAuditID, rec.AuditID)
	return rec
}

// refuse writes the audit record of a refused or failed call, then answers e.
func (a *Admin) refuse(w http.ResponseWriter, r *http.Request, rec httpapi.AuditRecord, status int, e httpapi.Error) {
	rec.Outcome, rec.Status, rec.Detail = e.Code, status, clean(e.Message, maxAuditFieldBytes)
	a.audit.write(r.Context(), rec)
	writeError(w, status, e)
}

// identify returns the token the caller presents, if it is known.
func (a *Admin) identify(r *http.Request) (adminToken, bool) {
	presented, ok := bearerToken(r)
	if !ok {
		return adminToken{}, false
	}
	return a.tokens.current().lookup(presented)
}

// authorize checks the bearer token and the role it carries.
func (a *Admin) authorize(w http.ResponseWriter, r *http.Request, role string, rec *httpapi.AuditRecord) error {
	if _, ok := bearerToken(r); !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="limiter admin"`)
		return &authError{errUnauthorized, `no admin token: send it as "Authorization: Bearer <token>"`}
	}
	token, ok := a.identify(r)
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="limiter admin", error="invalid_token"`)
		return &authError{errUnauthorized, "unknown token"}
	}
	rec.Actor, rec.Role = token.name, token.role
	w.Header().Set(httpapi.HeaderAdminRole, token.role)
	if role == httpapi.RoleOperator && token.role != httpapi.RoleOperator {
		return &authError{errForbidden, fmt.Sprintf("role %s may not %s; it needs role %s", token.role, strings.ReplaceAll(rec.Action, "_", " "), httpapi.RoleOperator)}
	}
	return nil
}

// bearerToken returns the token of an "Authorization: Bearer <token>"
// header (scheme case-insensitive, RFC 9110).
func bearerToken(r *http.Request) (string, bool) { return bearerValue(r.Header.Get("Authorization")) }

// bearerValue returns the token of a "Bearer <token>" value.
func bearerValue(value string) (string, bool) {
	scheme, token, ok := strings.Cut(value, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

func (a *Admin) listSlots(_ http.ResponseWriter, r *http.Request, _ *httpapi.AuditRecord) (any, error) {
	slots, err := a.lim.Slots(r.Context(), r.PathValue("user_id"))
	if err != nil {
		return nil, err
	}
	out := httpapi.AdminSlotsResponse{UserID: slots.UserID, Used: slots.Used, Slots: make([]httpapi.AdminSlot, len(slots.Slots)),
		Queue: make([]httpapi.AdminTicket, len(slots.Queue))}
	for i, s := range slots.Slots {
		slot := httpapi.AdminSlot{StreamID: s.StreamID, ExpiresAt: s.ExpiresAt, TTLMs: s.TTL.Milliseconds(),
			Caller: s.Caller, Plan: s.Plan, Label: s.Label}
		if !s.StartedAt.IsZero() {
			started, age := s.StartedAt, s.Age.Milliseconds()
			slot.StartedAt, slot.AgeMs = &started, &age
		}
		out.Slots[i] = slot
	}
	if o := slots.Override; o != nil {
		view := adminOverride(*o)
		out.Override = &view
	}
	for i, t := range slots.Queue {
		out.Queue[i] = httpapi.AdminTicket{StreamID: t.StreamID, Place: t.Place, WaitingSince: t.Since, WaitedMs: t.Waited.Milliseconds(), ExpiresAt: t.ExpiresAt}
	}
	return out, nil
}

func (a *Admin) releaseAll(w http.ResponseWriter, r *http.Request, rec *httpapi.AuditRecord) (any, error) {
	reason, err := releaseReason(w, r)
	rec.Reason = reason
	if err != nil {
		return nil, err
	}
	ids, err := a.lim.ReleaseAll(r.Context(), r.PathValue("user_id"), rec.AuditID)
	if err != nil {
		return nil, err
	}
	rec.Released = nonNil(ids)
	return httpapi.AdminReleaseResponse{Released: rec.Released, AuditID: rec.AuditID}, nil
}

// releaseReason decodes a release's body and returns its reason (see
// checkReason).
func releaseReason(w http.ResponseWriter, r *http.Request) (string, error) {
	var req httpapi.AdminReleaseRequest
	err := decode(w, r, httpapi.MaxBodyBytes, &req)
	reason, rerr := checkReason(req.Reason, "every slot of this user is released")
	return reason, cmp.Or(err, rerr)
}

// checkReason returns reason with runs of whitespace collapsed and cleaned
// for the audit, with an error when it is empty or too long; why ends the
// message asking for one ("say why <why>").
func checkReason(reason, why string) (string, error) {
	collapsed := strings.Join(strings.Fields(reason), " ")
	cleaned := normalizeReason(collapsed)
	switch n := len([]rune(collapsed)); {
	case n == 0:
		return cleaned, badRequest("reason is required: say why %s (it is recorded in the audit)", why)
	case n > httpapi.MaxReasonLength:
		return cleaned, badRequest("reason is %d characters, the limit is %d", n, httpapi.MaxReasonLength)
	}
	return cleaned, nil
}

func (a *Admin) readAudit(_ http.ResponseWriter, r *http.Request, _ *httpapi.AuditRecord) (any, error) {
	limit := httpapi.DefaultAuditLimit
	if q := r.URL.Query().Get("limit"); q != "" {
		n, err := strconv.Atoi(q)
		if err != nil || n < 1 || n > httpapi.MaxAuditLimit {
			return nil, badRequest("limit must be a whole number from 1 to %d", httpapi.MaxAuditLimit)
		}
		limit = n
	}
	records, err := a.audit.recent(r.Context(), limit)
	if err != nil {
		return nil, err
	}
	return httpapi.AuditResponse{Records: records}, nil
}
