package lua

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/redis/rueidis"
)

// Acquired is the result of the acquire script.
type Acquired struct {
	Granted bool
	// Extended: the stream held its slot before the call (Granted too).
	Extended bool
	// NotHolder: the stream is held by another caller than rec's; its
	// slot was left as it is. Or, with Waiting, held by none and waiting
	// in the queue under another caller: no slot was taken under its id.
	NotHolder bool
	// Waiting (with NotHolder): the stream is not held, and its id waits
	// in the queue under another caller than rec's (its ticket's record
	// names that caller).
	Waiting      bool
	Used         int   // live slots after the call
	ExpiresAtMs  int64 // Redis ms; 0 when denied
	Pruned       int   // expired slots removed by this call
	RetryAfterMs int64 // when denied: until the earliest slot expires
	// Override is the limit of the user's support override, which the
	// call applied instead of the plan's; -1 when none was in force.
	Override int
	// Wake are the waiting acquires owed the slots this call's pruning
	// freed: the caller wakes them.
	Wake []string
	// WouldRefuse: the limit would have refused the new slot, and shadow
	// mode (AcquireOptions.Shadow) granted it; Used counts it. Of an
	// extension (Extended), the verdict on the acquire that took the slot,
	// as its record keeps it: the extension itself is never refused.
	WouldRefuse bool
	// Record is the held slot's record, as kept, when the call extended
	// it (Extended), or when it took the slot in a try whose reply was
	// lost and was asked again (see Record.Token); else "".
	Record string
	// Owed, of a denial with slots free (Used below the limit): how many
	// acquires waiting in the queue those slots are owed to, which is why
	// it was denied; 0 else.
	Owed int
	// StartedAtMs is the granted slot's start (Redis ms): the call's
	// time for a slot it took, the record's for one it extended; 0 when
	// denied or not recorded.
	StartedAtMs int64
	share       int   // see Share
	fromMs      int64 // see Extension
}

// Share is one request's part in a slot (or a membership) that several
// requests of a stream may hold at once, a client's retries: Index 0 for
// the acquire that took it, n for the n-th that extended it (its
// record's count of extensions then: see Acquired.Again). A request that
// gives up leaves its share (Member.Owned), and the slot goes with the
// last share left: whichever order they leave in, and however often each
// is asked.
type Share struct {
	Index int
	// StartedAtMs is the slot's start (Redis ms), so that a later slot of
	// the stream, taken after this one was released, is not left for
	// it; 0 when not known (not checked).
	StartedAtMs int64
}

// Extension is how an acquire moved a held slot's expiry: from FromMs to
// ToMs (Redis ms), later. A request that gives up gives the time back
// (Member.Back) unless the slot was moved since or a later share of it is
// held (a request that extended it after, by any version, may have been
// answered ToMs), so that it keeps alive
// nothing the stream's other requests hold, nor a slot a crashed try
// left, which then expires by its own score: a client's retries, refused
// (a full pool), keep no membership of its crashed try. The zero
// Extension moved nothing.
type Extension struct {
	FromMs, ToMs int64
}

// Acquire runs the acquire script on key (a keys.Schema.UserKey), its
// slot records, its override and its queue for streamID. limit is the
// plan's; an override in force replaces it. Every plan's acquire reads the
// queue, whether its own acquires may wait or not: the slots owed to the
// acquires waiting in it are not taken.
//
// rec is written as the new slot's record, after its TTL and start; its
// Caller is who asks: a stream another caller holds is not extended
// (NotHolder), nor is one taken whose id waits in the queue under
// another caller (NotHolder and Waiting).
//
// shadow grants what the limit would refuse, and says so (WouldRefuse):
// the scope's enforce: false.
func Acquire(ctx context.Context, c rueidis.Client, key, streamID string, limit int, ttl time.Duration, rec Record, shadow bool) (Acquired, error) {
	return AcquireWith(ctx, c, AcquireArgs{Key: key, StreamID: streamID, Limit: limit, TTL: ttl, Rec: rec, Shadow: shadow})
}

