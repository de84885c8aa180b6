package lua

import (
	"encoding/base64"
	"encoding/binary"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// Record is what a slot's record holds besides what the acquire script
// writes itself. The whole record reads
//
//	<ttl ms>;started=<Redis ms>;caller=<name>;again=<n>;left=<i>.<j>...;by=<n>@<token>.<m>@<token>...;plan=<plan>;pools=<pool>=<key>,...;prio=<0-9>;user=<n>:<user id>;label=<label>
//
// the TTL first (heartbeats parse only its leading digits), each field
// after a ';', an empty one left out, in this order. The scripts write
// again (the acquires that extended the slot: see Share), left (the
// shares given up) and by (the requests that took the shares held, the
// latest first, at most eight: see Token) themselves, and read them at
// that place only; a new slot's request writes by=0@<token>. Caller names are
// [A-Za-z0-9._@-], plans [A-Za-z0-9._-], pool names and keys hold neither
// ';' nor ',', so none of them holds a ';'. A user id may hold any
// character but whitespace and braces, so it goes with its length in
// bytes; the label may hold any character keys.ValidateLabel accepts, so
// it comes last and runs to the end of the record.
type Record struct {
	// Caller names who took the slot: the API caller of the tokens file or
	// the client certificate. Empty: not recorded (an open API). It comes
	// first, where the scripts read it (lib_holder.lua).
	Caller string
	// Plan is the plan the slot was granted under.
	Plan string
	// Pools are the pool keys the stream holds a membership of, on a
	// user's slot: "model=gpt-4o,org=acme" (see EncodePools). Heartbeat
	// and release take the stream's memberships from here, never from
	// what a caller resends. Empty: none.
	Pools string
	// Priority is the stream's plan's priority (tiers.Tier.Priority),
	// which orders its ticket while it waits (DESIGN §17). 0: not
	// recorded.
	Priority int
	// User is the holder's user id, on a pool key's membership. Empty on
	// a user's own slot (its key names the user).
	User string
	// Label is what the caller says the stream is (keys.ValidateLabel).
	// Empty: none.
	Label string
	// Token names the request that acquires ([A-Za-z0-9_-], see
	// NewToken): several requests (a client's retries) may hold a stream
	// at once, and an acquire asked again after its reply was lost is
	// answered as its first try was (the share it took, a shadow scope's
	// would_refuse), not counted as another request's extension; so too
	// for an id the limiter made. Empty: none. Only the scripts read it
	// back (ParseRecord leaves it out).
	Token string
}

// NewToken returns a request's Token: 64 random bits, so that two
// requests of a stream share one by chance once in 2^64.
func NewToken() string {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], rand.Uint64())
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// Field names of a record.
const (
	fieldStarted  = "started"
	fieldCaller   = "caller"
	fieldPlan     = "plan"
	fieldPools    = "pools"
	fieldPriority = "prio"
	fieldUser     = "user"
	fieldLabel    = "label"
	fieldAgain    = "again"
	fieldBy       = "by" // the scripts' shares; ParseRecord reads only the over-limit mark
	fieldOrder    = "order"
)

// encode returns the fields after the TTL and start, each with its leading
// ';', the label last.
func (r Record) encode() string {
	if r == (Record{}) {
		return ""
	}
	var b strings.Builder
	// Room for every field (names, separators and numbers within the 64),
	// so that the record is one allocation.
	b.Grow(len(r.Caller) + len(r.Token) + len(r.Plan) + len(r.Pools) + len(r.User) + len(r.Label) + 64)
	field := func(name string) {
		b.WriteByte(';')
		b.WriteString(name)
		b.WriteByte('=')
	}
	if r.Caller != "" {
		field(fieldCaller)
		b.WriteString(r.Caller)
	}
	if r.Token != "" {
		field(fieldBy)
		b.WriteString("0@")
		b.WriteString(r.Token)
	}
	if r.Plan != "" {
		field(fieldPlan)
		b.WriteString(r.Plan)
	}
	if r.Pools != "" {
		field(fieldPools)
		b.WriteString(r.Pools)
	}
	if r.Priority != 0 {
		field(fieldPriority)
		b.WriteString(strconv.Itoa(r.Priority))
	}
	if r.User != "" {
		field(fieldUser)
		b.WriteString(strconv.Itoa(len(r.User)))
		b.WriteByte(':')
		b.WriteString(r.User)
	}
	if r.Label != "" {
		field(fieldLabel)
		b.WriteString(r.Label)
	}
	return b.String()
}

