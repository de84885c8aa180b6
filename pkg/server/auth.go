package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Outcomes of the slot API's authentication, mapped to 401 and 403 by
// apiError. The ext_proc server answers them too (Callers.Authenticate,
// Caller.Allow).
var (
	// ErrUnauthenticated: no caller credentials, or ones no caller of the
	// API tokens file holds.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrPlanNotAllowed: the caller may not use the plan.
	ErrPlanNotAllowed = errors.New("plan not allowed")
)

// attrCaller names the caller on the request's span. Never a metric label:
// callers come and go with the tokens file.
const attrCaller = attribute.Key("limiter.caller")

// CallersOptions configure LoadCallers. Zero values take the documented
// defaults.
type CallersOptions struct {
	// TokensFile holds one "name token plans" per line (token "-" for a
	// caller with a client certificate only; plans "*" or a comma list;
	// '#' comments and blank lines allowed). Required.
	TokensFile string
	// PollInterval is how often Watch checks the file for changes.
	// Default 1s.
	PollInterval time.Duration
	// Logger receives reloads and unusable versions of the file. Default
	// slog.Default().
	Logger *slog.Logger
}

// Callers are who may call the slot API (/v1/slots/*, /v1/tiers): the API
// tokens file, re-read when it changes. A caller presents its token as a
// bearer token, or a client certificate (mutual TLS, TLSFiles.ClientCAFile)
// whose name (certName) names a line of the file. A certificate, when
// presented, decides: a token beside it is not looked at.
type Callers struct {
	file *tokensFile[callerSet]
	poll time.Duration
}

// LoadCallers reads the API tokens file; an error names the file and the
// line, never a token.
func LoadCallers(opts CallersOptions) (*Callers, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = time.Second
	}
	file, err := loadTokensFile(opts.TokensFile, "API tokens", parseCallers, (*callerSet).len, opts.Logger)
	if err != nil {
		return nil, err
	}
	return &Callers{file: file, poll: opts.PollInterval}, nil
}

// Len returns how many callers are in force.
func (c *Callers) Len() int { return c.file.current().len() }

// Watch re-reads the tokens file when it changes, until ctx ends. A
// removed file, or one rewritten to hold no caller, revokes every caller
// and is logged at WARN; a file that cannot be read or parsed is logged at
// ERROR and the callers read before stay in force.
func (c *Callers) Watch(ctx context.Context) { c.file.watch(ctx, c.poll) }

// identify returns the caller of r: by its client certificate if it
// presented one (verified in the handshake), else by its bearer token.
func (c *Callers) identify(r *http.Request) (caller, error) {
	who, err := c.Authenticate(r.TLS, r.Header.Values("Authorization")...)
	return who.c, err
}

// Caller is a caller Callers.Authenticate found: a line of the API tokens
// file.
type Caller struct{ c caller }

// Name is the caller's name (field 1 of its line), for logs and spans.
func (c Caller) Name() string { return c.c.name }

// Allow returns nil when the caller may acquire and heartbeat slots of
// plan, else an error wrapping ErrPlanNotAllowed that names the caller and
// the plan.
func (c Caller) Allow(plan string) error {
	if c.c.allows(plan) {
		return nil
	}
	return &authError{ErrPlanNotAllowed, fmt.Sprintf("caller %q may not use plan %q", c.c.name, plan)}
}

// Authenticate returns the caller of a connection or a call: by the client
// certificate of state when one was presented and verified in the
// handshake, else by the bearer token of authorization (the Authorization
// header's or gRPC metadata's value, "Bearer <token>"; several are
// refused). Errors wrap ErrUnauthenticated and never quote a token.
func (c *Callers) Authenticate(state *tls.ConnectionState, authorization ...string) (Caller, error) {
	return c.file.current().authenticate(state, authorization...)
}

// authenticate is Callers.Authenticate against the callers of set.
func (set *callerSet) authenticate(state *tls.ConnectionState, authorization ...string) (Caller, error) {
	if state != nil && len(state.VerifiedChains) > 0 {
		name, err := certName(state.PeerCertificates[0])
		if err != nil {
			return Caller{}, err
		}
		if who, ok := set.byName(name); ok {
			return Caller{who}, nil
		}
		return Caller{}, &authError{ErrUnauthenticated, fmt.Sprintf("the client certificate's name %q is not a caller of the API tokens file", name)}
	}
	if len(authorization) > 1 {
		return Caller{}, &authError{ErrUnauthenticated, ambiguous(len(authorization))}
	}
	presented, ok := "", false
	if len(authorization) == 1 {
		presented, ok = bearerValue(authorization[0])
	}
	if !ok {
		return Caller{}, &authError{ErrUnauthenticated, `no caller token: send it as "Authorization: Bearer <token>"`}
	}
	who, ok := set.byToken(presented)
	if !ok {
		return Caller{}, &authError{ErrUnauthenticated, "unknown token"}
	}
	return Caller{who}, nil
}

