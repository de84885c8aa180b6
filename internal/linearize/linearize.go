// Package linearize checks recorded histories of acquire, heartbeat and
// release calls against the limiter's promise for one user: at most limit
// live slots, a slot granted only while fewer are held (or when it is
// already held), a release frees it, a heartbeat finds it exactly while it
// is held. It uses porcupine, one partition per user.
//
// Three kinds of uncertainty are modelled:
//
//   - A slot may expire: it may vanish from any call that returned at
//     least its TTL after the call of the grant or heartbeat that last
//     refreshed it (Redis stamps it somewhere inside that call). Expiry is
//     never required, only allowed, so a history checks the cap, not the
//     timeliness of expiry.
//   - A call without an answer from Redis (degraded, 503, no response) may
//     or may not have taken effect, at any moment from its call until
//     Options.UnknownWithin after it: a command already sent runs when
//     Redis reads it, even after the limiter stopped waiting.
//   - A slot granted by a call marked Fragile (one that ran before the end
//     of a declared fault window such as a failover, which may lose
//     acknowledged writes) may vanish at any moment without a release.
//     Slots granted or heartbeated by calls that are not Fragile may not.
package linearize

import (
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Kind is what a call asked for.
type Kind int

// Kinds of calls.
const (
	Acquire Kind = iota
	Heartbeat
	Release
)

func (k Kind) String() string { return [...]string{"acquire", "heartbeat", "release"}[k] }

// Result is what the call answered.
type Result int

// Results of calls.
const (
	// Yes: granted (acquire), alive (heartbeat), released true (release).
	Yes Result = iota
	// No: 429 stream_limit_reached, 410 slot_lost, released false.
	No
	// Unknown: no answer from Redis (degraded, 503, transport error).
	Unknown
)

func (r Result) String() string { return [...]string{"yes", "no", "unknown"}[r] }

// Op is one call of a history.
type Op struct {
	User  string
	Limit int
	// TTL is the plan's slot TTL in nanoseconds; 0: slots never expire.
	TTL    int64
	Kind   Kind
	Stream string
	Result Result
	// Call and Return bound the call, in nanoseconds on one clock.
	Call, Return int64
	// Fragile marks a call that ran before the end of a fault window that
	// may lose acknowledged writes: a slot it granted may vanish.
	Fragile bool
	// lone marks an acquire without an answer whose stream no other call
	// names: a slot it may have granted is anonymous (see slot).
	lone bool
}

func (o Op) String() string {
	frag := ""
	if o.Fragile {
		frag = " fragile"
	}
	return fmt.Sprintf("%s %s -> %s [%d, %d]%s", o.Kind, o.Stream, o.Result, o.Call, o.Return, frag)
}

// Options tune Check.
type Options struct {
	// UnknownWithin bounds how long after its call a call without an
	// answer from Redis may still take effect. Default 1s.
	UnknownWithin time.Duration
	// Timeout bounds the whole search; users not decided by then are
	// reported Undecided. Default 30s.
	Timeout time.Duration
}

// Verdict is the outcome of Check.
type Verdict struct {
	// Users and Ops count what was checked.
	Users, Ops int
	// Illegal lists the users whose histories are not linearizable, and
	// Undecided those whose search timed out.
	Illegal, Undecided []string
	// Widened counts users whose histories needed their calls without an
	// answer (see Check) to be linearizable.
	Widened int
}

// OK reports whether every user's history is linearizable.
func (v Verdict) OK() bool { return len(v.Illegal) == 0 && len(v.Undecided) == 0 }

// Check checks each user's history. It first reads calls without an
// answer from Redis as having had no effect (the strictest reading), except
// those whose stream some answered call shows was granted; only a user
// whose history fails that is checked again with every such call allowed
// to take effect or not. The first pass keeps the search small; the second
// decides.
func Check(history []Op, opts Options) Verdict {
	if opts.UnknownWithin == 0 {
		opts.UnknownWithin = time.Second
	}
	if opts.Timeout == 0 {
		opts.Timeout = 30 * time.Second
	}
	byUser := map[string][]Op{}
	var users []string
	named := map[[2]string]int{}
	for _, op := range history {
		named[[2]string{op.User, op.Stream}]++
	}
	for _, op := range history {
		if _, ok := byUser[op.User]; !ok {
			users = append(users, op.User)
		}
		if op.Result == Unknown {
			op.Return = max(op.Return, op.Call+opts.UnknownWithin.Nanoseconds())
			op.lone = op.Kind == Acquire && named[[2]string{op.User, op.Stream}] == 1
		}
		byUser[op.User] = append(byUser[op.User], op)
	}
	sort.Strings(users)
	v := Verdict{Users: len(users), Ops: len(history)}
	deadline := time.Now().Add(opts.Timeout)
	// porcupine reads a timeout of 0 as none.
	left := func() time.Duration { return max(time.Until(deadline), time.Nanosecond) }
	for _, user := range users {
		ops := byUser[user]
		res := porcupine.CheckOperationsTimeout(capModel, operations(strict(ops)), left())
		if res != porcupine.Ok {
			v.Widened++
			res = porcupine.CheckOperationsTimeout(capModel, operations(ops), left())
		}
		switch res {
		case porcupine.Illegal:
			v.Illegal = append(v.Illegal, user)
		case porcupine.Unknown:
			v.Undecided = append(v.Undecided, user)
		}
	}
	return v
}

// strict drops the calls without an answer whose stream no answered call
// shows granted: read as having had no effect.
func strict(ops []Op) []Op {
	seen := map[string]bool{}
	for _, op := range ops {
		if op.Result == Yes {
			seen[op.Stream] = true
		}
	}
	out := make([]Op, 0, len(ops))
	for _, op := range ops {
		if op.Result != Unknown || seen[op.Stream] {
			out = append(out, op)
		}
	}
	return out
}

func operations(ops []Op) []porcupine.Operation {
	out := make([]porcupine.Operation, len(ops))
	for i, op := range ops {
		out[i] = porcupine.Operation{Input: op, Call: op.Call, Output: op.Result, Return: op.Return}
	}
	return out
}

// capModel is the specification of one user's slots. A state is the set
// of slot sets the history so far may have left (porcupine's power-set
// construction, built here so that merging is a map rather than pairwise,
// and so that dominated sets are dropped: see prune). Each slot set is
// encoded as a string (see slots) and the set of them is sorted.
var capModel = porcupine.Model{
	Init: func() any { return []string{""} },
	Step: func(state, input, output any) (bool, any) {
		op, result := input.(Op), output.(Result)
		seen := map[string]bool{}
		var next []string
		for _, st := range state.([]string) {
			for _, held := range decode(st).afterLosses(op) {
				for _, s := range held.step(op, result) {
					if e := s.encode(); !seen[e] {
						seen[e] = true
						next = append(next, e)
					}
				}
			}
		}
		next = prune(next)
		return len(next) > 0, next
	},
	Equal: func(a, b any) bool { return slices.Equal(a.([]string), b.([]string)) },
	Hash: func(state any) uint64 {
		h := fnv.New64a()
		for _, s := range state.([]string) {
			h.Write([]byte(s))
			h.Write([]byte{'/'})
		}
		return h.Sum64()
	},
	DescribeOperation: func(input, output any) string { return input.(Op).String() },
}

// slot is one held slot of the model; fragile slots may vanish.
//
// A slot of a lone acquire (see Op) is anonymous: its stream is "". No
// call names it, so only the cap, its loss and its expiry can tell it
// apart, and two sets that differ only in which lone acquires they hold
// are one: a fragile anonymous slot keeps no time (it may vanish at any
// moment anyway), and prune drops a set whose anonymous slots are each
// matched by one of another set's that may vanish no later. Without
// this, a burst of calls without an answer during an outage makes the
// search try every subset of them.
type slot struct {
	stream  string
	fragile bool
	// refreshed is the call time of the latest grant or heartbeat of the
	// slot: it expires no earlier than TTL after it.
	refreshed int64
}

// before orders slots: by stream, then fragile first, then the earlier
// refreshed. Among anonymous slots, a slot before another may vanish
// whenever the other may.
func (a slot) before(b slot) bool {
	if a.stream != b.stream {
		return a.stream < b.stream
	}
	if a.fragile != b.fragile {
		return a.fragile
	}
	return a.refreshed < b.refreshed
}

// slots is a state: held slots in the order of before.
type slots []slot

// encode writes "id refreshed" or "id refreshed!" (fragile) joined by "|";
// stream ids contain none of these characters.
func (s slots) encode() string {
	parts := make([]string, len(s))
	for i, sl := range s {
		parts[i] = sl.stream + " " + strconv.FormatInt(sl.refreshed, 10)
		if sl.fragile {
			parts[i] += "!"
		}
	}
	return strings.Join(parts, "|")
}

func decode(state string) slots {
	if state == "" {
		return nil
	}
	parts := strings.Split(state, "|")
	out := make(slots, len(parts))
	for i, p := range parts {
		p, fragile := strings.CutSuffix(p, "!")
		id, at, _ := strings.Cut(p, " ")
		refreshed, _ := strconv.ParseInt(at, 10, 64)
		out[i] = slot{id, fragile, refreshed}
	}
	return out
}

func (s slots) find(stream string) int {
	for i, sl := range s {
		if sl.stream == stream {
			return i
		}
	}
	return -1
}

func (s slots) without(i int) slots {
	out := append(slots(nil), s[:i]...)
	return append(out, s[i+1:]...)
}

func (s slots) with(sl slot) slots {
	out := append(append(slots(nil), s...), sl)
	sort.Slice(out, func(i, j int) bool { return out[i].before(out[j]) })
	return out
}

// afterLosses returns s and every state s may become before op takes
// effect by losing fragile slots and slots that may have expired: each
// subset of them removed.
func (s slots) afterLosses(op Op) []slots {
	var losable []int
	for i, sl := range s {
		if sl.fragile || op.TTL > 0 && op.Return >= sl.refreshed+op.TTL {
			losable = append(losable, i)
		}
	}
	out := make([]slots, 0, 1<<len(losable))
	for lost := range 1 << len(losable) {
		st := make(slots, 0, len(s))
		for i, sl := range s {
			if j := slices.Index(losable, i); j < 0 || lost&(1<<j) == 0 {
				st = append(st, sl)
			}
		}
		out = append(out, st)
	}
	return out
}

// prune drops from a set of encoded states each one that another
// dominates: the same named slots, as many anonymous ones, each of them
// before or equal to its match in order (see slot.before). Whatever may
// follow the dominated state may follow the other. It returns the rest
// sorted.
func prune(states []string) []string {
	type split struct {
		named string
		anon  slots
	}
	groups := map[string][]split{}
	for _, e := range states {
		var named, anon slots
		for _, sl := range decode(e) {
			if sl.stream == "" {
				anon = append(anon, sl)
			} else {
				named = append(named, sl)
			}
		}
		key := named.encode() + "#" + strconv.Itoa(len(anon))
		groups[key] = append(groups[key], split{e, anon})
	}
	out := states[:0]
	for _, g := range groups {
		for i, a := range g {
			dominated := false
			for j, b := range g {
				if i != j && b.named != a.named && covers(b.anon, a.anon) {
					dominated = true
					break
				}
			}
			if !dominated {
				out = append(out, a.named)
			}
		}
	}
	slices.Sort(out)
	return out
}

// covers reports whether each anonymous slot of a is before or equal to
// its match in b; both are in order.
func covers(a, b slots) bool {
	for i := range a {
		if b[i].before(a[i]) {
			return false
		}
	}
	return true
}

// step returns the states op may leave s in, having answered result; none
// if it could not have answered that.
func (s slots) step(op Op, result Result) []slots {
	i := s.find(op.Stream)
	held := i >= 0
	switch op.Kind {
	case Acquire:
		var granted []slots
		switch {
		case held:
			granted = []slots{s.confirmed(i, op)}
		case len(s) < op.Limit:
			granted = []slots{s.with(grantOf(op))}
		}
		switch result {
		case Yes:
			return granted
		case No:
			if !held && len(s) >= op.Limit {
				return []slots{s}
			}
			return nil
		default:
			if held {
				return []slots{s}
			}
			return append([]slots{s}, granted...)
		}
	case Heartbeat:
		switch result {
		case Yes:
			if held {
				return []slots{s.confirmed(i, op)}
			}
			return nil
		case No:
			if !held {
				return []slots{s}
			}
			return nil
		default:
			return []slots{s}
		}
	case Release:
		switch result {
		case Yes:
			if held {
				return []slots{s.without(i)}
			}
			return nil
		case No:
			if !held {
				return []slots{s}
			}
			return nil
		default:
			if held {
				return []slots{s, s.without(i)}
			}
			return []slots{s}
		}
	}
	return nil
}

// grantOf is the slot op grants: anonymous if op is lone, without a time
// if it is fragile too.
func grantOf(op Op) slot {
	switch {
	case op.lone && op.Fragile:
		return slot{"", true, 0}
	case op.lone:
		return slot{"", false, op.Call}
	}
	return slot{op.Stream, op.Fragile, op.Call}
}

// confirmed returns s after op, which Redis answered for slot i: the slot
// refreshed at op's call, and durable if op ran after every fault window.
func (s slots) confirmed(i int, op Op) slots {
	out := append(slots(nil), s...)
	out[i].refreshed = max(out[i].refreshed, op.Call)
	if !op.Fragile {
		out[i].fragile = false
	}
	return out
}
