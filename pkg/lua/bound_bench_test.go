package lua_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/joishi/limiter/internal/benchenv"
	"github.com/joishi/limiter/pkg/lua"
)

// BenchmarkPoolsBound measures how near Redis's one thread lets an
// acquire+release that joins two pools come to one that joins none
// (DESIGN §21 asks half the pairs/s), and how near it would come were
// the memberships' work less: the server's CPU per pair (INFO cpu), in
// pipelines of boundPipeline pairs, as a saturated server runs them, for
// a pair of a new user's stream that joins
//
//   - none: the user's acquire and release scripts;
//   - sent: two pool keys too (one of 16, one of 100), each key's scripts
//     a call of their own, as the limiter sends them to one Redis (the
//     acquires in one pipeline, the releases in another);
//   - inside: the same scripts' work run inside the user's own call, one
//     each way: the memberships without a call of their own;
//   - bare: the same, each membership stripped to its slot (no record, no
//     pruning, no override, no queue): what a membership costs at least
//     while it is a slot of its key (DESIGN §16);
//   - lean: each pool key's membership a script of its own, sent as the
//     limiter sends its calls, that does only what a pool's member needs
//     (leanAcquire): a design whose memberships are not slots;
//   - folded: the same, each membership lean and folded (foldedAcquire):
//     no record of its own (the user's slot's names its pools), its key's
//     override and a mark of its queue read at once;
//   - least: the same, each membership only a capped member that carries
//     its own expiry (leastAcquire): what a crash-safe membership costs
//     at least, in any design.
//
// It reports none's CPU per pair ÷ each way's: the most pairs/s each way
// allows against none where Redis is what bounds them (hack/bench.sh
// prints them beside the pairs/s measured). The ways take turns of
// boundTurn pairs; it reports nothing when other clients ran scripts on
// the server meanwhile.
func BenchmarkPoolsBound(b *testing.B) {
	u := newFullUser(b)
	node := benchenv.Dial(b, u.c).Masters[0]
	ways := boundWays(b, u.c)
	cpu := make([]float64, len(ways))
	alone := true
	for done := 0; done < b.N; done += boundTurn {
		n := min(boundTurn, b.N-done)
		for i, w := range ways {
			before, calls := benchenv.CPU(b, node), u.scriptStats(b).calls
			for at := 0; at < n; at += boundPipeline {
				w.pairs(b, u, min(boundPipeline, n-at))
			}
			cpu[i] += benchenv.CPU(b, node) - before
			alone = alone && u.scriptStats(b).calls-calls == int64(n*w.calls)
		}
	}
	if !alone {
		b.Log("bound left out: other clients ran scripts on the server meanwhile")
		return
	}
	for i, w := range ways {
		b.ReportMetric(cpu[i]/float64(b.N), w.name+"-redis-cpu-µs/pair")
		if i > 0 {
			b.ReportMetric(cpu[0]/cpu[i], w.name+"-bound")
		}
	}
}

