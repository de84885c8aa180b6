package linearize

import (
	"fmt"
	"testing"
	"time"
)

// op builds a call of user "u" with limit 2 over [call, ret] (ms).
func op(kind Kind, stream string, result Result, call, ret int64) Op {
	ms := int64(time.Millisecond)
	return Op{User: "u", Limit: 2, Kind: kind, Stream: stream, Result: result, Call: call * ms, Return: ret * ms}
}

func fragile(o Op) Op {
	o.Fragile = true
	return o
}

// ttl gives o's plan a slot TTL of 100ms.
func ttl(o Op) Op {
	o.TTL = int64(100 * time.Millisecond)
	return o
}

func TestCheck(t *testing.T) {
	tests := []struct {
		name    string
		history []Op
		want    bool
	}{
		{"grants up to the limit, then a denial", []Op{
			op(Acquire, "a", Yes, 0, 1), op(Acquire, "b", Yes, 2, 3), op(Acquire, "c", No, 4, 5),
		}, true},
		{"one grant too many, one after the other", []Op{
			op(Acquire, "a", Yes, 0, 1), op(Acquire, "b", Yes, 2, 3), op(Acquire, "c", Yes, 4, 5),
		}, false},
		{"a grant concurrent with a release may take the freed slot", []Op{
			op(Acquire, "a", Yes, 0, 1), op(Acquire, "b", Yes, 2, 3),
			op(Release, "a", Yes, 4, 8), op(Acquire, "c", Yes, 5, 9),
		}, true},
		{"a denial with a slot free", []Op{
			op(Acquire, "a", Yes, 0, 1), op(Acquire, "b", No, 2, 3),
		}, false},
		{"acquiring a held stream again is granted at the limit", []Op{
			op(Acquire, "a", Yes, 0, 1), op(Acquire, "b", Yes, 2, 3), op(Acquire, "a", Yes, 4, 5),
		}, true},
		{"a released slot is gone", []Op{
			op(Acquire, "a", Yes, 0, 1), op(Release, "a", Yes, 2, 3), op(Heartbeat, "a", No, 4, 5), op(Release, "a", No, 6, 7),
		}, true},
		{"a held slot reported lost", []Op{
			op(Acquire, "a", Yes, 0, 1), op(Heartbeat, "a", No, 2, 3),
		}, false},
		{"a fragile slot may vanish in a failover", []Op{
			fragile(op(Acquire, "a", Yes, 0, 1)), op(Acquire, "b", Yes, 2, 3),
			op(Acquire, "c", Yes, 4, 5), op(Heartbeat, "a", No, 6, 7),
		}, true},
		{"a fragile slot heartbeated after the window is durable", []Op{
			fragile(op(Acquire, "a", Yes, 0, 1)), op(Heartbeat, "a", Yes, 2, 3), op(Heartbeat, "a", No, 4, 5),
		}, false},
		{"a degraded grant that never reached Redis", []Op{
			op(Acquire, "a", Yes, 0, 1), op(Acquire, "b", Unknown, 2, 3), op(Heartbeat, "b", No, 4, 5),
			op(Acquire, "c", Yes, 6, 7),
		}, true},
		{"a timed-out acquire that did take effect, late", []Op{
			op(Acquire, "a", Unknown, 0, 1), op(Acquire, "b", Yes, 2, 3), op(Acquire, "c", No, 300, 301),
			op(Heartbeat, "a", Yes, 400, 401),
		}, true},
		{"a timed-out release that did free the slot", []Op{
			op(Acquire, "a", Yes, 0, 1), op(Acquire, "b", Yes, 2, 3), op(Release, "a", Unknown, 4, 5),
			op(Acquire, "c", Yes, 6, 7),
		}, true},
		{"a slot not heartbeated may expire after its TTL", []Op{
			ttl(op(Acquire, "a", Yes, 0, 1)), ttl(op(Acquire, "b", Yes, 2, 3)), ttl(op(Acquire, "c", Yes, 150, 151)),
		}, true},
		{"no slot expires before its TTL", []Op{
			ttl(op(Acquire, "a", Yes, 0, 1)), ttl(op(Acquire, "b", Yes, 2, 3)), ttl(op(Acquire, "c", Yes, 50, 51)),
		}, false},
		{"a heartbeat pushes the expiry back", []Op{
			ttl(op(Acquire, "a", Yes, 0, 1)), ttl(op(Acquire, "b", Yes, 2, 3)),
			ttl(op(Heartbeat, "a", Yes, 80, 81)), ttl(op(Heartbeat, "b", Yes, 80, 81)), ttl(op(Acquire, "c", Yes, 150, 151)),
		}, false},
		{"a lone acquire without an answer may hold the slot that explains a denial", []Op{
			op(Acquire, "a", Yes, 0, 1), op(Acquire, "x", Unknown, 2, 3), op(Acquire, "b", No, 4, 5),
		}, true},
		{"lone acquires without an answer free no slot", []Op{
			op(Acquire, "a", Yes, 0, 1), op(Acquire, "x", Unknown, 2, 3), op(Acquire, "b", Yes, 4, 5),
			op(Acquire, "y", Unknown, 6, 7), op(Acquire, "c", Yes, 8, 9),
		}, false},
		{"a lone slot counts against the cap until it may have expired", []Op{
			ttl(op(Acquire, "a", Yes, 0, 1)), ttl(op(Acquire, "x", Unknown, 2, 3)), ttl(op(Heartbeat, "a", Yes, 90, 91)),
			ttl(op(Acquire, "b", No, 95, 96)), ttl(op(Acquire, "c", Yes, 150, 151)),
		}, true},
		{"lone slots that may not have expired yet are still held", []Op{
			ttl(op(Acquire, "x", Unknown, 0, 1)), ttl(op(Acquire, "y", Unknown, 50, 51)), ttl(op(Acquire, "a", Yes, 60, 61)),
			ttl(op(Acquire, "b", No, 70, 71)), ttl(op(Acquire, "c", Yes, 120, 121)), ttl(op(Acquire, "d", No, 125, 126)),
		}, true},
		{"a call without an answer does not explain two extra grants", []Op{
			op(Acquire, "a", Yes, 0, 1), op(Acquire, "b", Yes, 2, 3), op(Release, "a", Unknown, 4, 5),
			op(Acquire, "c", Yes, 6, 7), op(Acquire, "d", Yes, 8, 9),
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := Check(tt.history, Options{})
			if v.OK() != tt.want {
				t.Errorf("Check = %+v; want OK %v", v, tt.want)
			}
		})
	}
}