// PoolKey is one pool key a stream holds a membership of.
type PoolKey struct{ Pool, Key string }

// EncodePools returns the Pools field of a record holding memberships.
func EncodePools(memberships []PoolKey) string {
	n := 0
	for _, m := range memberships {
		n += len(m.Pool) + len(m.Key) + 2
	}
	var b strings.Builder
	b.Grow(n)
	for i, m := range memberships {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(m.Pool)
		b.WriteByte('=')
		b.WriteString(m.Key)
	}
	return b.String()
}

// DecodePools reads a record's Pools field.
func DecodePools(s string) []PoolKey {
	if s == "" {
		return nil
	}
	var out []PoolKey
	for item := range strings.SplitSeq(s, ",") {
		if pool, key, ok := strings.Cut(item, "="); ok {
			out = append(out, PoolKey{pool, key})
		}
	}
	return out
}

// StoredRecord is a slot's record as read back.
type StoredRecord struct {
	// TTL is the slot's own TTL; 0 when none is recorded.
	TTL time.Duration
	// StartedAtMs is when the slot was taken (Redis ms); 0 when not
	// recorded (taken by a version that recorded no start).
	StartedAtMs int64
	// Again counts the acquires of the stream that extended the slot
	// after the one that took it (acquire.lua's again).
	Again int
	// Order is a ticket's: the order its release serves a queue in
	// (lib_tickets.lua's queueOrder, see ServeOrder); 0 for a ticket of
	// the previous release, which names none.
	Order int
	// OverLimit: shadow mode let the slot (or membership) in over its
	// limit when it was taken (lib_holder.lua's wasOverLimit: share 0's
	// request is marked '!'), the verdict its extensions answer.
	OverLimit bool
	Record
}

// ParseRecord reads a record the scripts wrote; fields it does not know
// are skipped, so a record written by a later version still reads.
func ParseRecord(s string) StoredRecord {
	var out StoredRecord
	if s == "" { // a call's answer that holds none, on every grant of a new slot
		return out
	}
	head, rest, _ := strings.Cut(s, ";")
	if ttl, err := strconv.ParseInt(head, 10, 64); err == nil && ttl > 0 {
		out.TTL = time.Duration(ttl) * time.Millisecond
	}
	for rest != "" {
		name, after, _ := strings.Cut(rest, "=")
		var value string
		switch name {
		case fieldLabel: // runs to the end
			out.Label, rest = after, ""
			continue
		case fieldUser: // <n>:<n bytes>
			digits, id, ok := strings.Cut(after, ":")
			n, err := strconv.Atoi(digits)
			if !ok || err != nil || n < 0 || n > len(id) {
				return out
			}
			out.User = id[:n]
			rest = strings.TrimPrefix(id[n:], ";")
			continue
		}
		value, rest, _ = strings.Cut(after, ";")
		switch name {
		case fieldStarted:
			out.StartedAtMs, _ = strconv.ParseInt(value, 10, 64)
		case fieldCaller:
			out.Caller = value
		case fieldPlan:
			out.Plan = value
		case fieldPools:
			out.Pools = value
		case fieldPriority:
			out.Priority, _ = strconv.Atoi(value)
		case fieldAgain:
			out.Again, _ = strconv.Atoi(value)
		case fieldOrder:
			out.Order, _ = strconv.Atoi(value)
		case fieldBy: // <share>@<token>[!], joined by '.'
			for entry := range strings.SplitSeq(value, ".") {
				if share, _, _ := strings.Cut(entry, "@"); share == "0" {
					out.OverLimit = strings.HasSuffix(entry, "!")
				}
			}
		}
	}
	return out
}