// BenchmarkPoolsLatencyBound measures how near an acquire that joins two
// pools may come to one that joins none in latency (DESIGN §21 asks a
// median at most 1.5 times none's), in the ways of BenchmarkPoolsBound,
// each pair sent as the limiter sends it, by latencyCallers callers, as
// BenchmarkPoolsAcquireRelease runs its own: the acquire's commands in one
// round trip, then the release's steps. No code of the limiter's is on
// the way, so what the memberships' ways add to none's is Redis's work and
// its queue, and the calls they make.
//
// It runs every way at full load (each caller's next pair at once: the
// full- metrics), then paced at LIMITER_BENCH_PACED_RATE pairs/s in all
// (paced-), the rate at which BenchmarkPoolsAcquireRelease paces both of
// its ways in the same run of hack/bench.sh; unset, half of the pairs/s
// the sent way made at full load; and then at benchenv.LightRate (light-),
// the light load of BenchmarkPoolsAcquireRelease. The ways take turns of
// latencyTurn pairs, in an order that reverses from one turn to the next.
// It reports each way's acquire median (<load>-<way>-acquire-p50-µs), and
// the median over the turns of its median's ratio to none's in the same
// turn (<load>-<way>-p50-bound): each ratio of two ways run one after the
// other, on the same machine.
func BenchmarkPoolsLatencyBound(b *testing.B) {
	u := newFullUser(b)
	ways := boundWays(b, u.c)
	// run runs b.N pairs each way at rate, in turns, and reports them as
	// load; it returns each way's time.
	run := func(load string, rate float64) (wall []time.Duration) {
		wall = make([]time.Duration, len(ways))
		took := make([][]time.Duration, len(ways))
		ratios := make([][]float64, len(ways))
		order := make([]int, len(ways))
		for t := 0; t*latencyTurn < b.N; t++ {
			n := min(latencyTurn, b.N-t*latencyTurn)
			for i := range order {
				order[i] = i
			}
			if t%2 == 1 {
				slices.Reverse(order)
			}
			p50 := make([]float64, len(ways))
			for _, i := range order {
				start := time.Now()
				mine := ways[i].paced(b, u, n, rate)
				wall[i] += time.Since(start)
				took[i] = append(took[i], mine...)
				p50[i] = median(mine)
			}
			for i := range ways {
				ratios[i] = append(ratios[i], p50[i]/p50[0])
			}
		}
		for i, w := range ways {
			b.ReportMetric(median(took[i]), load+"-"+w.name+"-acquire-p50-µs")
			if i > 0 {
				slices.Sort(ratios[i])
				b.ReportMetric(ratios[i][len(ratios[i])/2], load+"-"+w.name+"-p50-bound")
			}
		}
		return wall
	}
	b.ResetTimer()
	wall := run("full", 0)
	rate := float64(b.N) / wall[1].Seconds() / 2 // ways[1] is sent
	if env := os.Getenv("LIMITER_BENCH_PACED_RATE"); env != "" {
		var err error
		if rate, err = strconv.ParseFloat(env, 64); err != nil || rate <= 0 {
			b.Fatalf("LIMITER_BENCH_PACED_RATE=%q: want pairs/s, a number above 0", env)
		}
	}
	run("paced", rate)
	b.ReportMetric(rate, "paced-pairs/s")
	run("light", benchenv.LightRate)
}

// latencyTurn is how many pairs each way of BenchmarkPoolsLatencyBound
// makes before the next takes its turn.
const latencyTurn = 500

// median returns the median of took, in µs; it sorts took.
func median(took []time.Duration) float64 {
	slices.Sort(took)
	return float64(took[len(took)/2]) / float64(time.Microsecond)
}

// latencyCallers is how many callers BenchmarkPoolsLatencyBound's pairs
// have: BenchmarkPoolsAcquireRelease's benchClients.
const latencyCallers = 50

