//go:build unix

package limiter_test

// Benchmarks of pools (DESIGN §16, §21), read as ratios in hack/bench.sh:
// an acquire+release that joins two pools against one that joins none, on
// the same limiter in the same run; the pairs one hot pool key serves
// against redis-benchmark running the pool's script on that key; and
// Redis' CPU per stream of a heartbeat round with two pools against none.

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/benchenv"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/joishi/limiter/pkg/pools"
)

// Pools of the benchmarks: model with benchModels keys and org with
// benchOrgs, capped far above what a run holds at once, so every acquire
// is granted; hot, one key (benchHotKey) every stream of
// BenchmarkPoolKeyHot joins.
const (
	benchModels = 16
	benchOrgs   = 100
	benchHotKey = "hot"
)

func benchPools(b *testing.B) *pools.Table {
	b.Helper()
	limit := pools.MaxConcurrentStreams
	return poolTable(b,
		pools.Pool{Pool: "model", MaxConcurrentStreams: &limit},
		pools.Pool{Pool: "org", MaxConcurrentStreams: &limit},
		pools.Pool{Pool: "hot", MaxConcurrentStreams: &limit},
	)
}

// benchJoin returns the pools one op of a benchmark joins: none, two
// (a model and an org of the user's), or the one hot key.
type benchJoin func(user int) map[string]string

var (
	joinNone benchJoin = func(int) map[string]string { return nil }
	joinTwo  benchJoin = func(user int) map[string]string {
		return map[string]string{"model": "m" + strconv.Itoa(user%benchModels), "org": "o" + strconv.Itoa(user%benchOrgs)}
	}
	joinHot benchJoin = func(int) map[string]string { return map[string]string{"hot": benchHotKey} }
)

// BenchmarkPoolsAcquireRelease: BenchmarkAcquireRelease with each stream
// joining no pool and two pools (a model's and an org's) on one limiter,
// b.N pairs each way, the two ways in turns of benchTurn pairs. It
// reports, per way (none-, two-): pairs/s, the acquire's median
// latency, acquire-p50-us, and this process's CPU per pair,
// client-cpu-us/pair (the limiter's and the benchmark's callers'), and,
// but for the scripts alone, the Redis servers' CPU per pair
// (servers-cpu-us/pair) and the machine's (machine-cpu-us/pair, with
// machine-busy, the share of its processors' time that was busy). At
// full load that latency is the queue of every caller's calls, and
// follows pairs/s; so both ways run once more, in turns, paced at half of
// the pairs/s joining two pools made, for the latency the pools add at
// one load (paced-acquire-p50-us), beside the same pairs made by the
// scripts alone on the limiter's client, none of its code on the way
// (none-sent-paced-, two-sent-paced-; see scriptsAlone), and at last at a
// light load, benchenv.LightRate, over benchLightPairs pairs at most
// (light-acquire-p50-us), again beside the scripts alone (none-sent-light-,
// two-sent-light-): on a cluster too, the least latency the pools' calls
// allow where no queue forms.
func BenchmarkPoolsAcquireRelease(b *testing.B) {
	eachBenchBackendWith(b, limiter.Options{Pools: benchPools(b)}, func(b *testing.B, e *env) {
		servers := scaleServers(b, e.raw(b))
		ways := []*pairWay{{name: "none", join: joinNone, servers: servers}, {name: "two", join: joinTwo, servers: servers}}
		b.ResetTimer()
		for done := 0; done < b.N; done += benchTurn {
			for _, w := range ways {
				w.run(b, e, min(benchTurn, b.N-done))
			}
		}
		b.StopTimer()
		for _, w := range ways {
			w.report(b)
		}
		rate := float64(ways[1].pairs) / ways[1].wall.Seconds() / 2
		sent := scriptsAlone(b, e)
		paced := []*pairWay{{name: "none-paced", join: joinNone, rate: rate, servers: servers}, {name: "two-paced", join: joinTwo, rate: rate, servers: servers},
			{name: "none-sent-paced", join: joinNone, rate: rate, sent: sent}, {name: "two-sent-paced", join: joinTwo, rate: rate, sent: sent}}
		for done := 0; done < b.N; done += benchTurn {
			for _, w := range paced {
				w.run(b, e, min(benchTurn, b.N-done))
			}
		}
		for _, w := range paced {
			w.report(b)
		}
		b.ReportMetric(rate, "paced-pairs/s")
		// And at a light load, where no queue forms: the latency of the
		// calls themselves.
		light := []*pairWay{{name: "none-light", join: joinNone, rate: benchenv.LightRate, servers: servers}, {name: "two-light", join: joinTwo, rate: benchenv.LightRate, servers: servers},
			{name: "none-sent-light", join: joinNone, rate: benchenv.LightRate, sent: sent}, {name: "two-sent-light", join: joinTwo, rate: benchenv.LightRate, sent: sent}}
		n := min(b.N, benchLightPairs)
		for done := 0; done < n; done += benchTurn {
			for _, w := range light {
				w.run(b, e, min(benchTurn, n-done))
			}
		}
		for _, w := range light {
			w.report(b)
		}
	})
}

