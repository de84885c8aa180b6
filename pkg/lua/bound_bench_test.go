package lua_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

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
//     acquires in one pipeline, the user's release, then the keys');
//   - inside: the same scripts' work run inside the user's own call, one
//     each way: the memberships without a call of their own;
//   - bare: the same, each membership stripped to its slot (no record, no
//     pruning, no override, no queue): what a membership costs at least
//     while it is a member of a sorted set that carries its own expiry.
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

// boundTurn is how many pairs each way of BenchmarkPoolsBound makes
// before the next takes its turn; boundPipeline, how many pairs' acquires
// (then releases) one round trip sends.
const (
	boundTurn     = 2000
	boundPipeline = 50
)

// boundWay is one way of BenchmarkPoolsBound: pairs sends n pairs' acquires in one
// pipeline, then their releases; calls is the script calls a pair makes.
type boundWay struct {
	name  string
	calls int
	pairs func(b *testing.B, u *fullUser, n int)
}

// boundPair is one pair's stream: its user's keys and two pool keys, with
// the arguments the limiter would send for them.
type boundPair struct {
	user, model, org   string
	userArgs, poolArgs []string
	stream, member     string
}

var boundSeq int

func newBoundPair(u *fullUser) boundPair {
	boundSeq++
	id := strconv.Itoa(boundSeq)
	user, stream := "u"+id, "s"+id
	model, org := "m"+strconv.Itoa(boundSeq%16), "o"+strconv.Itoa(boundSeq%100)
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

// boundWays are the ways of BenchmarkPoolsBound, none first, their scripts
// loaded on c.
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
	// joined runs each pair's acquire and release as one call each: of
	// acq and rel, which take the user's keys, then the two pool keys'.
	joined := func(acq, rel string) func(b *testing.B, u *fullUser, n int) {
		return func(b *testing.B, u *fullUser, n int) {
			var acqs, rels rueidis.Commands
			for range n {
				p := newBoundPair(u)
				acqs = append(acqs, ev(acq, append(append(append([]string{}, p.userArgs...), p.poolArgs...), p.poolArgs...),
					lua.AcquireKeys(p.user), lua.AcquireKeys(p.model), lua.AcquireKeys(p.org)))
				rels = append(rels, ev(rel, []string{p.stream, "", p.member, "", p.member, ""},
					lua.ReleaseKeys(p.user), lua.ReleaseKeys(p.model), lua.ReleaseKeys(p.org)))
			}
			boundSend(b, u.c, acqs, rels)
		}
	}
	return []boundWay{
		{"none", 2, func(b *testing.B, u *fullUser, n int) {
			var acqs, rels rueidis.Commands
			for range n {
				p := newBoundPair(u)
				acqs = append(acqs, ev(acq, p.userArgs, lua.AcquireKeys(p.user)))
				rels = append(rels, ev(rel, []string{p.stream, ""}, lua.ReleaseKeys(p.user)))
			}
			boundSend(b, u.c, acqs, rels)
		}},
		{"sent", 6, func(b *testing.B, u *fullUser, n int) {
			var acqs, rels, leaves rueidis.Commands
			for range n {
				p := newBoundPair(u)
				acqs = append(acqs, ev(acq, p.userArgs, lua.AcquireKeys(p.user)),
					ev(acq, p.poolArgs, lua.AcquireKeys(p.model)), ev(acq, p.poolArgs, lua.AcquireKeys(p.org)))
				rels = append(rels, ev(rel, []string{p.stream, ""}, lua.ReleaseKeys(p.user)))
				leaves = append(leaves, ev(rel, []string{p.member, ""}, lua.ReleaseKeys(p.model)),
					ev(rel, []string{p.member, ""}, lua.ReleaseKeys(p.org)))
			}
			boundSend(b, u.c, acqs, rels, leaves)
		}},
		{"inside", 2, joined(insideAcq, insideRel)},
		{"bare", 2, joined(bareAcq, bareRel)},
	}
}

// boundSend sends each of pipelines in turn, one round trip each, and
// fails b unless every script answered 1 first (granted a new slot, or
// released one): each user's and each key's, of a call that runs several.
func boundSend(b *testing.B, c rueidis.Client, pipelines ...rueidis.Commands) {
	for _, cmds := range pipelines {
		for _, resp := range c.DoMulti(context.Background(), cmds...) {
			arr, err := resp.ToArray()
			if err != nil {
				b.Fatal(err)
			}
			answers := [][]rueidis.RedisMessage{arr}
			if len(arr) > 0 && arr[0].IsArray() { // one call's answers, a script's each
				answers = answers[:0]
				for _, m := range arr {
					a, err := m.ToArray()
					if err != nil {
						b.Fatal(err)
					}
					answers = append(answers, a)
				}
			}
			for _, a := range answers {
				if n, err := a[0].AsInt64(); err != nil || n != 1 {
					b.Fatalf("a script answered %v, want 1 first (granted, released)", a)
				}
			}
		}
	}
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
