package lua

import (
	"strconv"
	"strings"
	"time"
)

// Record is what a slot's record holds besides what the acquire script
// writes itself. The whole record reads
//
//	<ttl ms>;started=<Redis ms>;caller=<name>;plan=<plan>;label=<label>
//
// the TTL first (heartbeats parse only its leading digits), each field
// after a ';', an empty one left out. Caller names are [A-Za-z0-9._@-] and
// plans [A-Za-z0-9._-], so neither holds a ';'; the label may hold any
// character keys.ValidateLabel accepts, so it comes last and runs to the
// end of the record.
type Record struct {
	// Caller names who took the slot: the API caller of the tokens file or
	// the client certificate. Empty: not recorded (an open API).
	Caller string
	// Plan is the plan the slot was granted under.
	Plan string
	// Label is what the caller says the stream is (keys.ValidateLabel).
	// Empty: none.
	Label string
}

// Field names of a record.
const (
	fieldStarted = "started"
	fieldCaller  = "caller"
	fieldPlan    = "plan"
	fieldLabel   = "label"
)

// encode returns the fields after the TTL and start, each with its leading
// ';', the label last.
func (r Record) encode() string {
	if r == (Record{}) {
		return ""
	}
	var b strings.Builder
	for _, f := range [...]struct{ name, value string }{{fieldCaller, r.Caller}, {fieldPlan, r.Plan}, {fieldLabel, r.Label}} {
		if f.value != "" {
			b.WriteString(";" + f.name + "=" + f.value)
		}
	}
	return b.String()
}

// StoredRecord is a slot's record as read back.
type StoredRecord struct {
	// TTL is the slot's own TTL; 0 when none is recorded.
	TTL time.Duration
	// StartedAtMs is when the slot was taken (Redis ms); 0 when not
	// recorded (taken by a version that recorded no start).
	StartedAtMs int64
	Record
}

// ParseRecord reads a record the scripts wrote; fields it does not know
// are skipped, so a record written by a later version still reads.
func ParseRecord(s string) StoredRecord {
	var out StoredRecord
	head, label, _ := strings.Cut(s, ";"+fieldLabel+"=")
	out.Label = label
	fields := strings.Split(head, ";")
	if ttl, err := strconv.ParseInt(fields[0], 10, 64); err == nil && ttl > 0 {
		out.TTL = time.Duration(ttl) * time.Millisecond
	}
	for _, f := range fields[1:] {
		name, value, _ := strings.Cut(f, "=")
		switch name {
		case fieldStarted:
			out.StartedAtMs, _ = strconv.ParseInt(value, 10, 64)
		case fieldCaller:
			out.Caller = value
		case fieldPlan:
			out.Plan = value
		}
	}
	return out
}