// BenchmarkPoolKeyHot: every stream joins one pool key, the most a pool
// key serves: pairs/s (ops/s), and Redis CPU per pair on the master that
// holds the key (hot-master-cpu-us/op), on all the servers
// (servers-cpu-us/pair), in this process (client-cpu-us/pair) and on
// the whole machine (machine-cpu-us/pair, and machine-busy, the share of
// its processors' time that was busy). hack/bench.sh compares the pairs
// with redis-benchmark running the acquire script on that key alone, and
// reads from these what the key's master, and the machine's cores with
// the servers alone on them, would allow.
func BenchmarkPoolKeyHot(b *testing.B) {
	eachBenchBackendWith(b, limiter.Options{Pools: benchPools(b)}, func(b *testing.B, e *env) {
		servers := scaleServers(b, e.raw(b))
		w := &pairWay{join: joinHot, servers: servers}
		before := mastersCPU(b, servers)
		b.ResetTimer()
		w.run(b, e, b.N)
		b.StopTimer()
		after := mastersCPU(b, servers)
		hottest := 0.0
		for i := range after {
			hottest = max(hottest, after[i]-before[i])
		}
		w.report(b)
		b.ReportMetric(hottest/float64(b.N), "hot-master-cpu-us/op")
	})
}

// scriptsAlone returns a way to make a pair as the limiter does, with
// none of its code: the scripts it runs, with the arguments it gives
// them, sent on its own Redis client (so on the same connections) from
// the caller's goroutine, the user's acquire and its pools' in one
// pipeline, then the user's release and the leaves of its pools in one
// (on a cluster, one per node), as the limiter's Release sends them for
// a stream it granted (see Limiter.Release).
// It returns the acquire's time, and an error unless each script granted,
// then released.
func scriptsAlone(b *testing.B, e *env) func(ctx context.Context, user, stream string, pools map[string]string) (time.Duration, error) {
	c := e.raw(b)
	tier, ok := e.table.Lookup(benchPlan)
	if !ok {
		b.Fatalf("no plan %q in the test tiers", benchPlan)
	}
	limit := pools.MaxConcurrentStreams // benchPools' caps
	return func(ctx context.Context, user, stream string, named map[string]string) (time.Duration, error) {
		key, err := e.keys.UserKey(user)
		if err != nil {
			return 0, err
		}
		names := slices.Sorted(maps.Keys(named))
		held := make([]lua.PoolKey, len(names))
		slots := make([]string, len(names))
		for i, name := range names {
			held[i] = lua.PoolKey{Pool: name, Key: named[name]}
			if slots[i], err = e.keys.PoolKey(name, named[name]); err != nil {
				return 0, err
			}
		}
		acqs := []lua.AcquireArgs{{Key: key, StreamID: stream, Limit: tier.MaxConcurrentStreams, TTL: tier.SlotTTL,
			Rec: lua.Record{Plan: tier.Plan, Pools: lua.EncodePools(held)}}}
		member := stream + " " + user
		for _, s := range slots {
			acqs = append(acqs, lua.AcquireArgs{Key: s, StreamID: member, Limit: limit, TTL: tier.SlotTTL, Rec: lua.Record{Plan: tier.Plan, User: user}})
		}
		start := time.Now()
		gots, errs := lua.AcquireAll(ctx, c, acqs, e.redis.NodeOf)
		took := time.Since(start)
		for i, got := range gots {
			if errs[i] != nil || !got.Granted {
				return took, fmt.Errorf("the acquire script on %s: %+v, %v; want granted", acqs[i].Key, got, errs[i])
			}
		}
		if len(slots) == 0 {
			rel, err := lua.Release(ctx, c, "", key, stream)
			if err != nil || !rel.Released {
				return took, fmt.Errorf("the release script: %+v, %v; want released", rel, err)
			}
			return took, nil
		}
		at := []lua.Member{{Key: key, ID: stream}}
		for _, s := range slots {
			at = append(at, lua.Member{Key: s, ID: member})
		}
		left, errs := lua.ReleaseAt(ctx, c, "", at, e.redis.NodeOf)
		for i, got := range left {
			if errs[i] != nil || !got.Released {
				return took, fmt.Errorf("the release script on %s: %+v, %v; want released", at[i].Key, got, errs[i])
			}
		}
		return took, nil
	}
}