// TestCheckPartitionsByUser: each user has a cap of their own; one user's
// over-admission is named, the other's history passes.
func TestCheckPartitionsByUser(t *testing.T) {
	a := op(Acquire, "a", Yes, 0, 1)
	b := op(Acquire, "b", Yes, 2, 3)
	c := op(Acquire, "c", Yes, 4, 5)
	other := []Op{a, b}
	for i := range other {
		other[i].User = "v"
	}
	v := Check(append([]Op{a, b, c}, other...), Options{})
	if v.Users != 2 || len(v.Illegal) != 1 || v.Illegal[0] != "u" {
		t.Errorf("Check = %+v; want 2 users, u illegal", v)
	}
}

// TestCheckDecidesABurstOfCallsWithoutAnAnswer: in a failover, a plan that
// refuses while its shard is down answers a burst of acquires without an
// answer from Redis, each a stream of its own that no other call names.
// Each may have taken a slot; when some must have (the denials below,
// after both held streams were lost), the search may not try every
// subset of them. Before slots of such calls were anonymous, a history
// like this one, recorded in a failover test, ran the check out of its
// time.
func TestCheckDecidesABurstOfCallsWithoutAnAnswer(t *testing.T) {
	const lone = 150
	withTTL := func(o Op) Op {
		o.TTL = int64(5 * time.Second)
		return o
	}
	history := []Op{
		fragile(op(Acquire, "a", Yes, 0, 1)), fragile(op(Acquire, "b", Yes, 2, 3)),
		op(Heartbeat, "a", Yes, 7, 8), op(Heartbeat, "b", Yes, 7, 8),
	}
	for i := range int64(lone) {
		call := 10 + 60*i
		o := op(Acquire, fmt.Sprintf("x%d", i), Unknown, call, call+1)
		if i%3 != 0 {
			o = fragile(o)
		}
		history = append(history, o)
		switch {
		case i == 20:
			history = append(history, op(Release, "a", Unknown, call+5, call+6), op(Release, "b", Unknown, call+7, call+8))
		case i == 40:
			history = append(history, op(Heartbeat, "a", No, call+5, call+6), op(Heartbeat, "b", No, call+7, call+8))
		case i > 40 && i%10 == 5:
			history = append(history, op(Acquire, fmt.Sprintf("d%d", i), No, call+30, call+31))
		}
	}
	for i := range history {
		history[i] = withTTL(history[i])
	}
	v := Check(history, Options{Timeout: 10 * time.Second})
	if !v.OK() {
		t.Fatalf("Check = %+v; want a decided, linearizable history", v)
	}
	if v.Widened != 1 {
		t.Errorf("Check widened %d users; want 1 (the denials need calls without an answer)", v.Widened)
	}

	// The same history with a third grant while "a" and "b" are held is
	// decided illegal, not left undecided.
	history = append(history, withTTL(op(Acquire, "e", Yes, 5, 6)))
	if v := Check(history, Options{Timeout: 10 * time.Second}); len(v.Illegal) != 1 {
		t.Errorf("with a third grant while two are held: Check = %+v; want u illegal", v)
	}
}