// paced runs n new pairs of w by latencyCallers callers, pair k starting
// k/rate seconds after the first (rate 0: each as soon as its caller is
// free), and returns each acquire's time.
func (w boundWay) paced(b *testing.B, u *fullUser, n int, rate float64) []time.Duration {
	ctx := context.Background()
	took := make([]time.Duration, n)
	var next atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range latencyCallers {
		wg.Go(func() {
			for k := next.Add(1) - 1; k < int64(n) && !b.Failed(); k = next.Add(1) - 1 {
				if rate > 0 {
					time.Sleep(time.Until(start.Add(time.Duration(float64(k) / rate * float64(time.Second)))))
				}
				p := newBoundPair(u)
				t0 := time.Now()
				err := boundAnswers(u.c.DoMulti(ctx, w.acquire(p)...))
				took[k] = time.Since(t0)
				for _, step := range w.release(p) {
					if err == nil {
						err = boundAnswers(u.c.DoMulti(ctx, step...))
					}
				}
				if err != nil {
					b.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	return took
}

// boundTurn is how many pairs each way of BenchmarkPoolsBound makes
// before the next takes its turn; boundPipeline, how many pairs' acquires
// (then releases) one round trip sends.
const (
	boundTurn     = 2000
	boundPipeline = 50
)

// boundWay is one way of the bound benchmarks to send a pair: acquire, the
// commands of its acquire, sent at once; release, those of its release,
// each step a round trip after the one before; calls, the script calls a
// pair makes.
type boundWay struct {
	name    string
	calls   int
	acquire func(p boundPair) rueidis.Commands
	release func(p boundPair) []rueidis.Commands
}

// pairs sends n new pairs of w in pipelines: their acquires in one round
// trip, then each step of their releases in one.
func (w boundWay) pairs(b *testing.B, u *fullUser, n int) {
	var steps []rueidis.Commands
	for range n {
		p := newBoundPair(u)
		for i, cmds := range append([]rueidis.Commands{w.acquire(p)}, w.release(p)...) {
			if i == len(steps) {
				steps = append(steps, nil)
			}
			steps[i] = append(steps[i], cmds...)
		}
	}
	for _, cmds := range steps {
		if err := boundAnswers(u.c.DoMulti(context.Background(), cmds...)); err != nil {
			b.Fatal(err)
		}
	}
}

// boundPair is one pair's stream: its user's keys and two pool keys, with
// the arguments the limiter would send for them.
type boundPair struct {
	user, model, org   string
	userArgs, poolArgs []string
	stream, member     string
}

var boundSeq atomic.Int64

func newBoundPair(u *fullUser) boundPair {
	seq := boundSeq.Add(1)
	id := strconv.FormatInt(seq, 10)
	user, stream := "u"+id, "s"+id
	model, org := "m"+strconv.FormatInt(seq%16, 10), "o"+strconv.FormatInt(seq%100, 10)
	return boundPair{
		user:     u.key + ":{" + user + "}",
		model:    u.key + ":pool:{model=" + model + "}",
		org:      u.key + ":pool:{org=" + org + "}",
		userArgs: []string{stream, "3", "120000", ";plan=free;pools=model=" + model + ",org=" + org, "1"},
		poolArgs: []string{stream + " " + user, "1000000", "120000", ";plan=free;user=" + strconv.Itoa(len(user)) + ":" + user, "1"},
		stream:   stream,
		member:   stream + " " + user,
	}
}

// boundWays are the ways of the bound benchmarks, none first, their
// scripts loaded on c.
func boundWays(b *testing.B, c rueidis.Client) []boundWay {
	acquire, release := lua.Sources()["acquire"], lua.Sources()["release"]
	load := func(src string) string {
		sha, err := c.Do(context.Background(), c.B().ScriptLoad().Script(src).Build()).ToString()
		if err != nil {
			b.Fatal(err)
		}
		return sha
	}
	acq, rel := load(acquire), load(release)
	insideAcq, insideRel := load(inside(b, acquire, acquire, 5)), load(inside(b, release, release, 2))
	bareAcq := load(inside(b, acquire, withoutAll(b, acquire, acquireParts), 5))
	bareRel := load(inside(b, release, withoutAll(b, release, releaseParts), 2))
	ev := func(sha string, args []string, keys ...[]string) rueidis.Completed {
		var all []string
		for _, k := range keys {
			all = append(all, k...)
		}
		return c.B().Evalsha().Sha1(sha).Numkeys(int64(len(all))).Key(all...).Arg(args...).Build()
	}
	// own is the way that sends each pool key's membership m as a call
	// of its own, beside the user's scripts.
	own := func(m ownMembership) boundWay {
		mAcq, mRel := load(m.acquire), load(m.release)
		return boundWay{m.name, 6,
			func(p boundPair) rueidis.Commands {
				return rueidis.Commands{ev(acq, p.userArgs, lua.AcquireKeys(p.user)),
					ev(mAcq, p.poolArgs[:m.args], pick(lua.AcquireKeys(p.model), m.acquireKeys)),
					ev(mAcq, p.poolArgs[:m.args], pick(lua.AcquireKeys(p.org), m.acquireKeys))}
			},
			func(p boundPair) []rueidis.Commands {
				return []rueidis.Commands{{ev(rel, []string{p.stream, ""}, lua.ReleaseKeys(p.user)),
					ev(mRel, []string{p.member}, pick(lua.ReleaseKeys(p.model), m.releaseKeys)),
					ev(mRel, []string{p.member}, pick(lua.ReleaseKeys(p.org), m.releaseKeys))}}
			}}
	}
	// joined is the way that runs a pair's acquire and release as one
	// call each: of acq and rel, which take the user's keys, then the two
	// pool keys'.
	joined := func(name, acq, rel string) boundWay {
		return boundWay{name, 2,
			func(p boundPair) rueidis.Commands {
				return rueidis.Commands{ev(acq, append(append(append([]string{}, p.userArgs...), p.poolArgs...), p.poolArgs...),
					lua.AcquireKeys(p.user), lua.AcquireKeys(p.model), lua.AcquireKeys(p.org))}
			},
			func(p boundPair) []rueidis.Commands {
				return []rueidis.Commands{{ev(rel, []string{p.stream, "", p.member, "", p.member, ""},
					lua.ReleaseKeys(p.user), lua.ReleaseKeys(p.model), lua.ReleaseKeys(p.org))}}
			}}
	}
	ways := []boundWay{
		{"none", 2,
			func(p boundPair) rueidis.Commands {
				return rueidis.Commands{ev(acq, p.userArgs, lua.AcquireKeys(p.user))}
			},
			func(p boundPair) []rueidis.Commands {
				return []rueidis.Commands{{ev(rel, []string{p.stream, ""}, lua.ReleaseKeys(p.user))}}
			}},
		{"sent", 6,
			func(p boundPair) rueidis.Commands {
				return rueidis.Commands{ev(acq, p.userArgs, lua.AcquireKeys(p.user)),
					ev(acq, p.poolArgs, lua.AcquireKeys(p.model)), ev(acq, p.poolArgs, lua.AcquireKeys(p.org))}
			},
			// The user's release and the keys', in one round trip, as
			// the limiter's Release sends them for a stream it granted.
			func(p boundPair) []rueidis.Commands {
				return []rueidis.Commands{{ev(rel, []string{p.stream, ""}, lua.ReleaseKeys(p.user)),
					ev(rel, []string{p.member, ""}, lua.ReleaseKeys(p.model)), ev(rel, []string{p.member, ""}, lua.ReleaseKeys(p.org))}}
			}},
		joined("inside", insideAcq, insideRel),
		joined("bare", bareAcq, bareRel),
	}
	for _, m := range ownMemberships {
		ways = append(ways, own(m))
	}
	return ways
}

// ownMembership is a membership of BenchmarkPoolsBound's that is a script
// of its own: its acquire and release sources, which of a pool key's
// lua.AcquireKeys and lua.ReleaseKeys each takes, and how many of the
// arguments the limiter sends a pool key (the member, its limit, TTL and
// record's fields) its acquire takes; its release takes the member.
type ownMembership struct {
	name                     string
	acquire, release         string
	acquireKeys, releaseKeys []int
	args                     int
}

// ownMemberships are BenchmarkPoolsBound's lean, folded and least ways.
var ownMemberships = []ownMembership{
	// The key, its records, its override and its queue's expiries; the
	// key, its records and its queue.
	{"lean", leanAcquire, leanRelease, []int{0, 1, 2, 4}, []int{0, 1, 2}, 4},
	// The key and its override.
	{"folded", foldedAcquire, foldedRelease, []int{0, 2}, []int{0, 5}, 3},
	{"least", leastAcquire, leastRelease, []int{0}, []int{0}, 3},
}

// pick returns the keys at the indexes of.
func pick(keys []string, of []int) []string {
	picked := make([]string, len(of))
	for i, k := range of {
		picked[i] = keys[k]
	}
	return picked
}

// boundAnswers returns an error unless every script of resps answered 1
// first (granted a new slot, or released one): each user's and each
// key's, of a call that runs several.
func boundAnswers(resps []rueidis.RedisResult) error {
	for _, resp := range resps {
		arr, err := resp.ToArray()
		if err != nil {
			return err
		}
		answers := [][]rueidis.RedisMessage{arr}
		if len(arr) > 0 && arr[0].IsArray() { // one call's answers, a script's each
			answers = answers[:0]
			for _, m := range arr {
				a, err := m.ToArray()
				if err != nil {
					return err
				}
				answers = append(answers, a)
			}
		}
		for _, a := range answers {
			if n, err := a[0].AsInt64(); err != nil || n != 1 {
				return fmt.Errorf("a script answered %v, want 1 first (granted, released)", a)
			}
		}
	}
	return nil
}

// inside returns a script that runs script's body for its first six
// KEYS and first nargs ARGV (a user's slot), then membership's body for
// each further six and nargs (a pool key's), and answers each one's
// answer in order: script and membership are composed sources of one
// script, membership perhaps with parts cut (see without).
func inside(b *testing.B, script, membership string, nargs int) string {
	pieces, slot := splitBody(b, script)
	_, member := splitBody(b, membership)
	return pieces + "local function slot(KEYS, ARGV)\n" + slot + "\nend\n" +
		"local function membership(KEYS, ARGV)\n" + member + "\nend\n" +
		fmt.Sprintf(`local out = {}
for i = 0, #KEYS / 6 - 1 do
  local k, a = {}, {}
  for j = 1, 6 do k[j] = KEYS[i * 6 + j] end
  for j = 1, %d do a[j] = ARGV[i * %d + j] end
  if i == 0 then out[1] = slot(k, a) else out[i + 1] = membership(k, a) end
end
return out
`, nargs, nargs)
}

// splitBody cuts a composed script where its body's code starts (its
// first line, which names its keys): its header and pieces, then that.
func splitBody(b *testing.B, src string) (pieces, body string) {
	b.Helper()
	const first = "local key, meta = KEYS[1], KEYS[2]\n"
	if n := strings.Count(src, first); n != 1 {
		b.Fatalf("a script holds %q %d times, want once: BenchmarkPoolsBound needs updating", first, n)
	}
	i := strings.Index(src, first)
	return src[:i], src[i:]
}

// leanAcquire and leanRelease are a pool key's membership as a script of
// its own that does what a pool's member needs and nothing else, in as
// few calls as it can: the key's override read, its queue looked at (a
// new member waits behind the acquires queued), the live members counted
// (ZCOUNT: nothing is pruned, so the members that expired stay), the
// member added with its record, and the keys' expiry moved when it must;
// then the member and its record removed, and the queue looked at for a
// head to wake. No shares, no caller, no shadow mode and no pruning: less
// than a pool of DESIGN §16-§20 does (BenchmarkPoolsBound's lean way).
//
//	KEYS: the key, its records, its override, its queue's expiries
//	ARGV: the member, its limit, TTL (ms) and record's fields
//	release KEYS: the key, its records, its queue; ARGV: the member
const (
	leanAcquire = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local o = redis.call('HMGET', KEYS[3], 'limit', 'expires_at')
if o[1] and o[2] and tonumber(o[2]) > now then
  limit = tonumber(o[1])
end
if redis.call('ZCARD', KEYS[4]) > 0 or
    redis.call('ZCOUNT', KEYS[1], '(' .. string.format('%d', now), '+inf') >= limit then
  return {0}
end
local expires = now + ttl
if redis.call('ZADD', KEYS[1], 'NX', expires, ARGV[1]) == 1 then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3] .. ';started=' .. string.format('%d', now) .. ARGV[4])
end
if redis.call('PEXPIRETIME', KEYS[1]) < expires + ttl then
  local at = string.format('%d', expires + 2 * ttl)
  redis.call('PEXPIREAT', KEYS[1], at)
  redis.call('PEXPIREAT', KEYS[2], at)
end
return {1}`
	leanRelease = `local released = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if released == 1 and redis.call('EXISTS', KEYS[3]) == 1 then
  return {1, 'a head to wake'}
end
return {released}`
)

// foldedAcquire and foldedRelease are leanAcquire's membership folded
// into fewer calls (BenchmarkPoolsBound's folded way): it has no record
// of its own (the user's slot's record names the pools its stream is a
// member of, and a member names its stream and user), the key's override
// and a mark of its queue are fields of one hash read at once (the mark:
// the time until which acquires may be queued, which each wait would
// move, so that it lapses by itself, and a marked key is refused here
// where the pool would look at its queue), and the key's expiry is set
// without reading it first, to twice the longest slot TTL a plan may
// have (tiers.MaxSlotTTL, a day), so that it never falls before a
// member's. Its release removes the member, and reads the mark to know
// whether to look for a head to wake.
//
//	KEYS: the key, its override (fields limit, expires_at, queued_until)
//	ARGV: the member, its limit, TTL (ms); release: the member
const (
	foldedAcquire = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local o = redis.call('HMGET', KEYS[2], 'limit', 'expires_at', 'queued_until')
if o[1] and o[2] and tonumber(o[2]) > now then
  limit = tonumber(o[1])
end
if (o[3] and tonumber(o[3]) > now) or
    redis.call('ZCOUNT', KEYS[1], '(' .. string.format('%d', now), '+inf') >= limit then
  return {0}
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], 172800000)
return {1}`
	foldedRelease = `local released = redis.call('ZREM', KEYS[1], ARGV[1])
if released == 1 and redis.call('HGET', KEYS[2], 'queued_until') then
  return {1, 'a head to look for'}
end
return {released}`
)

// leastAcquire and leastRelease are a membership that is only what any
// crash-safe capped membership is, in any design: a member of a sorted
// set whose score is its expiry, added while fewer than the limit are
// live, then removed (BenchmarkPoolsBound's least way). No record, no
// override, no queue, no expiry of the key, no pruning.
//
//	KEYS: the key; ARGV: the member, its limit, TTL (ms); release: the member
const (
	leastAcquire = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('ZCOUNT', KEYS[1], '(' .. string.format('%d', now), '+inf') >= tonumber(ARGV[2]) then
  return {0}
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
return {1}`
	leastRelease = "return {redis.call('ZREM', KEYS[1], ARGV[1])}"
)

// releaseParts are acquireParts' counterparts in the release script, for
// a membership that leaves: its record read and removed, pruning, the
// queue's head.
var releaseParts = []scriptPart{
	{"record", "local record = redis.call('HGET', meta, ARGV[1])\n", "local record = false\n"},
	{"prune", "local pruned = prune(key, meta, now)\n", "local pruned = 0\n"},
	{"record", "redis.call('HDEL', meta, ARGV[1])\n", ""},
	{"queue", "redis.call('EXISTS', queue) == 1", "false"},
}

// withoutAll returns src without any of parts (see without).
func withoutAll(b *testing.B, src string, parts []scriptPart) string {
	for _, p := range parts {
		src = without(b, src, p.cut, p.put)
	}
	return src
}

// TestTheBoundsMembershipsAreCappedAndExpire checks that the memberships
// BenchmarkPoolsBound's lean and least ways measure are what they stand
// for: a member is added while fewer than its limit are live and refused
// at the limit, a member that expired or was released frees its place,
// and the lean one's waits behind the acquires queued on its key.
func TestTheBoundsMembershipsAreCappedAndExpire(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		for _, way := range ownMemberships {
			key := newKey(t)
			run := func(src string, keys []string, args ...string) int64 {
				t.Helper()
				arr, err := c.Do(ctx, c.B().Eval().Script(src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).ToArray()
				if err != nil {
					t.Fatalf("%s: %v", way.name, err)
				}
				n, err := arr[0].AsInt64()
				if err != nil {
					t.Fatalf("%s: %v", way.name, err)
				}
				return n
			}
			grant := func(member, limit, ttl string) int64 {
				t.Helper()
				return run(way.acquire, pick(lua.AcquireKeys(key), way.acquireKeys), member, limit, ttl, ";plan=free")
			}
			for i, step := range []struct {
				member, limit, ttl string
				want               int64
			}{{"a", "2", "60000", 1}, {"b", "2", "60000", 1}, {"c", "2", "60000", 0}, {"c", "3", "1", 1}} {
				if got := grant(step.member, step.limit, step.ttl); got != step.want {
					t.Fatalf("%s: acquire %d (%s under %s) = %d, want %d", way.name, i, step.member, step.limit, got, step.want)
				}
			}
			time.Sleep(20 * time.Millisecond) // c's 1 ms are over
			if got := grant("d", "3", "60000"); got != 1 {
				t.Fatalf("%s: d under 3 with c expired = %d, want 1 (granted)", way.name, got)
			}
			if got := grant("e", "3", "60000"); got != 0 {
				t.Fatalf("%s: e under 3 with a, b, d live = %d, want 0 (refused)", way.name, got)
			}
			if got := run(way.release, pick(lua.ReleaseKeys(key), way.releaseKeys), "a"); got != 1 {
				t.Fatalf("%s: release of a = %d, want 1", way.name, got)
			}
			if got := grant("e", "3", "60000"); got != 1 {
				t.Fatalf("%s: e under 3 with a released = %d, want 1 (granted)", way.name, got)
			}
			// An acquire queued on the key (for folded, its mark): the
			// next member waits behind it. An override lowers the limit.
			var queued, override rueidis.Completed
			switch way.name {
			case "least":
				continue
			case "lean":
				queued = c.B().Zadd().Key(lua.AcquireKeys(key)[4]).ScoreMember().ScoreMember(1e15, "w").Build()
			case "folded":
				queued = c.B().Hset().Key(lua.AcquireKeys(key)[2]).FieldValue().FieldValue("queued_until", "1000000000000000").Build()
			}
			override = c.B().Hset().Key(lua.AcquireKeys(key)[2]).FieldValue().FieldValue("limit", "4").FieldValue("expires_at", "1000000000000000").Build()
			if err := c.Do(ctx, override).Error(); err != nil {
				t.Fatal(err)
			}
			if got := grant("f", "10", "60000"); got != 1 {
				t.Fatalf("%s: f under an override of 4 with b, d, e live = %d, want 1 (granted)", way.name, got)
			}
			if got := grant("g", "10", "60000"); got != 0 {
				t.Fatalf("%s: g under an override of 4 with 4 live = %d, want 0 (refused)", way.name, got)
			}
			if got := run(way.release, pick(lua.ReleaseKeys(key), way.releaseKeys), "f"); got != 1 {
				t.Fatalf("%s: release of f = %d, want 1", way.name, got)
			}
			if err := c.Do(ctx, queued).Error(); err != nil {
				t.Fatal(err)
			}
			if got := grant("g", "10", "60000"); got != 0 {
				t.Fatalf("%s: g with an acquire queued = %d, want 0 (refused)", way.name, got)
			}
		}
	})
}
