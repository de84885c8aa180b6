package linearize

import (
	"testing"
	"time"
)

// qop builds an operation of user "u" with limit 1 over [call, ret] (ms).
func qop(kind QueueKind, stream string, call, ret int64) QueueOp {
	ms := int64(time.Millisecond)
	return QueueOp{User: "u", Limit: 1, Kind: kind, Stream: stream, Call: call * ms, Return: ret * ms}
}

// wait is a waiting acquire of stream over [call, ret] that ended with
// kind (Grant or Leave): its join and its end.
func wait(stream string, end QueueKind, call, ret int64) []QueueOp {
	return []QueueOp{qop(Join, stream, call, ret), qop(end, stream, call, ret)}
}

func observe(queue []string, call, ret int64) QueueOp {
	o := qop(Observe, "", call, ret)
	o.Queue = queue
	return o
}

func history(parts ...any) []QueueOp {
	var out []QueueOp
	for _, p := range parts {
		switch v := p.(type) {
		case QueueOp:
			out = append(out, v)
		case []QueueOp:
			out = append(out, v...)
		}
	}
	return out
}

func TestCheckQueue(t *testing.T) {
	tests := []struct {
		name    string
		history []QueueOp
		want    bool
	}{
		{"waiters served in the order observed", history(
			wait("h", Grant, 0, 1),
			wait("a", Grant, 2, 30), observe([]string{"a"}, 3, 4),
			wait("b", Grant, 5, 50), observe([]string{"a", "b"}, 6, 7),
			qop(Free, "h", 10, 11), qop(Free, "a", 31, 32),
		), true},
		{"the second waiter served before the first", history(
			wait("h", Grant, 0, 1),
			wait("a", Grant, 2, 50), observe([]string{"a"}, 3, 4),
			wait("b", Grant, 5, 30), observe([]string{"a", "b"}, 6, 7),
			qop(Free, "h", 10, 11), qop(Free, "b", 31, 32),
		), false},
		{"a waiter that timed out lets the next one in", history(
			wait("h", Grant, 0, 1),
			wait("a", Leave, 2, 20), observe([]string{"a"}, 3, 4),
			wait("b", Grant, 5, 40), observe([]string{"a", "b"}, 6, 7), observe([]string{"b"}, 21, 22),
			qop(Free, "h", 30, 31),
		), true},
		{"a grant with no slot free", history(
			wait("h", Grant, 0, 1),
			wait("a", Grant, 2, 3),
		), false},
		{"the queue observed in another order than it was joined", history(
			wait("h", Grant, 0, 1),
			wait("a", Leave, 2, 40), observe([]string{"a"}, 3, 4),
			wait("b", Leave, 5, 40), observe([]string{"b", "a"}, 6, 7),
		), false},
		{"an acquire granted at once while others wait", history(
			wait("h", Grant, 0, 1),
			wait("a", Leave, 2, 40), observe([]string{"a"}, 3, 4),
			qop(Free, "h", 5, 6),
			wait("c", Grant, 7, 8), observe([]string{"a"}, 9, 10),
		), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := CheckQueue(tc.history, Options{Timeout: 10 * time.Second})
			if v.OK() != tc.want || len(v.Undecided) > 0 {
				t.Errorf("CheckQueue: ok %v (illegal %v, undecided %v), want ok %v", v.OK(), v.Illegal, v.Undecided, tc.want)
			}
		})
	}
}
