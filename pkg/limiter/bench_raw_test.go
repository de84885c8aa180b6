//go:build unix

package limiter_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/lua"
)

// BenchmarkAcquireReleaseVsRaw is BenchmarkAcquireRelease next to the
// same pairs without the limiter: the same acquire and release scripts,
// with the same arguments, sent as EVALSHA through a bare rueidis client
// with rueidis' defaults (client-side caching off, as the limiter has it).
// No validation, no tier lookup, no spans, no observer, no deadline.
//
// Both sides make b.N pairs with about 50 goroutines, in turns (library,
// raw, raw, library, ...; benchTurns each), so that a change in the
// machine's speed during the run falls on both sides alike. Each side
// reports its pairs/s over its own turns, its client CPU per pair (this
// process) and Redis' CPU per pair (every server): library-pairs/s,
// raw-pairs/s, library-cpu-us/pair, raw-cpu-us/pair,
// library-redis-cpu-us/pair and raw-redis-cpu-us/pair.
func BenchmarkAcquireReleaseVsRaw(b *testing.B) {
	eachBenchBackend(b, func(b *testing.B, e *env) {
		c := newRawClient(b, e)
		tier, ok := e.table.Lookup(benchPlan)
		if !ok {
			b.Fatalf("no plan %q in the test tiers", benchPlan)
		}
		limit, ttl := strconv.Itoa(tier.MaxConcurrentStreams), strconv.FormatInt(tier.SlotTTL.Milliseconds(), 10)
		record := ";plan=" + tier.Plan // the record's fields, as the library writes them (no caller)
		acquireSHA, releaseSHA := loadScript(b, c, "acquire"), loadScript(b, c, "release")
		run := newUser(b)
		// The limiter's key shape, <prefix>{<user>}, for users of the same pool.
		prefix := e.keys.Prefix + "{" + run + "-raw-"
		library := func(ctx context.Context) (bool, error) {
			user := benchUser(run)
			res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: benchPlan, StreamID: benchStream()})
			if err != nil || res.Degraded {
				return false, fmt.Errorf("Acquire: %+v, %v", res, err)
			}
			if !res.Granted {
				return false, nil
			}
			if rel, err := e.lim.Release(ctx, user, res.StreamID); err != nil || rel.Degraded {
				return true, fmt.Errorf("Release: %+v, %v", rel, err)
			}
			return true, nil
		}
		raw := func(ctx context.Context) (bool, error) {
			key := prefix + strconv.Itoa(rand.IntN(benchUsers)) + "}"
			stream := benchStream()
			got, err := scriptInts(c.Do(ctx, c.B().Evalsha().Sha1(acquireSHA).Numkeys(int64(len(lua.AcquireKeys(key)))).Key(lua.AcquireKeys(key)...).Arg(stream, limit, ttl, record).Build()))
			if err != nil || len(got) != lua.AcquireReplyLen {
				return false, fmt.Errorf("EVALSHA acquire: %v, %v", got, err)
			}
			if got[0] != 1 {
				return false, nil
			}
			if got, err := scriptInts(c.Do(ctx, c.B().Evalsha().Sha1(releaseSHA).Numkeys(int64(len(lua.ReleaseKeys(key)))).Key(lua.ReleaseKeys(key)...).Arg(stream).Build())); err != nil || len(got) != 4 {
				return true, fmt.Errorf("EVALSHA release: %v, %v", got, err)
			}
			return true, nil
		}
		servers := scaleServers(b, e.raw(b))
		wrapped := limiter.WrappedCalls(e.lim)
		sides := pairsInTurns(b, servers, library, raw)
		for i, name := range []string{"library", "raw"} {
			s := sides[i]
			b.ReportMetric(float64(b.N)/s.wall.Seconds(), name+"-pairs/s")
			b.ReportMetric(float64(s.cpu.Microseconds())/float64(b.N), name+"-cpu-us/pair")
			b.ReportMetric(s.redisUS/float64(b.N), name+"-redis-cpu-us/pair")
		}
		b.ReportMetric(float64(min(sides[0].granted, sides[1].granted))/float64(b.N), "granted/op")
		// The share of the library's calls that ran in a goroutine of
		// their own rather than in the caller's (see Limiter's deadline).
		b.ReportMetric(float64(limiter.WrappedCalls(e.lim)-wrapped)/float64(2*b.N), "wrapped/call")
	})
}