// Again is how many acquires of the stream extended the slot after the
// one that took it, this call included, as the call left it: 0 for a
// slot the call took.
func (a Acquired) Again() int { return ParseRecord(a.Record).Again }

// Share is the call's share of the slot it granted (see Share): the
// one its request holds, which is the record's latest unless the call
// was asked again after its reply was lost and other requests extended
// the slot in between.
func (a Acquired) Share() Share { return Share{Index: a.share, StartedAtMs: a.StartedAtMs} }

// Extension is how the call moved the held slot's expiry: the zero
// Extension unless it extended the slot (Extended) to a later expiry.
func (a Acquired) Extension() Extension {
	if a.fromMs == 0 {
		return Extension{}
	}
	return Extension{FromMs: a.fromMs, ToMs: a.ExpiresAtMs}
}

// started sets a.StartedAtMs of a call whose slot TTL was ttl: a new
// slot's expiry is its start plus ttl.
func (a *Acquired) started(ttl time.Duration) {
	switch {
	case a.Record != "":
		a.StartedAtMs = ParseRecord(a.Record).StartedAtMs
	case a.Granted:
		a.StartedAtMs = a.ExpiresAtMs - ttl.Milliseconds()
	}
}

// AcquireWith is Acquire of a's arguments.
func AcquireWith(ctx context.Context, c rueidis.Client, a AcquireArgs) (Acquired, error) {
	arr, err := acquireScript.Exec(ctx, c, queueKeys(a.Key), a.args()).ToArray()
	if err != nil {
		return Acquired{}, err
	}
	got, err := parseAcquired(arr)
	got.started(a.TTL)
	return got, err
}

// AcquireArgs are one acquire's, as Acquire takes them.
type AcquireArgs struct {
	Key, StreamID string
	Limit         int
	TTL           time.Duration
	Rec           Record
	Shadow        bool
}

func (a AcquireArgs) args() []string {
	enforce := "1"
	if a.Shadow {
		enforce = "0"
	}
	return []string{a.StreamID, strconv.Itoa(a.Limit), ms(a.TTL), a.Rec.encode(), enforce}
}

// AcquireAll runs the acquire script for each of acqs at once, in one
// pipeline (on a cluster, one per node as nodeOf says, concurrently: see
// doMultiScripts), and returns each one's answer and error, in order.
func AcquireAll(ctx context.Context, c rueidis.Client, acqs []AcquireArgs, nodeOf NodeOf) ([]Acquired, []error) {
	cmds := make(rueidis.Commands, len(acqs))
	for i, a := range acqs {
		cmds[i] = c.B().Evalsha().Sha1(acquireSHA).Numkeys(6).Key(queueKeys(a.Key)...).Arg(a.args()...).Build()
	}
	resps := doMultiScripts(ctx, c, cmds, func(i int) rueidis.Completed {
		return c.B().Eval().Script(acquireSource).Numkeys(6).Key(queueKeys(acqs[i].Key)...).Arg(acqs[i].args()...).Build()
	}, nodeOf)
	out := make([]Acquired, len(acqs))
	errs := make([]error, len(acqs))
	for i, resp := range resps {
		arr, err := resp.ToArray()
		if err == nil {
			out[i], err = parseAcquired(arr)
			out[i].started(acqs[i].TTL)
		}
		errs[i] = err
	}
	return out, errs
}

var acquireSHA = sha1Hex(acquireSource)

// AcquireReplyLen is how many values the acquire script answers (see
// acquire.lua): for callers that run it themselves, as a reference does.
const AcquireReplyLen = 12

