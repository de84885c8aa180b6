package lua_test

// Benchmarks of the scripts whose cost grows with a user's slot count: the
// slots listing and release_all read every member of the user's sorted set,
// and Redis serves nothing else on that shard while one runs. They run at
// the largest limit a tier accepts (tiers.MaxConcurrentStreams), on the
// standalone Redis of `make test` (LIMITER_TEST_REDIS).
//
// Besides ns/op (the round trip as the limiter sees it), each reports
// redis-µs/op: the time Redis itself spent in the script, from INFO
// commandstats, which is what the other users of the shard wait for. It is
// left out when other clients ran scripts on the server meanwhile.
//
//	go test -run '^$' -bench . ./pkg/lua   (with LIMITER_TEST_REDIS set)

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/joishi/limiter/pkg/tiers"
)

// fullUser is a user key holding tiers.MaxConcurrentStreams live slots.
type fullUser struct {
	c   rueidis.Client
	key string
}

// newFullUser connects to the test Redis and names a key of its own for b;
// fill puts the slots in. The key is deleted when b ends.
func newFullUser(b *testing.B) *fullUser {
	b.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{testenv.Redis(b)}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		b.Fatal(err)
	}
	u := &fullUser{c: c, key: fmt.Sprintf("joishi:streams:{bench-%s-%d}", b.Name(), time.Now().UnixNano())}
	b.Cleanup(func() {
		c.Do(context.Background(), c.B().Del().Key(u.key).Build())
		c.Close()
	})
	return u
}

// fill makes the key hold tiers.MaxConcurrentStreams slots, live for an
// hour of Redis time.
func (u *fullUser) fill(b *testing.B) {
	b.Helper()
	ctx := context.Background()
	now, err := u.c.Do(ctx, u.c.B().Time().Build()).AsStrSlice()
	if err != nil || len(now) != 2 {
		b.Fatalf("TIME = %v, %v", now, err)
	}
	sec, _ := strconv.ParseInt(now[0], 10, 64)
	expires := float64((sec + 3600) * 1000)
	zadd := u.c.B().Zadd().Key(u.key).ScoreMember()
	for i := range tiers.MaxConcurrentStreams {
		// Stream ids as the limiter generates them: 32 hex digits.
		zadd = zadd.ScoreMember(expires+float64(i), fmt.Sprintf("%032x", i))
	}
	if err := u.c.Do(ctx, zadd.Build()).Error(); err != nil {
		b.Fatal(err)
	}
}

// scriptStats is the cmdstat_evalsha line of INFO commandstats: script
// calls and the microseconds Redis spent in them.
type scriptStats struct{ calls, usec int64 }

func (u *fullUser) scriptStats(b *testing.B) scriptStats {
	b.Helper()
	info, err := u.c.Do(context.Background(), u.c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		b.Fatal(err)
	}
	var s scriptStats
	for line := range strings.Lines(info) {
		fields, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:")
		if !ok {
			continue
		}
		for field := range strings.SplitSeq(fields, ",") {
			name, value, _ := strings.Cut(field, "=")
			switch name {
			case "calls":
				s.calls, _ = strconv.ParseInt(value, 10, 64)
			case "usec":
				s.usec, _ = strconv.ParseInt(value, 10, 64)
			}
		}
	}
	return s
}

// reportRedisTime reports the Redis time per script call since before,
// when the calls since then are exactly this benchmark's calls.
func (u *fullUser) reportRedisTime(b *testing.B, before scriptStats, calls int) {
	b.Helper()
	after := u.scriptStats(b)
	if got := after.calls - before.calls; got != int64(calls) {
		b.Logf("redis-µs/op left out: %d script calls on the server during the run, %d of them ours", got, calls)
		return
	}
	b.ReportMetric(float64(after.usec-before.usec)/float64(calls), "redis-µs/op")
}

// BenchmarkSlots lists a user holding 1000 live slots (the admin API's
// GET /v1/admin/users/{id}/slots).
func BenchmarkSlots(b *testing.B) {
	u := newFullUser(b)
	u.fill(b)
	ctx := context.Background()
	// Loads the script, so the run measures EVALSHA only.
	if _, err := lua.Slots(ctx, u.c, u.key, 1000); err != nil {
		b.Fatal(err)
	}
	before := u.scriptStats(b)
	calls := 0
	for b.Loop() {
		listing, err := lua.Slots(ctx, u.c, u.key, 1000)
		if err != nil {
			b.Fatal(err)
		}
		if len(listing.Slots) != tiers.MaxConcurrentStreams {
			b.Fatalf("listed %d slots, want %d", len(listing.Slots), tiers.MaxConcurrentStreams)
		}
		calls++
	}
	u.reportRedisTime(b, before, calls)
}

// BenchmarkReleaseAll releases every slot of a user holding 1000 live
// slots (the admin API's POST /v1/admin/users/{id}/release). The refill
// between calls is not timed, and is no script.
func BenchmarkReleaseAll(b *testing.B) {
	u := newFullUser(b)
	ctx := context.Background()
	if _, err := lua.ReleaseAll(ctx, u.c, u.key, u.key+":released:warm-up", time.Minute); err != nil {
		b.Fatal(err)
	}
	before := u.scriptStats(b)
	calls := 0
	for b.Loop() {
		b.StopTimer()
		u.fill(b)
		b.StartTimer()
		got, err := lua.ReleaseAll(ctx, u.c, u.key, u.key+":released:"+strconv.Itoa(calls), time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		if len(got.IDs) != tiers.MaxConcurrentStreams {
			b.Fatalf("released %d slots, want %d", len(got.IDs), tiers.MaxConcurrentStreams)
		}
		calls++
	}
	u.reportRedisTime(b, before, calls)
}