// certName is the caller name of a client certificate: its first DNS
// name; its subject's common name only when it has no SAN at all. As in
// crypto/tls since Go 1.15, a certificate with SANs is named by them
// alone, so a CA that lets requesters choose the common name but checks
// the SANs issues no certificate of another caller. One whose SANs hold no
// DNS name (a URI, IP or email only) names none: an error wrapping
// ErrUnauthenticated that lists them.
func certName(cert *x509.Certificate) (string, error) {
	if len(cert.DNSNames) > 0 {
		return cert.DNSNames[0], nil
	}
	if !hasSANs(cert) {
		return cert.Subject.CommonName, nil
	}
	return "", &authError{ErrUnauthenticated, fmt.Sprintf("the client certificate has no DNS name to name its caller, only %s; its common name is not used when it has SANs (give it a DNS name of a caller of the API tokens file)", otherSANs(cert))}
}

// hasSANs reports whether cert has a subject alternative name extension,
// of any kind (crypto/x509 parses DNS, email, IP and URI names only).
func hasSANs(cert *x509.Certificate) bool {
	for _, ext := range cert.Extensions {
		if ext.Id.Equal(asn1.ObjectIdentifier{2, 5, 29, 17}) {
			return true
		}
	}
	return false
}

// maxListedSANs bounds how many SANs certName's error lists.
const maxListedSANs = 4

// otherSANs lists the SANs of a certificate without a DNS name, for
// certName's error.
func otherSANs(cert *x509.Certificate) string {
	var sans []string
	for _, u := range cert.URIs {
		sans = append(sans, fmt.Sprintf("URI %q", u.String()))
	}
	for _, ip := range cert.IPAddresses {
		sans = append(sans, "IP "+ip.String())
	}
	for _, email := range cert.EmailAddresses {
		sans = append(sans, fmt.Sprintf("email %q", email))
	}
	switch {
	case len(sans) == 0:
		return "SANs of kinds the limiter does not read"
	case len(sans) > maxListedSANs:
		return fmt.Sprintf("SANs %s and %d more", strings.Join(sans[:maxListedSANs], ", "), len(sans)-maxListedSANs)
	}
	return "SANs " + strings.Join(sans, ", ")
}

// authenticate runs next for the request's caller, and refuses a request
// without one 401 unauthenticated. Without Options.Callers every request
// is the open caller, allowed every plan.
func (s *Server) authenticate(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		who := openCaller
		if s.opts.Callers != nil {
			var err error
			if who, err = s.opts.Callers.identify(r); err != nil {
				challenge(w, r)
				s.fail(w, r, err)
				return
			}
			if span := trace.SpanFromContext(r.Context()); span.IsRecording() {
				span.SetAttributes(attrCaller.String(who.name))
			}
		}
		info := infoOf(r.Context())
		if info == nil { // not served through logAccess
			ctx := &infoContext{Context: r.Context()}
			r, info = r.WithContext(ctx), &ctx.info
		}
		info.who = who
		next(w, r)
	}
}

// challenge sets the WWW-Authenticate header of r's 401: its bearer
// token, when it presented one, is invalid.
func challenge(w http.ResponseWriter, r *http.Request) {
	header := `Bearer realm="limiter"`
	if _, presented := bearerToken(r); presented {
		header += `, error="invalid_token"`
	}
	w.Header().Set("WWW-Authenticate", header)
}

// callerOf returns the caller authenticate found for the request; none
// (allowed no plan) outside authenticate.
func callerOf(r *http.Request) caller {
	if info := infoOf(r.Context()); info != nil {
		return info.who
	}
	return caller{}
}

// allowPlan refuses plan 403 plan_not_allowed unless the request's caller
// may use it. The message names the plan and the caller, never a token.
func allowPlan(r *http.Request, plan string) error {
	return Caller{callerOf(r)}.Allow(plan)
}

// heartbeatBatch heartbeats the slots whose plans the caller may use and
// answers the others plan_not_allowed, each result in its slot's place.
func (s *Server) heartbeatBatch(r *http.Request, slots []httpapi.HeartbeatRequest) ([]limiter.HeartbeatResult, []error) {
	who := Caller{callerOf(r)}
	reqs := make([]limiter.HeartbeatRequest, 0, len(slots))
	for _, slot := range slots {
		if who.c.allows(slot.Plan) {
			reqs = append(reqs, limiter.HeartbeatRequest{UserID: slot.UserID, Plan: slot.Plan, StreamID: slot.StreamID, Caller: who.c.name})
		}
	}
	if len(reqs) == len(slots) { // the caller may use every plan of the batch
		return s.lim.HeartbeatBatch(r.Context(), reqs)
	}
	results := make([]limiter.HeartbeatResult, len(slots))
	errs := make([]error, len(slots))
	var got []limiter.HeartbeatResult
	var gotErrs []error
	if len(reqs) > 0 {
		got, gotErrs = s.lim.HeartbeatBatch(r.Context(), reqs)
	}
	j := 0 // the next of got
	for i, slot := range slots {
		if err := who.Allow(slot.Plan); err != nil {
			results[i], errs[i] = limiter.HeartbeatResult{StreamID: slot.StreamID}, err
			continue
		}
		results[i], errs[i] = got[j], gotErrs[j]
		j++
	}
	return results, errs
}