// benchLightPairs is how many pairs each way of
// BenchmarkPoolsAcquireRelease runs at its light load (benchenv.LightRate).
const benchLightPairs = 4000

// benchTurn is how many pairs one way runs before the other takes its
// turn: both see the same machine, whatever else runs on it.
const benchTurn = 2000

// pairWay is one way of running acquire+release pairs: the pools each
// stream joins (join), and what its runs measured.
type pairWay struct {
	name string // prefixes its metrics; "" for none
	join benchJoin
	// sent, when set, makes each pair instead of the limiter: the scripts
	// alone (see scriptsAlone). It returns the acquire's time.
	sent func(ctx context.Context, user, stream string, pools map[string]string) (time.Duration, error)
	rate float64 // pairs/s the callers start at most, in all; 0: as fast as they can
	// servers, when set, are the deployment's Redis servers, whose CPU
	// in w's runs (serversCPU, µs) is reported beside the machine's
	// (machine): what a pair costs each part of the machine.
	servers    *scaleNodes
	serversCPU float64
	pairs      int
	wall       time.Duration
	cpu        time.Duration    // this process's, in its runs
	machine    benchenv.Machine // the machine's, in its runs
	took       []time.Duration  // each acquire's
}

// run runs n acquire+release pairs of random users' streams with about
// benchClients callers, each joining w's pools, at w.rate when set.
func (w *pairWay) run(b *testing.B, e *env, n int) {
	run := newUser(b)
	var next atomic.Int64
	var mu sync.Mutex
	start := time.Now()
	var wg sync.WaitGroup
	var servers scaleCPU
	var machine benchenv.Machine
	if w.servers != nil {
		servers = w.servers.cpu(b)
		machine = benchenv.ReadMachine(b)
	}
	cpu := cpuTime()
	for range benchClients {
		wg.Go(func() {
			ctx := context.Background()
			var mine []time.Duration
			defer func() { mu.Lock(); w.took = append(w.took, mine...); mu.Unlock() }()
			for {
				k := next.Add(1)
				if k > int64(n) {
					break
				}
				if w.rate > 0 { // pair k starts k/rate after the first
					time.Sleep(time.Until(start.Add(time.Duration(float64(k) / w.rate * float64(time.Second)))))
				}
				u := rand.IntN(benchUsers)
				user := run + "-" + strconv.Itoa(u)
				if w.sent != nil {
					took, err := w.sent(ctx, user, benchStream(), w.join(u))
					mine = append(mine, took)
					if err != nil {
						b.Error(err)
						return
					}
					continue
				}
				// The request is made before the clock starts, as the
				// scripts alone make their arguments before theirs.
				req := limiter.AcquireRequest{UserID: user, Plan: benchPlan, StreamID: benchStream(), Pools: w.join(u)}
				t0 := time.Now()
				res, err := e.lim.Acquire(ctx, req)
				mine = append(mine, time.Since(t0))
				if err != nil || !res.Granted || res.Degraded {
					b.Errorf("Acquire: %+v, %v; want granted from Redis", res, err)
					return
				}
				if rel, err := e.lim.Release(ctx, user, res.StreamID); err != nil || rel.Degraded {
					b.Errorf("Release: %+v, %v; want answered by Redis", rel, err)
					return
				}
			}
		})
	}
	wg.Wait()
	w.wall += time.Since(start)
	w.cpu += cpuTime() - cpu
	if w.servers != nil {
		w.machine = w.machine.Add(benchenv.ReadMachine(b).Sub(machine))
		after := w.servers.cpu(b)
		w.serversCPU += after.masters + after.replicas - servers.masters - servers.replicas
	}
	w.pairs += n
	if b.Failed() {
		b.FailNow()
	}
}