// parseAcquired reads the acquire script's answer.
func parseAcquired(arr []rueidis.RedisMessage) (Acquired, error) {
	if len(arr) != AcquireReplyLen {
		return Acquired{}, fmt.Errorf("acquire script returned %d values, want %d", len(arr), AcquireReplyLen)
	}
	share, err := arr[9].AsInt64()
	if err != nil {
		return Acquired{}, fmt.Errorf("acquire script: share: %w", err)
	}
	from, err := arr[10].AsInt64()
	if err != nil {
		return Acquired{}, fmt.Errorf("acquire script: extended from: %w", err)
	}
	vals, err := int64s(arr[:6])
	if err != nil {
		return Acquired{}, fmt.Errorf("acquire script: %w", err)
	}
	wake, err := arr[6].AsStrSlice()
	if err != nil {
		return Acquired{}, fmt.Errorf("acquire script: wake ids: %w", err)
	}
	owed, err := arr[11].AsInt64()
	if err != nil {
		return Acquired{}, fmt.Errorf("acquire script: owed: %w", err)
	}
	shadowed, err := arr[7].AsInt64()
	if err != nil {
		return Acquired{}, fmt.Errorf("acquire script: shadow: %w", err)
	}
	record, err := arr[8].ToString()
	if err != nil {
		return Acquired{}, fmt.Errorf("acquire script: record: %w", err)
	}
	return Acquired{
		Granted:      vals[0] >= 1,
		Extended:     vals[0] == 2,
		NotHolder:    vals[0] == -1 || vals[0] == -2,
		Waiting:      vals[0] == -2,
		Used:         int(vals[1]),
		ExpiresAtMs:  vals[2],
		Pruned:       int(vals[3]),
		RetryAfterMs: vals[4],
		Override:     int(vals[5]),
		Wake:         wake,
		WouldRefuse:  shadowed == 1,
		Record:       record,
		Owed:         int(owed),
		share:        int(share),
		fromMs:       from,
	}, nil
}

// int64s reads msgs as integers.
func int64s(msgs []rueidis.RedisMessage) ([]int64, error) {
	out := make([]int64, len(msgs))
	for i, m := range msgs {
		n, err := m.AsInt64()
		if err != nil {
			return nil, fmt.Errorf("value %d: %w", i+1, err)
		}
		out[i] = n
	}
	return out, nil
}

// Beat is the result of the heartbeat script.
type Beat struct {
	Alive       bool
	ExpiresAtMs int64 // Redis ms; 0 when lost
	Pruned      int   // the user's expired slots removed by this call
	// Used is the user's live slots after the call.
	Used int
	// NoTTL: the slot is held but has no record and no fallback TTL was
	// given, so it was left as it is (Alive false, ExpiresAtMs its expiry).
	NoTTL bool
	// NotHolder: the slot is held by another caller, and was left as it is
	// (Alive false, ExpiresAtMs 0).
	NotHolder bool
	// Pools are the pool keys a slot kept alive holds memberships of, as
	// its record names them: the caller keeps them alive too, by TTL.
	Pools []PoolKey
	// TTL is the slot's own, as its record holds it, for a slot with
	// Pools; 0 when none is recorded.
	TTL time.Duration
}

// HeartbeatArgs names one slot to heartbeat.
type HeartbeatArgs struct {
	Key      string // a keys.Schema.UserKey
	StreamID string
	// TTL keeps a slot that has no record of its own TTL (one taken by a
	// version that wrote none); 0 when none is known.
	TTL time.Duration
	// Caller is who heartbeats ("" for none): a slot another caller holds
	// is left as it is (Beat.NotHolder).
	Caller string
	// Own: TTL is the slot's own, and its record is not read (nor its
	// holder checked): a pool key's member, whose stream's slot holds the
	// same TTL and was just kept alive by the user's heartbeat.
	Own bool
}

// Heartbeat runs the heartbeat script on key (a keys.Schema.UserKey) and
// its slot records for streamID; ttl as HeartbeatArgs.TTL. caller is who
// heartbeats ("" for none): a slot another caller holds is left as it is
// (NotHolder).
func Heartbeat(ctx context.Context, c rueidis.Client, caller, key, streamID string, ttl time.Duration) (Beat, error) {
	var beat [1]Beat
	err := parseBeats(heartbeatScript.Exec(ctx, c, userKeys(key), []string{caller, streamID, ms(ttl)}), []int{0}, beat[:])
	return beat[0], err
}

// NodeOf names the node (any string; "" for unknown) that serves a hash
// slot, for grouping a cluster's commands by node: cluster.Client.NodeOf.
type NodeOf func(hashSlot uint16) string

