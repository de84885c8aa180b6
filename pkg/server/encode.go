package server

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/joishi/limiter/pkg/httpapi"
)

// The answers of the slot API are built by append encoders into pooled
// buffers: byte for byte what encoding/json's Encoder writes for them
// (TestAppendJSON holds them to it), without its reflection and
// allocations. Other answers (the admin API's) go through WriteJSON.

// answer is a pooled buffer an answer's body is built in.
type answer struct{ b []byte }

var answers = sync.Pool{New: func() any { return &answer{b: make([]byte, 0, 512)} }}

// maxPooledAnswer bounds the buffers kept for reuse (a batch's answer can
// be a hundred kilobytes).
const maxPooledAnswer = 256 << 10

func newAnswer() *answer {
	a := answers.Get().(*answer)
	a.b = a.b[:0]
	return a
}

// Header values every JSON answer carries. The slices are shared by all
// answers instead of made per answer: net/http only reads them, and an
// Add to one of these keys appends to a full slice, so it copies.
var (
	contentTypeJSON = []string{"application/json"}
	cacheNoStore    = []string{"no-store"}
)

// send answers status with the body built in a, and recycles a.
func (a *answer) send(w http.ResponseWriter, status int) {
	h := w.Header()
	h["Content-Type"] = contentTypeJSON
	h["Cache-Control"] = cacheNoStore
	w.WriteHeader(status)
	// As json.Encoder ends every value.
	a.b = append(a.b, '\n')
	_, _ = w.Write(a.b)
	a.recycle()
}

// recycle keeps a for a later answer, unless its buffer grew too large.
func (a *answer) recycle() {
	if cap(a.b) <= maxPooledAnswer {
		answers.Put(a)
	}
}

// WriteJSON answers body, any value, with encoding/json, as the admin API
// (pkg/admin) answers: not cacheable, like every answer.
func WriteJSON(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// unavailableRetryAfter is the Retry-After, in seconds, of every 503.
// Each call is judged anew under the per-call deadline (250ms by default),
// so a second is long enough not to pile retries onto a struggling Redis
// and short enough not to keep a caller waiting once it is back.
const unavailableRetryAfter = "1"

func writeError(w http.ResponseWriter, status int, e httpapi.Error) {
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", unavailableRetryAfter)
	}
	a := newAnswer()
	a.b = appendErrorResponse(a.b, httpapi.ErrorResponse{Error: e})
	a.send(w, status)
}

func appendAcquireResponse(b []byte, v httpapi.AcquireResponse) []byte {
	b = appendBool(append(b, `{"granted":`...), v.Granted)
	b = appendString(append(b, `,"stream_id":`...), v.StreamID)
	b = strconv.AppendInt(append(b, `,"used":`...), int64(v.Used), 10)
	b = strconv.AppendInt(append(b, `,"limit":`...), int64(v.Limit), 10)
	b = appendTime(append(b, `,"expires_at":`...), v.ExpiresAt)
	b = strconv.AppendInt(append(b, `,"ttl_ms":`...), v.TTLMs, 10)
	b = strconv.AppendInt(append(b, `,"heartbeat_interval_ms":`...), v.HeartbeatIntervalMs, 10)
	b = strconv.AppendInt(append(b, `,"pruned":`...), int64(v.Pruned), 10)
	b = appendBool(append(b, `,"degraded":`...), v.Degraded)
	if v.WaitedMs != 0 {
		b = strconv.AppendInt(append(b, `,"waited_ms":`...), v.WaitedMs, 10)
	}
	if len(v.Pools) > 0 {
		b = append(b, `,"pools":[`...)
		for i, p := range v.Pools {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendPoolGrant(b, p)
		}
		b = append(b, ']')
	}
	if v.WouldRefuse != "" {
		b = appendString(append(b, `,"would_refuse":`...), v.WouldRefuse)
	}
	if v.WouldRefuseBy != nil {
		b = appendPoolGrant(append(b, `,"would_refuse_by":`...), *v.WouldRefuseBy)
	}
	return append(b, '}')
}

func appendPoolGrant(b []byte, p httpapi.PoolGrant) []byte {
	b = appendString(append(b, `{"pool":`...), p.Pool)
	b = appendString(append(b, `,"key":`...), p.Key)
	b = strconv.AppendInt(append(b, `,"used":`...), int64(p.Used), 10)
	b = strconv.AppendInt(append(b, `,"limit":`...), int64(p.Limit), 10)
	return append(b, '}')
}

func appendHeartbeatResponse(b []byte, v httpapi.HeartbeatResponse) []byte {
	b = appendBool(append(b, `{"alive":`...), v.Alive)
	b = appendTime(append(b, `,"expires_at":`...), v.ExpiresAt)
	b = appendBool(append(b, `,"degraded":`...), v.Degraded)
	return append(b, '}')
}

// appendHeartbeatResult writes one result of a HeartbeatsResponse; times
// is the batch's, reused from one result to the next.
func appendHeartbeatResult(b []byte, r httpapi.HeartbeatResult, times *timeAppender) []byte {
	b = appendString(append(b, `{"stream_id":`...), r.StreamID)
	b = appendBool(append(b, `,"alive":`...), r.Alive)
	if r.ExpiresAt != nil {
		b = times.append(append(b, `,"expires_at":`...), *r.ExpiresAt)
	}
	b = appendBool(append(b, `,"degraded":`...), r.Degraded)
	if r.Error != nil {
		b = appendError(append(b, `,"error":`...), *r.Error)
	}
	return append(b, '}')
}

