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

// PoolVerdict is the outcome of CheckPools.
type PoolVerdict struct {
	// Verdict counts keys as users: Illegal and Undecided name keys.
	Verdict
	// Grants are the grants of waiting acquires in the order the check
	// found them served (keys one after another, sorted), each with the
	// waiters it was ranked against.
	Grants []PoolGrant
	// Why says, for each key found illegal, where the check got stuck.
	Why map[string]string
}

// PoolGrant is a waiting acquire granted a member of its pool key, and
// the key as it was just before.
type PoolGrant struct {
	Key string
	// PoolTicket is the acquire granted.
	PoolTicket
	// Waiting are the live tickets just before the grant, first arrived
	// first (the one granted among them); Held counts the members each
	// user held then.
	Waiting []PoolTicket
	Held    map[string]int
}

// Passed counts the tickets that arrived before g's and still waited when
// it was granted: passed over for a lower priority (byPriority), at the
// same priority for a user holding more members, or as many and waiting
// for more (byShare), or neither (other: a member was free for each, and
// g's server called first).
func (g PoolGrant) Passed() (byPriority, byShare, other int) {
	waiting := map[string]int{}
	for _, w := range g.Waiting {
		waiting[w.User]++
	}
	for _, w := range g.Waiting {
		if w.Member == g.Member {
			break
		}
		switch {
		case w.Priority < g.Priority:
			byPriority++
		case w.Priority == g.Priority && ranksAhead(g.PoolTicket, g.Held[g.User], waiting[g.User], w, g.Held[w.User], waiting[w.User]):
			byShare++
		default:
			other++
		}
	}
	return byPriority, byShare, other
}

var poolModel = porcupine.Model{
	Init: func() any { return newPoolState(nil, nil) },
	Step: func(state, input, _ any) (bool, any) {
		next, ok := state.(*poolState).step(input.(PoolOp))
		return ok, next
	},
	Equal: func(a, b any) bool { return a.(*poolState).key == b.(*poolState).key },
	Hash: func(state any) uint64 {
		h := fnv.New64a()
		h.Write([]byte(state.(*poolState).key))
		return h.Sum64()
	},
	DescribeOperation: func(input, _ any) string { return input.(PoolOp).String() },
	DescribeState:     func(state any) string { return state.(*poolState).String() },
}

// CheckPools checks each pool key's history against the pool queue model
// (pools.go). It first tightens each operation's interval by the
// observations (see narrow), which keeps the search small; a history an
// observation contradicts outright is illegal without a search.
// opts.Timeout bounds the whole check (default 30s); UnknownWithin does
// not apply (every operation of the history was answered).
func CheckPools(history []PoolOp, opts Options) PoolVerdict {
	if opts.Timeout == 0 {
		opts.Timeout = 30 * time.Second
	}
	byKey := map[string][]PoolOp{}
	for _, op := range history {
		byKey[op.Key] = append(byKey[op.Key], op)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	v := PoolVerdict{Verdict: Verdict{Users: len(keys), Ops: len(history)}, Why: map[string]string{}}
	deadline := time.Now().Add(opts.Timeout)
	for _, key := range keys {
		ops, err := narrow(byKey[key])
		if err != nil {
			v.Illegal = append(v.Illegal, key)
			v.Why[key] = err.Error()
			continue
		}
		in := make([]porcupine.Operation, len(ops))
		for i, op := range ops {
			in[i] = porcupine.Operation{Input: op, Call: op.Call, Return: op.Return}
		}
		left := max(time.Until(deadline), time.Nanosecond) // porcupine reads 0 as none
		res, info := porcupine.CheckOperationsVerbose(poolModel, in, left)
		order := longest(info)
		switch res {
		case porcupine.Ok:
			v.Grants = append(v.Grants, grantsOf(key, order)...)
		case porcupine.Illegal:
			v.Illegal = append(v.Illegal, key)
			v.Why[key] = stuck(ops, order)
		default:
			v.Undecided = append(v.Undecided, key)
		}
	}
	return v
}

// longest is the longest order of operations the check found (the whole
// history's, when it is linearizable).
func longest(info porcupine.LinearizationInfo) []PoolOp {
	var best []porcupine.Operation
	for _, partition := range info.PartialLinearizationsOperations() {
		for _, order := range partition {
			if len(order) > len(best) {
				best = order
			}
		}
	}
	out := make([]PoolOp, len(best))
	for i, op := range best {
		out[i] = op.Input.(PoolOp)
	}
	return out
}

// grantsOf replays order and returns its grants of waiting acquires.
func grantsOf(key string, order []PoolOp) []PoolGrant {
	var out []PoolGrant
	s := newPoolState(nil, nil)
	for _, op := range order {
		if at := s.queued(op.Member); op.Kind == Grant && at >= 0 {
			out = append(out, PoolGrant{Key: key, PoolTicket: s.queue[at], Waiting: slices.Clone(s.queue), Held: s.heldBy()})
		}
		s, _ = s.step(op)
	}
	return out
}

// stuck describes where the longest order found ends: the state then, and
// the first operations left that had to come next.
func stuck(ops, order []PoolOp) string {
	s := newPoolState(nil, nil)
	placed := map[string]int{}
	for _, op := range order {
		s, _ = s.step(op)
		placed[opID(op)]++
	}
	var left []PoolOp
	for _, op := range ops {
		if id := opID(op); placed[id] > 0 {
			placed[id]--
		} else {
			left = append(left, op)
		}
	}
	sort.Slice(left, func(i, j int) bool { return left[i].Return < left[j].Return })
	var b strings.Builder
	fmt.Fprintf(&b, "after %d of %d operations: %s; none of these fits next:", len(order), len(ops), s)
	for _, op := range left[:min(len(left), 5)] {
		b.WriteString("\n  " + op.String())
	}
	return b.String()
}

func opID(op PoolOp) string {
	return fmt.Sprintf("%d %s %d %d", op.Kind, op.Member, op.Call, op.Return)
}