// HeartbeatMulti heartbeats many slots in one pipelined round per node.
// Results and errors are per slot, in the order of slots: one unreachable
// shard does not fail the others.
//
// The slots of one user are refreshed by one script call (its first slot's
// Beat counts the user's pruned slots). Each node's slots are refreshed as
// that node answers, whatever the others do. On a cluster the calls are
// grouped by node (nodeOf; by hash slot where it says "" or is nil), and
// each group's EVALSHAs, and their EVALs where the node lacks the script
// (NOSCRIPT: after a failover, a restart, a SCRIPT FLUSH, a new script),
// go as one pipeline of their own, concurrently. (One DoMulti for the
// batch would hold every node's EVAL until the slowest node answered: with
// one node hung, no slot anywhere would be refreshed before the deadline.)
// Grouped by hash slot alone, a batch of 1000 users is about 1000 calls
// of one command: rueidis still writes the concurrent calls to a node
// together, but the client pays for each call.
//
// It pipelines EVALSHA itself rather than use rueidis.Lua.ExecMulti, which
// first sends SCRIPT LOAD to every known node on every call: an extra round
// trip, and one dead replica would fail the whole batch.
func HeartbeatMulti(ctx context.Context, c rueidis.Client, slots []HeartbeatArgs, nodeOf NodeOf) ([]Beat, []error) {
	beats := make([]Beat, len(slots))
	errs := make([]error, len(slots))
	calls := byUser(slots)
	cmds := make(rueidis.Commands, len(calls))
	for i, call := range calls {
		cmds[i] = c.B().Evalsha().Sha1(heartbeatSHA).Numkeys(2).Key(userKeys(call.key)...).Arg(call.args...).Build().ToRetryable()
	}
	resps := eachGroup(ctx, len(cmds), nodeGroups(c, cmds, nodeOf), func(group []int) []rueidis.RedisResult {
		return scriptGroup(ctx, c, cmds, group, func(i int) rueidis.Completed { return heartbeatEval(c, calls[i]) })
	})
	for i, resp := range resps {
		calls[i].fill(resp, beats, errs)
	}
	return beats, errs
}

// userBeat is one heartbeat script call: slots[at[0]], slots[at[1]], ...,
// all of one user, in the order of slots.
type userBeat struct {
	key  string
	args []string // caller, stream id, fallback ttl, ... as the script takes them
	at   []int    // indices in slots
}

// byUser groups slots into one call per user key (and caller, for a batch
// of several callers' slots), in the order in which each first appears. The calls share two backing arrays, so a batch
// allocates the same whatever the number of users.
func byUser(slots []HeartbeatArgs) []userBeat {
	index := make([]int, len(slots)) // slots[i] goes to calls[index[i]]
	count := make([]int, 0, len(slots))
	type who struct{ key, caller string }
	seen := make(map[who]int, len(slots)) // key and caller → index in calls
	for i, s := range slots {
		j, ok := seen[who{s.Key, s.Caller}]
		if !ok {
			j = len(count)
			seen[who{s.Key, s.Caller}] = j
			count = append(count, 0)
		}
		index[i] = j
		count[j]++
	}
	calls := make([]userBeat, len(count))
	args := make([]string, 2*len(slots)+len(count)) // each call: caller, then its slots
	at := make([]int, len(slots))
	off := 0
	for j, n := range count {
		from := 2*off + j
		calls[j].args = args[from : from : from+1+2*n]
		calls[j].at = at[off : off : off+n]
		off += n
	}
	var ttl time.Duration
	own := false
	ttlMs := "0"
	for i, s := range slots {
		if s.TTL != ttl || s.Own != own { // a batch's slots mostly share one TTL
			ttl, own, ttlMs = s.TTL, s.Own, ms(s.TTL)
			if own {
				ttlMs = "=" + ttlMs
			}
		}
		call := &calls[index[i]]
		if len(call.args) == 0 {
			call.key = s.Key
			call.args = append(call.args, s.Caller)
		}
		call.args = append(call.args, s.StreamID, ttlMs)
		call.at = append(call.at, i)
	}
	return calls
}