// report reports w's pairs/s and acquire-p50-us.
func (w *pairWay) report(b *testing.B) {
	prefix := ""
	if w.name != "" {
		prefix = w.name + "-"
	}
	b.ReportMetric(float64(w.pairs)/w.wall.Seconds(), prefix+"pairs/s")
	b.ReportMetric(float64(w.cpu.Microseconds())/float64(w.pairs), prefix+"client-cpu-us/pair")
	if w.servers != nil {
		b.ReportMetric(w.serversCPU/float64(w.pairs), prefix+"servers-cpu-us/pair")
	}
	if w.machine.All > 0 { // servers set, on Linux
		b.ReportMetric(float64(w.machine.Busy.Microseconds())/float64(w.pairs), prefix+"machine-cpu-us/pair")
		b.ReportMetric(w.machine.BusyShare(), prefix+"machine-busy")
	}
	slices.Sort(w.took)
	if len(w.took) > 0 {
		b.ReportMetric(float64(w.took[len(w.took)/2].Microseconds()), prefix+"acquire-p50-us")
	}
}

// BenchmarkPoolsHeartbeat: one op is one HeartbeatBatch of benchBatch
// held streams of different users for each way: streams that join no
// pool (none-), two pools (two-), or all the one hot key (hot-). Reports
// Redis CPU per stream refreshed (redis-cpu-us/stream: masters and
// replicas; replicas-cpu-us/stream: the replicas' part) and slots/s, per
// way.
func BenchmarkPoolsHeartbeat(b *testing.B) {
	eachBenchBackendWith(b, limiter.Options{Pools: benchPools(b)}, func(b *testing.B, e *env) {
		servers := scaleServers(b, e.raw(b))
		ways := []struct {
			name string
			join benchJoin
		}{{"none", joinNone}, {"two", joinTwo}, {"hot", joinHot}}
		reqs := make([][]limiter.HeartbeatRequest, len(ways))
		for i, w := range ways {
			reqs[i] = acquireBenchSlots(b, e, w.join)
		}
		ctx := context.Background()
		cpu, rep := make([]float64, len(ways)), make([]float64, len(ways))
		wall := make([]time.Duration, len(ways))
		b.ResetTimer()
		for range b.N {
			for i := range ways {
				before, start := servers.cpu(b), time.Now()
				results, errs := e.lim.HeartbeatBatch(ctx, reqs[i])
				wall[i] += time.Since(start)
				after := servers.cpu(b)
				cpu[i] += after.masters + after.replicas - before.masters - before.replicas
				rep[i] += after.replicas - before.replicas
				for j, err := range errs {
					if err != nil || !results[j].Alive || results[j].Degraded {
						b.Fatalf("HeartbeatBatch %s: stream %d: %+v, %v; want alive and not degraded", ways[i].name, j, results[j], err)
					}
				}
			}
		}
		b.StopTimer()
		for i, w := range ways {
			b.ReportMetric(float64(b.N*benchBatch)/wall[i].Seconds(), w.name+"-slots/s")
			b.ReportMetric(cpu[i]/float64(b.N*benchBatch), w.name+"-redis-cpu-us/stream")
			b.ReportMetric(rep[i]/float64(b.N*benchBatch), w.name+"-replicas-cpu-us/stream")
		}
	})
}

// mastersCPU returns each master's CPU so far, in µs.
func mastersCPU(b *testing.B, s *scaleNodes) []float64 {
	b.Helper()
	out := make([]float64, len(s.masters))
	for i, m := range s.masters {
		out[i] = infoCPU(b, m)
	}
	return out
}
