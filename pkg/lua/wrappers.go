package lua

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/redis/rueidis"
)

// Acquired is the result of the acquire script.
type Acquired struct {
	Granted      bool
	Used         int   // live slots after the call
	ExpiresAtMs  int64 // Redis ms; 0 when denied
	Pruned       int   // expired slots removed by this call
	RetryAfterMs int64 // when denied: until the earliest slot expires
}

// Acquire runs the acquire script on key (a keys.Schema.UserKey) and its
// slot records for streamID.
//
// rec is written as the new slot's record, after its TTL.
func Acquire(ctx context.Context, c rueidis.Client, key, streamID string, limit int, ttl time.Duration, rec Record) (Acquired, error) {
	vals, err := acquireScript.Exec(ctx, c, userKeys(key), []string{streamID, strconv.Itoa(limit), ms(ttl), rec.encode()}).AsIntSlice()
	if err != nil {
		return Acquired{}, err
	}
	if len(vals) != 5 {
		return Acquired{}, fmt.Errorf("acquire script returned %d values, want 5", len(vals))
	}
	return Acquired{
		Granted:      vals[0] == 1,
		Used:         int(vals[1]),
		ExpiresAtMs:  vals[2],
		Pruned:       int(vals[3]),
		RetryAfterMs: vals[4],
	}, nil
}

// Record is what a slot's record holds besides its TTL, which the scripts
// write first: "<ttl ms>;caller=<name>". Fields are ';'-separated
// name=value pairs; the values are validated identifiers (caller names are
// [A-Za-z0-9._@-]), so they hold neither ';' nor '='.
type Record struct {
	// Caller names who took the slot: the API caller of the tokens file or
	// the client certificate. Empty: not recorded (an open API).
	Caller string
}

// encode returns the fields after the TTL, each with its leading ';'.
func (r Record) encode() string {
	if r.Caller == "" {
		return ""
	}
	return ";caller=" + r.Caller
}

// Beat is the result of the heartbeat script.
type Beat struct {
	Alive       bool
	ExpiresAtMs int64 // Redis ms; 0 when lost
	Pruned      int   // the user's expired slots removed by this call
	// NoTTL: the slot is held but has no record and no fallback TTL was
	// given, so it was left as it is (Alive false, ExpiresAtMs its expiry).
	NoTTL bool
}

// HeartbeatArgs names one slot to heartbeat.
type HeartbeatArgs struct {
	Key      string // a keys.Schema.UserKey
	StreamID string
	// TTL keeps a slot that has no record of its own TTL (one taken by a
	// version that wrote none); 0 when none is known.
	TTL time.Duration
}

// Heartbeat runs the heartbeat script on key (a keys.Schema.UserKey) and
// its slot records for streamID; ttl as HeartbeatArgs.TTL.
func Heartbeat(ctx context.Context, c rueidis.Client, key, streamID string, ttl time.Duration) (Beat, error) {
	return parseBeat(heartbeatScript.Exec(ctx, c, userKeys(key), []string{streamID, ms(ttl)}))
}

// HeartbeatMulti heartbeats many slots in one pipelined round per node.
// Results and errors are per slot, in the order of slots: one unreachable
// shard does not fail the others.
//
// Each node's slots are refreshed as that node answers, whatever the others
// do. On a cluster the slots are grouped by hash slot, and each group's
// EVALSHA, and its EVAL when the node lacks the script (NOSCRIPT: after a
// failover, a restart, a SCRIPT FLUSH, a new script), runs on its own,
// concurrently; rueidis pipelines concurrent calls to one node together, so
// a batch still costs about one round trip per node. (One DoMulti for the
// batch would hold every node's EVAL until the slowest node answered: with
// one node hung, no slot anywhere would be refreshed before the deadline.)
//
// It pipelines EVALSHA itself rather than use rueidis.Lua.ExecMulti, which
// first sends SCRIPT LOAD to every known node on every call: an extra round
// trip, and one dead replica would fail the whole batch.
func HeartbeatMulti(ctx context.Context, c rueidis.Client, slots []HeartbeatArgs) ([]Beat, []error) {
	beats := make([]Beat, len(slots))
	errs := make([]error, len(slots))
	cmds := make(rueidis.Commands, len(slots))
	order := make([]int, len(slots)) // indices of slots, grouped by hash slot
	for i, s := range slots {
		cmds[i] = c.B().Evalsha().Sha1(heartbeatSHA).Numkeys(2).Key(userKeys(s.Key)...).Arg(s.StreamID, ms(s.TTL)).Build().ToRetryable()
		order[i] = i
	}
	if c.Mode() != rueidis.ClientModeCluster { // one node: one group
		heartbeatGroup(ctx, c, slots, cmds, order, beats, errs)
		return beats, errs
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(cmds[a].Slot(), cmds[b].Slot()) })
	var wg sync.WaitGroup
	for len(order) > 0 {
		n := 1
		for n < len(order) && cmds[order[n]].Slot() == cmds[order[0]].Slot() {
			n++
		}
		group := order[:n]
		wg.Go(func() { heartbeatGroup(ctx, c, slots, cmds, group, beats, errs) })
		order = order[n:]
	}
	wg.Wait()
	return beats, errs
}