// doMultiScripts sends cmds, EVALSHAs, then eval(i) for each cmds[i]
// whose node answered NOSCRIPT (after a failover, a restart, a SCRIPT
// FLUSH, a new script), and returns the answers in the order of cmds. On
// a cluster each node's commands go as a pipeline of their own (see
// nodeGroups), concurrently, each followed by its own EVALs: one pipeline
// for them all would hold every node's EVAL until the slowest node
// answered, so that with one node hung, another node's answers were lost
// whenever it lacked the script.
func doMultiScripts(ctx context.Context, c rueidis.Client, cmds rueidis.Commands, eval func(i int) rueidis.Completed, nodeOf NodeOf) []rueidis.RedisResult {
	return eachGroup(ctx, len(cmds), nodeGroups(c, cmds, nodeOf), func(group []int) []rueidis.RedisResult {
		return scriptGroup(ctx, c, cmds, group, eval)
	})
}

// scriptGroup sends cmds[i] for each i of group (the calls of one node or
// hash slot; nil: all of cmds, on a client of one node), then eval(i)
// for those whose node answered NOSCRIPT, and returns the answers in the
// order of group.
func scriptGroup(ctx context.Context, c rueidis.Client, cmds rueidis.Commands, group []int, eval func(i int) rueidis.Completed) []rueidis.RedisResult {
	at := func(j int) int { return j }
	sent := cmds
	if group != nil {
		at = func(j int) int { return group[j] }
		sent = make(rueidis.Commands, len(group))
		for j, i := range group {
			sent[j] = cmds[i]
		}
	}
	if len(sent) == 1 { // Do costs less than DoMulti
		resp := c.Do(ctx, sent[0])
		if rerr, ok := rueidis.IsRedisErr(resp.Error()); ok && rerr.IsNoScript() {
			resp = c.Do(ctx, eval(at(0)))
		}
		return []rueidis.RedisResult{resp}
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
			evals[k] = eval(at(j))
		}
		for k, resp := range c.DoMulti(ctx, evals...) {
			resps[missing[k]] = resp
		}
	}
	return resps
}

// nodeGroups splits cmds into the indexes of each node's commands, as
// nodeOf says, and by hash slot where it says "" (or is nil); nil on a
// client of one node: one group of all, in order (see eachGroup).
func nodeGroups(c rueidis.Client, cmds rueidis.Commands, nodeOf NodeOf) [][]int {
	if c.Mode() != rueidis.ClientModeCluster {
		return nil
	}
	order := make([]int, len(cmds))
	for i := range order {
		order[i] = i
	}
	node := make([]string, len(cmds))
	for i, cmd := range cmds {
		if nodeOf != nil {
			node[i] = nodeOf(cmd.Slot())
		}
	}
	sameGroup := func(a, b int) bool {
		return node[a] == node[b] && (node[a] != "" || cmds[a].Slot() == cmds[b].Slot())
	}
	slices.SortFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(node[a], node[b]), cmp.Compare(cmds[a].Slot(), cmds[b].Slot()))
	})
	var groups [][]int
	for len(order) > 0 {
		n := 1
		for n < len(order) && sameGroup(order[n], order[0]) {
			n++
		}
		groups = append(groups, order[:n])
		order = order[n:]
	}
	return groups
}

