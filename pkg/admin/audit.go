package admin

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/ratelog"
	"github.com/joishi/limiter/pkg/server"
)

// maxAuditFieldBytes bounds what a caller can put into one field of an
// audit record: user ids are at most 256 bytes, pool keys 128; a longer
// one is cut.
const maxAuditFieldBytes = 512

// anonymousLogEvery bounds the log lines of refused calls without a known
// token: one per interval, the next carrying how many were left out.
const anonymousLogEvery = time.Second

// auditor writes one record per admin call to the log, the record of
// authority, and to the limiter's capped audit stream, which the page
// reads for its recent actions.
//
// A call refused for want of a known token (no actor) is only logged, and
// at most once per anonymousLogEvery: the stream is capped, so a flood of
// such calls, which anyone who reaches the port can send, would push the
// records of what operators did out of it. Only a known token can add to
// the stream.
type auditor struct {
	log       *slog.Logger
	anonymous *ratelog.Logger
	lim       *limiter.Limiter
	maxLen    int
}

// newAuditID returns a random 64-bit id in hex.
func newAuditID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}

// write logs rec and appends it to the stream; a record without an actor
// is only logged, rate-limited. The stream write outlives the request's
// context: a caller hanging up must not skip its audit.
func (a *auditor) write(ctx context.Context, rec httpapi.AuditRecord) {
	// What an operator on call looks at: a call refused for its token or
	// role, or one the limiter failed. A mistyped request (400, 404, 405,
	// 415, 422) is the caller's, as on the slot API, and stays at INFO.
	level := slog.LevelInfo
	if rec.Status >= 500 || rec.Status == http.StatusUnauthorized || rec.Status == http.StatusForbidden {
		level = slog.LevelWarn
	}
	if rec.Actor == "" {
		attrs := auditAttrs(rec)
		args := make([]any, len(attrs))
		for i, attr := range attrs {
			args[i] = attr
		}
		a.anonymous.Log(ctx, level, "admin audit", args...)
		return
	}
	a.log.LogAttrs(ctx, level, "admin audit", auditAttrs(rec)...)

	data, err := json.Marshal(rec)
	if err == nil {
		err = a.lim.AppendAudit(context.WithoutCancel(ctx), string(data), a.maxLen)
	}
	if err != nil {
		a.log.WarnContext(ctx, "admin audit record not added to the audit stream; the log line is the record", "audit_id", rec.AuditID, "err", err)
	}
}

func auditAttrs(rec httpapi.AuditRecord) []slog.Attr {
	attrs := []slog.Attr{
		slog.String("audit_id", rec.AuditID),
		slog.Time("audit_time", rec.Time),
		slog.String("actor", rec.Actor),
		slog.String("role", rec.Role),
		slog.String("action", rec.Action),
		slog.String("user_id", rec.UserID),
	}
	if rec.Pool != "" || rec.Key != "" {
		attrs = append(attrs, slog.String("pool", rec.Pool), slog.String("key", rec.Key))
	}
	attrs = append(attrs,
		slog.Any("released", nonNil(rec.Released)),
		slog.String("reason", rec.Reason),
		slog.String("remote", rec.Remote),
		slog.String("outcome", rec.Outcome),
		slog.Int("status", rec.Status),
	)
	if o := rec.Override; o != nil {
		attrs = append(attrs, slog.Group("override", slog.Int("max_concurrent_streams", o.MaxConcurrentStreams), slog.Time("expires_at", o.ExpiresAt)))
	}
	if a := rec.Asked; a != nil {
		var asked []any
		if a.MaxConcurrentStreams != nil {
			asked = append(asked, slog.Int("max_concurrent_streams", *a.MaxConcurrentStreams))
		}
		if a.ExpiresIn != nil {
			asked = append(asked, slog.Int64("expires_in", *a.ExpiresIn))
		}
		attrs = append(attrs, slog.Group("asked", asked...))
	}
	if rec.OverrideRemoved != nil {
		attrs = append(attrs, slog.Bool("override_removed", *rec.OverrideRemoved))
	}
	if rec.ForwardedFor != "" {
		attrs = append(attrs, slog.String("forwarded_for", rec.ForwardedFor))
	}
	if rec.Detail != "" {
		attrs = append(attrs, slog.String("detail", rec.Detail))
	}
	return attrs
}