// heartbeatGroup sends cmds[i] for each i of group (the slots of one hash
// slot, or all of a client with one node), then EVAL for those whose node
// answered NOSCRIPT, and fills beats[i] and errs[i].
func heartbeatGroup(ctx context.Context, c rueidis.Client, slots []HeartbeatArgs, cmds rueidis.Commands, group []int, beats []Beat, errs []error) {
	if len(group) == 1 { // the common case on a cluster; Do costs less than DoMulti
		i := group[0]
		resp := c.Do(ctx, cmds[i])
		if rerr, ok := rueidis.IsRedisErr(resp.Error()); ok && rerr.IsNoScript() {
			resp = c.Do(ctx, heartbeatEval(c, slots[i]))
		}
		beats[i], errs[i] = parseBeat(resp)
		return
	}
	sent := make(rueidis.Commands, len(group))
	for j, i := range group {
		sent[j] = cmds[i]
	}
	resps := c.DoMulti(ctx, sent...)

	var missing []int // positions in group whose node lacks the script
	for j, resp := range resps {
		if rerr, ok := rueidis.IsRedisErr(resp.Error()); ok && rerr.IsNoScript() {
			missing = append(missing, j)
		}
	}
	if len(missing) > 0 {
		evals := make(rueidis.Commands, len(missing))
		for k, j := range missing {
			evals[k] = heartbeatEval(c, slots[group[j]])
		}
		for k, resp := range c.DoMulti(ctx, evals...) {
			resps[missing[k]] = resp
		}
	}
	for j, i := range group {
		beats[i], errs[i] = parseBeat(resps[j])
	}
}

// heartbeatEval is the heartbeat of s sent as the script's source, for a
// node that lacks the script.
func heartbeatEval(c rueidis.Client, s HeartbeatArgs) rueidis.Completed {
	return c.B().Eval().Script(heartbeatSource).Numkeys(2).Key(userKeys(s.Key)...).Arg(s.StreamID, ms(s.TTL)).Build().ToRetryable()
}

func parseBeat(resp rueidis.RedisResult) (Beat, error) {
	vals, err := resp.AsIntSlice()
	if err != nil {
		return Beat{}, err
	}
	if len(vals) != 3 {
		return Beat{}, fmt.Errorf("heartbeat script returned %d values, want 3", len(vals))
	}
	return Beat{Alive: vals[0] == 1, NoTTL: vals[0] == -1, ExpiresAtMs: vals[1], Pruned: int(vals[2])}, nil
}

// Release runs the release script. It reports whether the slot was held
// (live), and how many of the user's expired slots it removed.
func Release(ctx context.Context, c rueidis.Client, key, streamID string) (released bool, pruned int, err error) {
	vals, err := releaseScript.Exec(ctx, c, userKeys(key), []string{streamID}).AsIntSlice()
	if err != nil {
		return false, 0, err
	}
	if len(vals) != 2 {
		return false, 0, fmt.Errorf("release script returned %d values, want 2", len(vals))
	}
	return vals[0] == 1, int(vals[1]), nil
}

// ReleaseAll runs the release_all script on key (a keys.Schema.UserKey)
// and its slot records. It returns the live slots' stream ids it
// released, and how many expired slots it removed. answer (a
// keys.ReleasedAnswer) keeps that answer for keep, and a run under the
// same answer key within keep returns it again, releasing nothing more.
func ReleaseAll(ctx context.Context, c rueidis.Client, key, answer string, keep time.Duration) (ids []string, pruned int, err error) {
	arr, err := releaseAllScript.Exec(ctx, c, append(userKeys(key), answer), []string{ms(keep)}).ToArray()
	if err != nil {
		return nil, 0, err
	}
	if len(arr) != 2 {
		return nil, 0, fmt.Errorf("release_all script returned %d values, want 2", len(arr))
	}
	n, err := arr[0].AsInt64()
	if err != nil {
		return nil, 0, err
	}
	ids, err = arr[1].AsStrSlice()
	if err != nil {
		return nil, 0, err
	}
	if ids == nil {
		ids = []string{}
	}
	return ids, int(n), nil
}

// Slot is one live slot as stored.
type Slot struct {
	StreamID    string
	ExpiresAtMs int64 // Redis ms
}

// Listing is the result of the slots script.
type Listing struct {
	NowMs int64 // Redis ms when read
	Slots []Slot
}

// Slots runs the slots script: the live slots of key, in expiry order.
func Slots(ctx context.Context, c rueidis.Client, key string) (Listing, error) {
	arr, err := slotsScript.Exec(ctx, c, []string{key}, nil).ToArray()
	if err != nil {
		return Listing{}, err
	}
	if len(arr) != 2 {
		return Listing{}, fmt.Errorf("slots script returned %d values, want 2", len(arr))
	}
	now, err := arr[0].AsInt64()
	if err != nil {
		return Listing{}, err
	}
	flat, err := arr[1].AsStrSlice()
	if err != nil {
		return Listing{}, err
	}
	if len(flat)%2 != 0 {
		return Listing{}, fmt.Errorf("slots script returned %d members and scores, want pairs", len(flat))
	}
	out := Listing{NowMs: now, Slots: make([]Slot, 0, len(flat)/2)}
	for i := 0; i < len(flat); i += 2 {
		score, err := strconv.ParseFloat(flat[i+1], 64)
		if err != nil {
			return Listing{}, fmt.Errorf("slot %q has score %q: %w", flat[i], flat[i+1], err)
		}
		out.Slots = append(out.Slots, Slot{StreamID: flat[i], ExpiresAtMs: int64(score)})
	}
	return out, nil
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// userKeys are the KEYS of a script that writes one user's slots: the
// sorted set and the hash of its slot records, under one hash tag.
func userKeys(key string) []string { return []string{key, keys.SlotRecords(key)} }