// eachGroup runs send for each of groups (indexes of n commands) and
// returns the answers in the order of the commands. One group runs in the
// caller's goroutine. Several run each in a goroutine of its own, and
// only the groups that answer by ctx's deadline are used: on a cluster
// rueidis may make a call wait past it (for a dial of a hung node that a
// topology refresh started). The others' commands answer ctx's error,
// and a late group writes nothing.
func eachGroup(ctx context.Context, n int, groups [][]int, send func(group []int) []rueidis.RedisResult) []rueidis.RedisResult {
	if n == 0 {
		return nil
	}
	if groups == nil { // all n, on one node, in order
		return send(nil)
	}
	resps := make([]rueidis.RedisResult, n)
	if len(groups) == 1 {
		for j, resp := range send(groups[0]) {
			resps[groups[0][j]] = resp
		}
		return resps
	}
	type answer struct {
		group []int
		resps []rueidis.RedisResult
	}
	done := make(chan answer, len(groups))
	for _, group := range groups {
		go func() { done <- answer{group, send(group)} }()
	}
	answered := make([]bool, n)
wait:
	for range groups {
		select {
		case a := <-done:
			for j, i := range a.group {
				resps[i], answered[i] = a.resps[j], true
			}
		case <-ctx.Done():
			break wait
		}
	}
	for i := range resps {
		if !answered[i] {
			resps[i] = rueidis.NewErrorResult(ctx.Err())
		}
	}
	return resps
}

// fill parses resp, the answer to call, into beats and errs at the call's
// slots.
func (call userBeat) fill(resp rueidis.RedisResult, beats []Beat, errs []error) {
	err := parseBeats(resp, call.at, beats)
	for _, i := range call.at {
		errs[i] = err
	}
}

// heartbeatEval is call sent as the script's source, for a node that lacks
// the script.
func heartbeatEval(c rueidis.Client, call userBeat) rueidis.Completed {
	return c.B().Eval().Script(heartbeatSource).Numkeys(2).Key(userKeys(call.key)...).Arg(call.args...).Build().ToRetryable()
}

// parseBeats parses the heartbeat script's answer for the slots at into
// beats[at[0]], beats[at[1]], ...; the first counts the user's pruned
// slots, and each says how many the user holds.
func parseBeats(resp rueidis.RedisResult, at []int, beats []Beat) error {
	arr, err := resp.ToArray()
	if err != nil {
		return err
	}
	// The list of pooled slots comes last, and not at all when empty.
	if len(arr) != 2+2*len(at) && len(arr) != 3+2*len(at) {
		return fmt.Errorf("heartbeat script returned %d values, want %d or %d", len(arr), 2+2*len(at), 3+2*len(at))
	}
	var head [2]int64
	for j := range head {
		if head[j], err = arr[j].AsInt64(); err != nil {
			return fmt.Errorf("heartbeat script: value %d: %w", j+1, err)
		}
	}
	for k, i := range at {
		alive, err := arr[2+2*k].AsInt64()
		if err != nil {
			return fmt.Errorf("heartbeat script: slot %d: %w", k+1, err)
		}
		expires, err := arr[3+2*k].AsInt64()
		if err != nil {
			return fmt.Errorf("heartbeat script: slot %d: %w", k+1, err)
		}
		beats[i] = Beat{Alive: alive == 1, NoTTL: alive == -1, NotHolder: alive == -2, ExpiresAtMs: expires, Used: int(head[1])}
	}
	beats[at[0]].Pruned = int(head[0])
	if len(arr) == 2+2*len(at) {
		return nil
	}
	pooled, err := arr[len(arr)-1].ToArray()
	if err != nil {
		return fmt.Errorf("heartbeat script: pooled slots: %w", err)
	}
	for j := 0; j+1 < len(pooled); j += 2 {
		k, err := pooled[j].AsInt64()
		if err != nil || k < 1 || int(k) > len(at) {
			return fmt.Errorf("heartbeat script: pooled slot %d: %v", k, err)
		}
		record, err := pooled[j+1].ToString()
		if err != nil {
			return fmt.Errorf("heartbeat script: pooled slot %d: %w", k, err)
		}
		r := ParseRecord(record)
		beats[at[k-1]].Pools, beats[at[k-1]].TTL = DecodePools(r.Pools), r.TTL
	}
	return nil
}

// Released is the result of the release script.
type Released struct {
	// Released: the slot was held (live), and is free now.
	Released bool
	// NotHolder: the slot is held by another caller; nothing changed.
	NotHolder bool
	// Pools are the pool keys the released slot's record names: the
	// memberships the caller drops.
	Pools []PoolKey
	// Pruned counts the user's expired slots the call removed.
	Pruned int
	// Head is the stream id of the acquire at the head of the user's
	// queue, when the call freed a slot and one waits: the caller wakes
	// it. "" otherwise.
	Head string
	// Superseded: the release was a request's leaving its share
	// (Member.Owned), and another request of the stream holds a share
	// still, or the slot is a later one than the share was of: the slot
	// is kept.
	Superseded bool
}

