package lua

import (
	"context"
	"fmt"
	"strconv"
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
func Acquire(ctx context.Context, c rueidis.Client, key, streamID string, limit int, ttl time.Duration) (Acquired, error) {
	vals, err := acquireScript.Exec(ctx, c, userKeys(key), []string{streamID, strconv.Itoa(limit), ms(ttl)}).AsIntSlice()
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

// HeartbeatMulti heartbeats many slots in one pipelined round per node
// (rueidis groups the calls by node). Results and errors are per slot, in
// the order of slots: one unreachable shard does not fail the others.
//
// It pipelines EVALSHA itself rather than use rueidis.Lua.ExecMulti, which
// first sends SCRIPT LOAD to every known node on every call: an extra round
// trip, and one dead replica would fail the whole batch. Slots whose node
// answers NOSCRIPT are sent again as EVAL, once.
func HeartbeatMulti(ctx context.Context, c rueidis.Client, slots []HeartbeatArgs) ([]Beat, []error) {
	cmds := make(rueidis.Commands, len(slots))
	for i, s := range slots {
		cmds[i] = c.B().Evalsha().Sha1(heartbeatSHA).Numkeys(2).Key(userKeys(s.Key)...).Arg(s.StreamID, ms(s.TTL)).Build().ToRetryable()
	}
	resps := c.DoMulti(ctx, cmds...)

	var missing []int // slots whose node lacks the script
	for i, resp := range resps {
		if rerr, ok := rueidis.IsRedisErr(resp.Error()); ok && rerr.IsNoScript() {
			missing = append(missing, i)
		}
	}
	if len(missing) > 0 {
		evals := make(rueidis.Commands, len(missing))
		for j, i := range missing {
			s := slots[i]
			evals[j] = c.B().Eval().Script(heartbeatSource).Numkeys(2).Key(userKeys(s.Key)...).Arg(s.StreamID, ms(s.TTL)).Build().ToRetryable()
		}
		for j, resp := range c.DoMulti(ctx, evals...) {
			resps[missing[j]] = resp
		}
	}

	beats := make([]Beat, len(slots))
	errs := make([]error, len(slots))
	for i, resp := range resps {
		beats[i], errs[i] = parseBeat(resp)
	}
	return beats, errs
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
