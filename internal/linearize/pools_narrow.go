package linearize

import (
	"fmt"
	"math"
	"slices"
	"sort"
)

// narrow returns ops with each interval tightened by the observations of
// the key, each an atomic read that took effect inside its own interval,
// and with members that are never reused:
//
//   - a Join took effect before every observation listing its member
//     (queued or held): it returned by the first one's return;
//   - a Grant or Take took effect after every observation listing its
//     member queued (it called after the last one's call) and before any
//     listing it held (it returned by the first one's return);
//   - a Leave took effect after every observation listing its member
//     queued, and before the first one not listing it that called after
//     its Join returned;
//   - a Free took effect after every observation listing its member held,
//     and before the first one not listing it that called after its Grant
//     or Take returned.
//
// The search then has only the operations that overlap for real to
// order. An interval that comes out empty means two observations of the
// key contradict the history (a member held, then queued again): an
// error naming them.
func narrow(ops []PoolOp) ([]PoolOp, error) {
	var obs []PoolOp
	type bounds struct{ lastQueued, lastHeld, firstSeen, firstHeld int64 }
	seen := map[string]*bounds{}
	at := func(m string) *bounds {
		b := seen[m]
		if b == nil {
			b = &bounds{math.MinInt64, math.MinInt64, math.MaxInt64, math.MaxInt64}
			seen[m] = b
		}
		return b
	}
	for _, op := range ops {
		if op.Kind != Observe {
			continue
		}
		obs = append(obs, op)
		for _, m := range op.Queue {
			b := at(m)
			b.lastQueued = max(b.lastQueued, op.Call)
			b.firstSeen = min(b.firstSeen, op.Return)
		}
		for _, m := range op.Held {
			b := at(m)
			b.lastHeld = max(b.lastHeld, op.Call)
			b.firstSeen = min(b.firstSeen, op.Return)
			b.firstHeld = min(b.firstHeld, op.Return)
		}
	}
	sort.Slice(obs, func(i, j int) bool { return obs[i].Call < obs[j].Call })
	// absent returns the return of the first observation that called at or
	// after from and lists member in neither list (MaxInt64: none).
	absent := func(member string, from int64) int64 {
		i := sort.Search(len(obs), func(i int) bool { return obs[i].Call >= from })
		for ; i < len(obs); i++ {
			if !slices.Contains(obs[i].Queue, member) && !slices.Contains(obs[i].Held, member) {
				return obs[i].Return
			}
		}
		return math.MaxInt64
	}

	out := slices.Clone(ops)
	joined, granted := map[string]int64{}, map[string]int64{}
	for i, op := range out {
		b := at(op.Member)
		switch op.Kind {
		case Join:
			out[i].Return = min(op.Return, b.firstSeen)
			joined[op.Member] = out[i].Return
		case Grant, Take:
			out[i].Call = max(op.Call, b.lastQueued)
			out[i].Return = min(op.Return, b.firstHeld)
			granted[op.Member] = out[i].Return
		}
	}
	for i, op := range out {
		b := at(op.Member)
		switch op.Kind {
		case Leave:
			out[i].Call = max(op.Call, b.lastQueued)
			if from, ok := joined[op.Member]; ok {
				out[i].Return = min(op.Return, absent(op.Member, from))
			}
		case Free:
			out[i].Call = max(op.Call, b.lastHeld)
			if from, ok := granted[op.Member]; ok {
				out[i].Return = min(op.Return, absent(op.Member, from))
			}
		}
	}
	for i, op := range out {
		if op.Call > op.Return {
			return nil, fmt.Errorf("the observations of the key contradict %s (as called: [%d, %d]): %s", ops[i].Kind, ops[i].Call, ops[i].Return, describeSeen(op.Member, obs))
		}
	}
	return out, nil
}

// describeSeen lists where the observations saw member.
func describeSeen(member string, obs []PoolOp) string {
	var where []string
	for _, o := range obs {
		if len(where) == 10 {
			where = append(where, "...")
			break
		}
		switch {
		case slices.Contains(o.Queue, member):
			where = append(where, fmt.Sprintf("queued at [%d, %d]", o.Call, o.Return))
		case slices.Contains(o.Held, member):
			where = append(where, fmt.Sprintf("held at [%d, %d]", o.Call, o.Return))
		}
	}
	return fmt.Sprintf("%q seen %v", member, where)
}