// benchTurns is the number of turns each side of BenchmarkAcquireReleaseVsRaw takes.
const benchTurns = 4

// turnCost is what one side of pairsInTurns spent over its turns.
type turnCost struct {
	wall, cpu time.Duration
	redisUS   float64 // every server's CPU, µs
	granted   int64
}

// pairsInTurns makes b.N pairs with each of sides, benchClients goroutines
// at a time, in turns A B B A A B B A: benchTurns turns each, each turn a
// share of b.N. It stops b's timer between turns, while it reads the
// servers' CPU.
func pairsInTurns(b *testing.B, servers *scaleNodes, sides ...func(context.Context) (bool, error)) []turnCost {
	b.Helper()
	costs := make([]turnCost, len(sides))
	b.ResetTimer()
	for turn := range benchTurns * len(sides) {
		side := turn % len(sides)
		if turn/len(sides)%2 == 1 {
			side = len(sides) - 1 - side
		}
		// Turn t of a side makes the pairs from t*N/turns to (t+1)*N/turns.
		t := turn / len(sides)
		n := int64((t+1)*b.N/benchTurns - t*b.N/benchTurns)
		b.StopTimer()
		redis := servers.cpu(b)
		b.StartTimer()
		start, cpu := time.Now(), cpuTime()
		var left, granted atomic.Int64
		left.Store(n)
		var wg sync.WaitGroup
		for range benchClients {
			wg.Go(func() {
				ctx := context.Background()
				var g int64
				defer func() { granted.Add(g) }()
				for left.Add(-1) >= 0 {
					ok, err := sides[side](ctx)
					if err != nil {
						b.Error(err)
						return
					}
					if ok {
						g++
					}
				}
			})
		}
		wg.Wait()
		c := &costs[side]
		c.wall += time.Since(start)
		c.cpu += cpuTime() - cpu
		b.StopTimer()
		after := servers.cpu(b)
		c.redisUS += after.masters + after.replicas - redis.masters - redis.replicas
		c.granted += granted.Load()
		b.StartTimer()
	}
	b.StopTimer()
	return costs
}

// scriptInts reads a script's answer, an array, as integers; an element
// that is none (a list of stream ids, a stream id) reads as 0.
func scriptInts(resp rueidis.RedisResult) ([]int64, error) {
	arr, err := resp.ToArray()
	if err != nil {
		return nil, err
	}
	out := make([]int64, len(arr))
	for i, m := range arr {
		out[i], _ = m.AsInt64()
	}
	return out, nil
}

// newRawClient returns a bare rueidis client on e's servers, closed when b
// ends.
func newRawClient(b *testing.B, e *env) rueidis.Client {
	b.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: e.redis.Addrs(), DisableCache: true})
	if err != nil {
		b.Fatalf("rueidis.NewClient: %v", err)
	}
	b.Cleanup(c.Close)
	return c
}

// loadScript loads the limiter's script name (lua.Sources) on every node
// of c and returns its SHA1, so the benchmark sends EVALSHA only.
func loadScript(b *testing.B, c rueidis.Client, name string) string {
	b.Helper()
	src, ok := lua.Sources()[name]
	if !ok {
		b.Fatalf("no script %q in lua.Sources", name)
	}
	sha := ""
	for addr, node := range c.Nodes() {
		got, err := node.Do(context.Background(), node.B().ScriptLoad().Script(src).Build()).ToString()
		if err != nil {
			b.Fatalf("SCRIPT LOAD %s on %s: %v", name, addr, err)
		}
		sha = got
	}
	return sha
}
