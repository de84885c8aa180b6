package lua_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/joishi/limiter/pkg/lua"
)

// BenchmarkAcquireParts profiles the acquire script as a pool key runs it
// (a new member of one key, with its record, nobody waiting, no
// override): the Redis time of one call of the whole script, of the call
// alone (a script that takes the same keys and arguments and returns
// 1), and of each part, as the whole script's time less that of the
// script without the part; and of the release script that gives the
// whole script's members back. A pool's membership runs these scripts,
// so they are what each pool an acquire joins costs Redis, beside the
// user's own slot (DESIGN §21): hack/bench.sh prints them.
//
// Each variant makes b.N acquires of new members, in pipelines of
// acquirePartsPipeline, and reads the Redis time from INFO
// commandstats: it reports nothing when other clients ran scripts on the
// server meanwhile.
func BenchmarkAcquireParts(b *testing.B) {
	u := newFullUser(b)
	whole := lua.Sources()["acquire"]
	variants := []struct{ name, src string }{
		{"whole", whole},
		{"call", "return 1"},
	}
	for _, p := range acquireParts {
		variants = append(variants, struct{ name, src string }{p.name, without(b, whole, p.cut, p.put)})
	}
	// In turns of acquirePartsTurn calls, each on a fresh key: every
	// variant sees the same machine and keys of the same sizes.
	us := map[string]float64{}
	alone := true // no other client ran scripts on the server meanwhile
	for done := 0; done < b.N; done += acquirePartsTurn {
		for _, v := range variants {
			acquired, released, ok := u.acquireTime(b, v.src, min(acquirePartsTurn, b.N-done), v.name == "whole")
			us[v.name] += acquired / float64(b.N)
			us["release"] += released / float64(b.N)
			alone = alone && ok
		}
	}
	if !alone {
		b.Log("profile left out: other clients ran scripts on the server meanwhile")
		return
	}
	b.ReportMetric(us["whole"], "whole-redis-µs/call")
	b.ReportMetric(us["call"], "call-redis-µs/call")
	b.ReportMetric(us["release"], "release-redis-µs/call")
	for _, p := range acquireParts {
		b.ReportMetric(us["whole"]-us[p.name], p.name+"-redis-µs/call")
	}
}

// scriptPart is a part of a script: the line that does it (cut) and what
// stands in for it without it (put).
type scriptPart struct{ name, cut, put string }

// acquireParts are the parts of the acquire script BenchmarkAcquireParts
// profiles, one at a time, and BenchmarkPoolsBound strips a membership of
// all at once: its record, pruning, the key's override, its queue.
var acquireParts = []scriptPart{
	{"record", "    redis.call('HSET', meta, member, record)\n", ""},
	{"prune", "local pruned = prune(key, meta, now)\n", "local pruned = 0\n"},
	{"override", "local o = redis.call('HMGET', KEYS[3], 'limit', 'expires_at')\n", "local o = {}\n"},
	{"queue", "local waiting = redis.call('ZCARD', expiry)\n", "local waiting = 0\n"},
}

// acquirePartsTurn is how many acquires each variant of
// BenchmarkAcquireParts makes before the next takes its turn.
const acquirePartsTurn = 5000

// acquirePartsPipeline is how many acquires one round trip of
// BenchmarkAcquireParts sends.
const acquirePartsPipeline = 100

// without returns src with the line cut replaced by put (none when not
// given); b fails when src does not hold cut once, so that a change of the
// script cannot make the profile measure nothing.
func without(b *testing.B, src, cut string, put ...string) string {
	b.Helper()
	if n := strings.Count(src, cut); n != 1 {
		b.Fatalf("the script holds %q %d times, want once: the profile's parts need updating", cut, n)
	}
	return strings.Replace(src, cut, strings.Join(put, ""), 1)
}

// acquireTime runs src n times as the acquire script, each call a new
// member of a fresh pool key (as a pool's membership: "<stream> <user>",
// its user in the record), and returns the Redis µs of the n calls, and
// whether they were the only script calls the server ran meanwhile; then,
// when release, it releases them with the release script and reports
// that script's µs and calls too.
func (u *fullUser) acquireTime(b *testing.B, src string, n int, release bool) (acquired, released float64, alone bool) {
	b.Helper()
	key := fmt.Sprintf("%s:pool-%d", u.key, time.Now().UnixNano())
	b.Cleanup(func() { u.c.Do(context.Background(), u.c.B().Del().Key(lua.AcquireKeys(key)...).Build()) })
	member := func(i int) string { return "s" + strconv.Itoa(i) + " u" + strconv.Itoa(i) }
	acquired, alone = u.scriptTime(b, src, lua.AcquireKeys(key), n, func(i int) []string {
		user := "u" + strconv.Itoa(i)
		return []string{member(i), "1000000", "120000", ";plan=free;user=" + strconv.Itoa(len(user)) + ":" + user, "1"}
	})
	if release {
		var ok bool
		released, ok = u.scriptTime(b, lua.Sources()["release"], lua.ReleaseKeys(key), n, func(i int) []string { return []string{member(i), ""} })
		alone = alone && ok
	}
	return acquired, released, alone
}

// scriptTime runs src n times on keys, the i-th call with args(i), in
// pipelines of acquirePartsPipeline, and returns the Redis µs of the n
// calls, and whether they were the only script calls the server ran
// meanwhile.
func (u *fullUser) scriptTime(b *testing.B, src string, keys []string, n int, args func(i int) []string) (usec float64, alone bool) {
	b.Helper()
	ctx := context.Background()
	c := u.c
	sha, err := c.Do(ctx, c.B().ScriptLoad().Script(src).Build()).ToString()
	if err != nil {
		b.Fatal(err)
	}
	before := u.scriptStats(b)
	for done := 0; done < n; done += acquirePartsPipeline {
		cmds := make(rueidis.Commands, 0, acquirePartsPipeline)
		for i := done; i < min(n, done+acquirePartsPipeline); i++ {
			cmds = append(cmds, c.B().Evalsha().Sha1(sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args(i)...).Build())
		}
		for _, resp := range c.DoMulti(ctx, cmds...) {
			if err := resp.Error(); err != nil {
				b.Fatal(err)
			}
		}
	}
	after := u.scriptStats(b)
	return float64(after.usec - before.usec), after.calls-before.calls == int64(n)
}
