//go:build unix

package limiter_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/redis/rueidis"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/lua"
)

// BenchmarkRawAcquireRelease is BenchmarkAcquireRelease without the
// limiter: the same acquire and release scripts, with the same arguments,
// sent as EVALSHA through a bare rueidis client with rueidis' defaults
// (client-side caching off, as the limiter has it), by about 50 goroutines.
// No validation, no tier lookup, no spans, no observer, no deadline: what
// the limiter adds to a pair is its ops/s and cpu-us/op against this one's.
func BenchmarkRawAcquireRelease(b *testing.B) {
	eachBenchBackend(b, func(b *testing.B, e *env) {
		c := newRawClient(b, e)
		tier, ok := e.table.Lookup(benchPlan)
		if !ok {
			b.Fatalf("no plan %q in the test tiers", benchPlan)
		}
		limit, ttl := strconv.Itoa(tier.MaxConcurrentStreams), strconv.FormatInt(tier.SlotTTL.Milliseconds(), 10)
		record := ";plan=" + tier.Plan // the record's fields, as the library writes them (no caller)
		acquireSHA, releaseSHA := loadScript(b, c, "acquire"), loadScript(b, c, "release")
		// The limiter's key shape, <prefix>{<user>}, for users of the same pool.
		prefix := e.keys.Prefix + "{" + newUser(b) + "-"
		var granted atomic.Int64
		setBenchParallelism(b)
		redisCPU := reportRedisCPU(b, e)
		cpu := cpuTime()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			var g int64
			defer func() { granted.Add(g) }()
			for pb.Next() {
				key := prefix + strconv.Itoa(rand.IntN(benchUsers)) + "}"
				stream := benchStream()
				got, err := scriptInts(c.Do(ctx, c.B().Evalsha().Sha1(acquireSHA).Numkeys(3).Key(key, keys.SlotRecords(key), keys.Override(key)).Arg(stream, limit, ttl, record).Build()))
				if err != nil || len(got) != 7 {
					b.Errorf("EVALSHA acquire: %v, %v", got, err)
					return
				}
				if got[0] != 1 {
					continue
				}
				g++
				if got, err := scriptInts(c.Do(ctx, c.B().Evalsha().Sha1(releaseSHA).Numkeys(4).Key(key, keys.SlotRecords(key), keys.Queue(key), keys.QueueExpiry(key)).Arg(stream).Build())); err != nil || len(got) != 3 {
					b.Errorf("EVALSHA release: %v, %v", got, err)
					return
				}
			}
		})
		b.StopTimer()
		reportOps(b)
		reportCPU(b, cpu)
		redisCPU()
		b.ReportMetric(float64(granted.Load())/float64(b.N), "granted/op")
	})
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