func nonNil(ids []string) []string {
	if ids == nil {
		return []string{}
	}
	return ids
}

// recent returns the newest n records, newest first, each call once: an
// append retried after its answer was lost stores its record twice (see
// limiter.AppendAudit), and the copy takes none of the n places, the read
// going on past it. Errors are those of limiter.RecentAudit.
func (a *auditor) recent(ctx context.Context, n int) ([]httpapi.AuditRecord, error) {
	for count := n; ; count += n {
		entries, err := a.lim.RecentAudit(ctx, count)
		if err != nil {
			return nil, err
		}
		out := a.records(ctx, entries, n)
		if len(out) == n || len(entries) < count { // n calls, or the whole stream
			return out, nil
		}
	}
}

// records returns the records of entries, newest first, each call (audit
// id) once, n at most; an entry that cannot be read is logged and left out.
func (a *auditor) records(ctx context.Context, entries []limiter.AuditEntry, n int) []httpapi.AuditRecord {
	out := make([]httpapi.AuditRecord, 0, n)
	listed := make(map[string]bool, len(entries))
	for _, e := range entries {
		var rec httpapi.AuditRecord
		if err := json.Unmarshal([]byte(e.Record), &rec); err != nil {
			a.log.WarnContext(ctx, "skipping an unreadable audit stream entry", "entry", e.ID, "err", err)
			continue
		}
		if rec.AuditID != "" && listed[rec.AuditID] {
			continue
		}
		listed[rec.AuditID] = true
		if out = append(out, rec); len(out) == n {
			break
		}
	}
	return out
}

// normalizeReason collapses every run of whitespace (newlines included)
// into one space and trims the ends, then cleans what is left.
func normalizeReason(s string) string {
	return server.Clean(strings.Join(strings.Fields(s), " "), 4*httpapi.MaxReasonLength)
}

// checkReason returns reason with runs of whitespace collapsed and cleaned
// for the audit, with an error when it is empty, too long, or holds a
// control or format character (one Clean would replace): a reason is
// refused rather than recorded other than as sent. why ends the message
// asking for one ("say why <why>").
func checkReason(reason, why string) (string, error) {
	collapsed := strings.Join(strings.Fields(reason), " ")
	cleaned := normalizeReason(collapsed)
	switch n := utf8.RuneCountInString(collapsed); {
	case n == 0:
		return cleaned, server.BadRequest("reason is required: say why %s (it is recorded in the audit)", why)
	case n > httpapi.MaxReasonLength:
		return cleaned, server.BadRequest("reason is %d characters, the limit is %d", n, httpapi.MaxReasonLength)
	}
	if i := strings.IndexFunc(collapsed, func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) }); i >= 0 {
		r, _ := utf8.DecodeRuneInString(collapsed[i:])
		return cleaned, server.BadRequest("reason must not contain control or format characters (found %U); whitespace is allowed", r)
	}
	return cleaned, nil
}

// readAudit serves GET /v1/admin/audit: the most recent records, newest
// first.
func (a *Admin) readAudit(_ http.ResponseWriter, r *http.Request, _ *httpapi.AuditRecord) (any, error) {
	limit := httpapi.DefaultAuditLimit
	if given := r.URL.Query()["limit"]; len(given) > 1 {
		return nil, server.BadRequest("limit is given %d times; give it once, a whole number from 1 to %d", len(given), httpapi.MaxAuditLimit)
	}
	if q := r.URL.Query().Get("limit"); q != "" {
		n, err := strconv.Atoi(q)
		if err != nil || n < 1 || n > httpapi.MaxAuditLimit {
			return nil, server.BadRequest("limit must be a whole number from 1 to %d", httpapi.MaxAuditLimit)
		}
		limit = n
	}
	records, err := a.audit.recent(r.Context(), limit)
	if err != nil {
		return nil, err
	}
	return httpapi.AuditResponse{Records: records}, nil
}