func appendReleaseResponse(b []byte, v httpapi.ReleaseResponse) []byte {
	b = appendBool(append(b, `{"released":`...), v.Released)
	b = appendBool(append(b, `,"degraded":`...), v.Degraded)
	return append(b, '}')
}

func appendTiersResponse(b []byte, v httpapi.TiersResponse) []byte {
	b = append(b, `{"tiers":`...)
	if v.Tiers == nil {
		return append(b, `null}`...)
	}
	b = append(b, '[')
	for i, t := range v.Tiers {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(append(b, `{"plan":`...), t.Plan)
		b = strconv.AppendInt(append(b, `,"max_concurrent_streams":`...), int64(t.MaxConcurrentStreams), 10)
		b = strconv.AppendInt(append(b, `,"slot_ttl_ms":`...), t.SlotTTLMs, 10)
		b = strconv.AppendInt(append(b, `,"heartbeat_interval_ms":`...), t.HeartbeatIntervalMs, 10)
		b = appendString(append(b, `,"failure_mode":`...), t.FailureMode)
		b = strconv.AppendInt(append(b, `,"max_wait_ms":`...), t.MaxWaitMs, 10)
		b = appendBool(append(b, `,"enforce":`...), t.Enforce)
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

func appendErrorResponse(b []byte, v httpapi.ErrorResponse) []byte {
	b = appendError(append(b, `{"error":`...), v.Error)
	return append(b, '}')
}

func appendError(b []byte, e httpapi.Error) []byte {
	b = appendString(append(b, `{"code":`...), e.Code)
	b = appendString(append(b, `,"message":`...), e.Message)
	if e.Used != nil {
		b = strconv.AppendInt(append(b, `,"used":`...), int64(*e.Used), 10)
	}
	if e.Limit != nil {
		b = strconv.AppendInt(append(b, `,"limit":`...), int64(*e.Limit), 10)
	}
	if e.RetryAfterMs != nil {
		b = strconv.AppendInt(append(b, `,"retry_after_ms":`...), *e.RetryAfterMs, 10)
	}
	if e.StreamID != "" {
		b = appendString(append(b, `,"stream_id":`...), e.StreamID)
	}
	if e.WaitedMs != nil {
		b = strconv.AppendInt(append(b, `,"waited_ms":`...), *e.WaitedMs, 10)
	}
	if e.Pool != "" {
		b = appendString(append(b, `,"pool":`...), e.Pool)
	}
	if e.Key != "" {
		b = appendString(append(b, `,"key":`...), e.Key)
	}
	return append(b, '}')
}

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, "true"...)
	}
	return append(b, "false"...)
}

// appendTime writes t as time.Time's MarshalJSON does: RFC 3339 with
// nanoseconds, trailing zeros dropped.
func appendTime(b []byte, t time.Time) []byte {
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

// timeAppender writes times as appendTime does, faster for the UTC times
// of one minute in a row, as a batch's expiry times mostly are: it keeps
// the "2006-01-02T15:04:" of the latest minute it wrote.
type timeAppender struct {
	minute int64 // Unix minute of prefix, when set
	set    bool
	prefix [len("2006-01-02T15:04:")]byte
}

// maxFastUnix is the first second of year 10000: RFC 3339 has four-digit
// years only.
const maxFastUnix = 253402300800

func (c *timeAppender) append(b []byte, t time.Time) []byte {
	sec := t.Unix()
	if t.Location() != time.UTC || sec < 0 || sec >= maxFastUnix {
		return appendTime(b, t)
	}
	if m := sec / 60; !c.set || m != c.minute {
		c.minute, c.set = m, true
		t.AppendFormat(c.prefix[:0], "2006-01-02T15:04:")
	}
	b = append(append(b, '"'), c.prefix[:]...)
	s := sec % 60
	b = append(b, byte('0'+s/10), byte('0'+s%10))
	if ns := t.Nanosecond(); ns != 0 {
		// As RFC3339Nano: up to nine digits, trailing zeros dropped.
		frac := [10]byte{'.'}
		for i := 9; i > 0; i-- {
			frac[i] = byte('0' + ns%10)
			ns /= 10
		}
		n := len(frac)
		for frac[n-1] == '0' {
			n--
		}
		b = append(b, frac[:n]...)
	}
	return append(b, 'Z', '"')
}

// jsonSafe reports the ASCII bytes a JSON string holds as they are, as
// encoding/json writes strings with HTML escaping (its default): not the
// control characters, '"', '\\', '<', '>' and '&'.
var jsonSafe = func() (safe [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		safe[c] = true
	}
	for _, c := range `"\<>&` {
		safe[c] = false
	}
	return safe
}()

// appendString writes s as a JSON string as encoding/json does: invalid
// UTF-8 as U+FFFD, the HTML characters and U+2028 and U+2029 escaped.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if jsonSafe[c] {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