// Release runs the release script on key (a keys.Schema.UserKey), its
// slot records and its queue. caller is who releases ("" for none): a slot
// another caller holds is not released (NotHolder).
func Release(ctx context.Context, c rueidis.Client, caller, key, streamID string) (Released, error) {
	return ReleaseMember(ctx, c, caller, Member{Key: key, ID: streamID})
}

// ReleaseMember runs the release script on m, as Release does; leaving
// m's share of it, when m is Owned.
func ReleaseMember(ctx context.Context, c rueidis.Client, caller string, m Member) (Released, error) {
	arr, err := releaseScript.Exec(ctx, c, releaseKeys(m.Key), m.args(caller)).ToArray()
	if err != nil {
		return Released{}, err
	}
	return parseReleased(arr)
}

// Member is one member of a sorted set the release script runs on: a
// user's slot (Key a keys.Schema.UserKey, ID the stream id) or a pool
// key's membership (Key a keys.Schema.PoolKey, ID the member).
type Member struct {
	Key, ID string
	// Owned: the release is a request's giving up, which leaves its
	// Share of the member; the member goes with the last share (see
	// Share), and stays while another request of the stream id (a
	// client's retry) holds one. Not Owned: released whatever its shares.
	Owned bool
	Share Share
	// Back, of an Owned release: the extension its request made, given
	// back if the member is kept for the other shares, still has
	// Back.ToMs and no later share is held (see Extension).
	Back Extension
}

// args are the release script's ARGV for m, released on caller's behalf.
func (m Member) args(caller string) []string {
	if !m.Owned {
		return []string{m.ID, caller}
	}
	started := ""
	if m.Share.StartedAtMs > 0 {
		started = strconv.FormatInt(m.Share.StartedAtMs, 10)
	}
	args := []string{m.ID, caller, strconv.Itoa(m.Share.Index), started}
	if m.Back.FromMs > 0 {
		args = append(args, strconv.FormatInt(m.Back.FromMs, 10), strconv.FormatInt(m.Back.ToMs, 10))
	}
	return args
}

// ReleaseAt runs the release script for each of members at once, in one
// pipeline (on a cluster, one per node as nodeOf says: see
// doMultiScripts), as Release runs it on one, and returns each one's
// answer and error, in order.
func ReleaseAt(ctx context.Context, c rueidis.Client, caller string, members []Member, nodeOf NodeOf) ([]Released, []error) {
	cmds := make(rueidis.Commands, len(members))
	for i, m := range members {
		cmds[i] = c.B().Evalsha().Sha1(releaseSHA).Numkeys(int64(len(releaseKeys(m.Key)))).Key(releaseKeys(m.Key)...).Arg(m.args(caller)...).Build()
	}
	resps := doMultiScripts(ctx, c, cmds, func(i int) rueidis.Completed {
		m := members[i]
		return c.B().Eval().Script(releaseSource).Numkeys(int64(len(releaseKeys(m.Key)))).Key(releaseKeys(m.Key)...).Arg(m.args(caller)...).Build()
	}, nodeOf)
	out := make([]Released, len(members))
	errs := make([]error, len(members))
	for i, resp := range resps {
		arr, err := resp.ToArray()
		if err == nil {
			out[i], err = parseReleased(arr)
		}
		errs[i] = err
	}
	return out, errs
}

var releaseSHA = sha1Hex(releaseSource)

