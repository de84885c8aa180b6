package linearize

import (
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// The queue model: the order in which one user's waiting acquires are
// granted. A waiting acquire is two operations over the same interval
// (its HTTP request): it joins the queue, then it is granted, or it
// leaves (its wait ran out, its caller went away). Porcupine may place
// each anywhere in the interval, the join first; what pins the order is
// the observations of the queue itself, read from Redis while the
// history runs: the queue must be exactly as observed, and a slot may go
// only to an acquire among the first (limit - held) of it. So an acquire
// granted while one observed ahead of it still waited, with no slot to
// spare for both, is a violation.

// QueueKind is what a queue operation did.
type QueueKind int

// Kinds of queue operations.
const (
	// Join: an acquire took its place at the tail (Call, Return of its
	// request).
	Join QueueKind = iota
	// Grant: the acquire, at the head, was granted a slot.
	Grant
	// Leave: the acquire left the queue without a slot (timed out).
	Leave
	// Free: a slot the acquire held was released.
	Free
	// Observe: the queue was read; Queue holds it, first served first.
	Observe
	// Take: an acquire was granted at once, without waiting (pool
	// histories: see PoolOp).
	Take
)

func (k QueueKind) String() string {
	return [...]string{"join", "grant", "leave", "free", "observe", "take"}[k]
}

// QueueOp is one operation of a queue history.
type QueueOp struct {
	User  string
	Limit int
	Kind  QueueKind
	// Stream is the acquire's stream id (all kinds but Observe).
	Stream string
	// Queue is what an Observe read, first served first.
	Queue []string
	// Call and Return bound the operation, in nanoseconds on one clock.
	Call, Return int64
}

func (o QueueOp) String() string {
	if o.Kind == Observe {
		return fmt.Sprintf("observe [%s] [%d, %d]", strings.Join(o.Queue, " "), o.Call, o.Return)
	}
	return fmt.Sprintf("%s %s [%d, %d]", o.Kind, o.Stream, o.Call, o.Return)
}

// queueState is the model's state: the queue, in order, and the held
// slots, sorted; encoded "q1 q2|h1 h2" so that states compare with ==.
type queueState struct {
	queue []string
	held  []string
}

func (s queueState) encode() string {
	return strings.Join(s.queue, " ") + "|" + strings.Join(s.held, " ")
}

func decodeQueue(state string) queueState {
	q, h, _ := strings.Cut(state, "|")
	return queueState{queue: strings.Fields(q), held: strings.Fields(h)}
}

// step returns the state after op, and whether op could happen in s.
func (s queueState) step(op QueueOp) (queueState, bool) {
	at := slices.Index(s.queue, op.Stream)
	switch op.Kind {
	case Join:
		if at >= 0 || slices.Contains(s.held, op.Stream) {
			return s, false
		}
		return queueState{queue: append(slices.Clone(s.queue), op.Stream), held: s.held}, true
	case Grant:
		if at < 0 || at >= op.Limit-len(s.held) {
			return s, false
		}
		held := append(slices.Clone(s.held), op.Stream)
		sort.Strings(held)
		return queueState{queue: slices.Delete(slices.Clone(s.queue), at, at+1), held: held}, true
	case Leave:
		if at < 0 {
			return s, false
		}
		return queueState{queue: slices.Delete(slices.Clone(s.queue), at, at+1), held: s.held}, true
	case Free:
		i := slices.Index(s.held, op.Stream)
		if i < 0 {
			return s, false
		}
		return queueState{queue: s.queue, held: slices.Delete(slices.Clone(s.held), i, i+1)}, true
	case Observe:
		return s, slices.Equal(s.queue, op.Queue)
	}
	return s, false
}

var queueModel = porcupine.Model{
	Init: func() any { return "|" },
	Step: func(state, input, _ any) (bool, any) {
		next, ok := decodeQueue(state.(string)).step(input.(QueueOp))
		return ok, next.encode()
	},
	Equal: func(a, b any) bool { return a == b },
	Hash: func(state any) uint64 {
		h := fnv.New64a()
		h.Write([]byte(state.(string)))
		return h.Sum64()
	},
	DescribeOperation: func(input, _ any) string { return input.(QueueOp).String() },
}

// CheckQueue checks each user's queue history against the model: slots
// go to the head of the queue, in order. opts.Timeout bounds the search
// (default 30s); UnknownWithin does not apply (every operation of a queue
// history was answered).
func CheckQueue(history []QueueOp, opts Options) Verdict {
	if opts.Timeout == 0 {
		opts.Timeout = 30 * time.Second
	}
	byUser := map[string][]porcupine.Operation{}
	var users []string
	for _, op := range history {
		if _, ok := byUser[op.User]; !ok {
			users = append(users, op.User)
		}
		byUser[op.User] = append(byUser[op.User], porcupine.Operation{Input: op, Call: op.Call, Return: op.Return})
	}
	sort.Strings(users)
	v := Verdict{Users: len(users), Ops: len(history)}
	deadline := time.Now().Add(opts.Timeout)
	for _, user := range users {
		left := max(time.Until(deadline), time.Nanosecond) // porcupine reads 0 as none
		switch porcupine.CheckOperationsTimeout(queueModel, byUser[user], left) {
		case porcupine.Illegal:
			v.Illegal = append(v.Illegal, user)
		case porcupine.Unknown:
			v.Undecided = append(v.Undecided, user)
		}
	}
	return v
}
