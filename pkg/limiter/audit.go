package limiter

import (
	"context"
	"errors"
	"strconv"

	"github.com/redis/rueidis"
)

// auditField is the field of an audit stream entry that holds the record.
const auditField = "record"

// AuditEntry is one entry of the admin audit stream.
type AuditEntry struct {
	// ID is the stream entry id Redis gave it (<unix ms>-<seq>).
	ID string
	// Record is the record as appended.
	Record string
}

// AppendAudit adds record to the capped stream of admin audit records
// (keys.Schema.Audit()), trimmed to about maxLen entries: never fewer.
// The limiter does not read record; its caller decides the format.
// Errors: ErrUnavailable, ErrRedisRefused, or ctx's error.
//
// An append that meets an outage is tried once more: a record matters more
// than its latency, and the call that failed is often the one that met a
// connection being redialled. The retry may store a record twice (when the
// first append ran and only its answer was lost); records carry their own
// audit id, so a reader can tell.
func (l *Limiter) AppendAudit(ctx context.Context, record string, maxLen int) error {
	key := l.keys.Audit()
	appendOnce := func() error {
		return l.do(ctx, "append_audit", func(ctx context.Context, c rueidis.Client) error {
			// MAXLEN ~ trims whole macro nodes only: cheap, and the stream
			// stays at least maxLen long.
			cmd := c.B().Xadd().Key(key).Maxlen().Almost().Threshold(strconv.Itoa(maxLen)).
				Id("*").FieldValue().FieldValue(auditField, record).Build()
			return c.Do(ctx, cmd).Error()
		})
	}
	err := appendOnce()
	if errors.Is(err, ErrUnavailable) {
		err = appendOnce()
	}
	return err
}

// RecentAudit returns up to n entries of the audit stream, newest first.
// Errors: ErrUnavailable, ErrRedisRefused, or ctx's error.
func (l *Limiter) RecentAudit(ctx context.Context, n int) ([]AuditEntry, error) {
	key := l.keys.Audit()
	var entries []rueidis.XRangeEntry
	err := l.do(ctx, "recent_audit", func(ctx context.Context, c rueidis.Client) (err error) {
		entries, err = c.Do(ctx, c.B().Xrevrange().Key(key).End("+").Start("-").Count(int64(n)).Build()).AsXRange()
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make([]AuditEntry, len(entries))
	for i, e := range entries {
		out[i] = AuditEntry{ID: e.ID, Record: e.FieldValues[auditField]}
	}
	return out, nil
}