// parseReleased reads the release script's answer.
func parseReleased(arr []rueidis.RedisMessage) (Released, error) {
	if len(arr) != 4 {
		return Released{}, fmt.Errorf("release script returned %d values, want 4", len(arr))
	}
	vals, err := int64s(arr[:2])
	if err != nil {
		return Released{}, fmt.Errorf("release script: %w", err)
	}
	head, err := arr[2].ToString()
	if err != nil {
		return Released{}, fmt.Errorf("release script: head: %w", err)
	}
	record, err := arr[3].ToString()
	if err != nil {
		return Released{}, fmt.Errorf("release script: record: %w", err)
	}
	return Released{Released: vals[0] == 1, NotHolder: vals[0] == -1, Superseded: vals[0] == -2, Pruned: int(vals[1]), Head: head,
		Pools: DecodePools(ParseRecord(record).Pools)}, nil
}

// ReleasedAll is the result of the release_all script.
type ReleasedAll struct {
	// IDs are the stream ids of the live slots released, in expiry order.
	IDs []string
	// Pruned counts the expired slots removed.
	Pruned int
	// Head is the stream id of the acquire at the head of the user's
	// queue, "" when none waits: the caller wakes it.
	Head string
	// Pools are, for each of IDs, the pool keys its record names: the
	// memberships the caller drops.
	Pools [][]PoolKey
}

// ReleaseAll runs the release_all script on key (a keys.Schema.UserKey),
// its slot records and its queue. answer (a keys.ReleasedAnswer) keeps
// the answer for keep, and a run under the same answer key within keep
// returns it again, releasing nothing more.
func ReleaseAll(ctx context.Context, c rueidis.Client, key, answer string, keep time.Duration) (ReleasedAll, error) {
	ks := []string{key, keys.SlotRecords(key), answer, keys.Queue(key), keys.QueueExpiry(key)}
	arr, err := releaseAllScript.Exec(ctx, c, ks, []string{ms(keep)}).ToArray()
	if err != nil {
		return ReleasedAll{}, err
	}
	if len(arr) != 4 {
		return ReleasedAll{}, fmt.Errorf("release_all script returned %d values, want 4", len(arr))
	}
	n, err := arr[0].AsInt64()
	if err != nil {
		return ReleasedAll{}, err
	}
	ids, err := arr[1].AsStrSlice()
	if err != nil {
		return ReleasedAll{}, err
	}
	if ids == nil {
		ids = []string{}
	}
	head, err := arr[2].ToString()
	if err != nil {
		return ReleasedAll{}, fmt.Errorf("release_all script: head: %w", err)
	}
	recs, err := arr[3].AsStrSlice()
	if err != nil || len(recs) != len(ids) {
		return ReleasedAll{}, fmt.Errorf("release_all script: %d records for %d stream ids: %v", len(recs), len(ids), err)
	}
	pools := make([][]PoolKey, len(ids))
	for i, rec := range recs {
		pools[i] = DecodePools(ParseRecord(rec).Pools)
	}
	return ReleasedAll{IDs: ids, Pruned: int(n), Head: head, Pools: pools}, nil
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// userKeys are the KEYS of a script that writes one user's slots: the
// sorted set and the hash of its slot records, under one hash tag.
func userKeys(key string) []string { return []string{key, keys.SlotRecords(key)} }

// AcquireKeys are the KEYS the acquire script takes for the user key key,
// in order: for code that sends the script itself (the benchmarks that
// measure it against the library).
func AcquireKeys(key string) []string { return queueKeys(key) }

// ReleaseKeys are the KEYS the release script takes, as AcquireKeys.
func ReleaseKeys(key string) []string { return releaseKeys(key) }

// queueKeys are the KEYS of a script that grants slots to one user's
// queue or past it (acquire, wait): userKeys, the user's override (its
// limit replaces the plan's), then the queue's two sorted sets, under the
// same hash tag.
func queueKeys(key string) []string {
	c := keys.CompanionsOf(key)
	return []string{key, c.SlotRecords, c.Override, c.Queue, c.QueueExpiry, c.QueueRecords}
}

// releaseKeys are the KEYS of the release script: userKeys, then the
// queue's keys, whose first ticket owed the freed slot a release names,
// and the override its limit is read from.
func releaseKeys(key string) []string {
	c := keys.CompanionsOf(key)
	return []string{key, c.SlotRecords, c.Queue, c.QueueExpiry, c.QueueRecords, c.Override}
}
