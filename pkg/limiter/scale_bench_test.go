package limiter_test

import (
	"cmp"
	"context"
	"crypto/sha1"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/benchenv"
	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/joishi/limiter/pkg/tiers"
	"github.com/redis/rueidis"
)

// Environment of BenchmarkScale.
const (
	envScale            = "LIMITER_BENCH_SCALE"             // "1": run it
	envScaleSlots       = "LIMITER_BENCH_SCALE_SLOTS"       // comma list of N, default 900,45000,900000
	envScaleConcurrency = "LIMITER_BENCH_SCALE_CONCURRENCY" // batches in flight, default 4
	envScaleRounds      = "LIMITER_BENCH_SCALE_ROUNDS"      // refresh rounds per N, default 3
	// "1": after each N, the same N with every stream also a member of
	// one pool key (scalePool=scalePoolKey), the worst case for a key.
	envScalePooled = "LIMITER_BENCH_SCALE_POOLED"
	// Over HTTP as well: the limiter serve processes of each deployment, a
	// comma list of PID@URL, all on that deployment's servers with the key
	// prefix LIMITER_BENCH_SCALE_PREFIX and a plan "scale" like scaleTier's,
	// and the bearer token of a caller allowed that plan.
	envScaleServeStandalone = "LIMITER_BENCH_SCALE_SERVE_STANDALONE"
	envScaleServeCluster    = "LIMITER_BENCH_SCALE_SERVE_CLUSTER"
	envScalePrefix          = "LIMITER_BENCH_SCALE_PREFIX"
	envScaleToken           = "LIMITER_BENCH_SCALE_TOKEN"
)

// The pool key every stream of a pooled round joins: one model's.
const scalePool, scalePoolKey = "model", "one"

// scaleTier is a production tier: slots live 120s and heartbeat every 20s.
var scaleTier = tiers.Tier{Plan: "scale", MaxConcurrentStreams: 3, SlotTTL: 2 * time.Minute, HeartbeatInterval: 20 * time.Second, FailureMode: tiers.FailOpen}

// BenchmarkScale answers "what at N live streams": for each N it holds N
// slots (one per user, as N users streaming) and refreshes all of them,
// round after round, with Limiter.HeartbeatBatch in batches of 1000, a few
// batches in flight, as the limiter replicas of a deployment heartbeating
// their streams would. Per N it reports the wall time of one full round,
// Redis CPU µs per refresh (masters, and replicas on a cluster), the
// client's CPU µs per refresh, the share of one core each master spends
// when every slot beats every 20s, and the bytes of Redis memory per live
// slot (used_memory on the masters before loading and after, divided by
// N; a replica holds as much again). Each figure is the median of the
// rounds.
//
// round/cpu-bound is the round's wall time over the least it could take
// on this machine's cores given the CPU every process used in it (Redis's
// servers, this process, the serve processes): 1 is a round bound by CPU
// alone. It assumes all of them run on this machine, as under make bench.
//
// Given limiter serve processes of a deployment (envScaleServe*), every
// round is run twice, in an order that alternates: once through the
// library as above, and once over HTTP, each batch one POST
// /v1/slots/heartbeats to the next of the processes, as the callers of a
// deployment would send them. The HTTP side reports the same figures
// (prefixed http-), the processes' CPU µs per refresh (/proc/PID/stat,
// all of them together) and the cores they need for one round every 20s.
// The client here only writes bodies built beforehand and scans the
// answers, so it takes little of the machine from the servers.
//
// With LIMITER_BENCH_SCALE_POOLED=1 each N runs a second time with every
// stream also a member of one pool key (model=one), as if every stream
// were of one model: N members in one sorted set on one master, beyond
// the cap a pool may be given (pools.MaxConcurrentStreams), so a bound on
// the worst case. Its figures add pool-master-µs/refresh: the CPU of the
// master holding the key (the busiest) per stream refreshed.
//
// It is not a test and `make test` never runs it: it runs only with
// LIMITER_BENCH_SCALE=1, and it needs servers of its own, empty (it checks
// DBSIZE) because it FLUSHALLs them between sizes and at the end. `make
// bench-scale` (hack/bench-scale.sh) starts the servers and the serve
// processes and runs it; by hand:
//
//	LIMITER_BENCH_SCALE=1 LIMITER_TEST_REDIS=host:port LIMITER_TEST_REDIS_CLUSTER=h1:p1,... \
//	  go test -run '^$' -bench Scale -benchtime 1x -timeout 60m ./pkg/limiter
func BenchmarkScale(b *testing.B) {
	if os.Getenv(envScale) != "1" {
		b.Skipf("set %s=1 to run it (it empties the servers it is given)", envScale)
	}
	sizes := scaleEnvInts(b, envScaleSlots, []int{900, 45_000, 900_000})
	concurrency := scaleEnvInts(b, envScaleConcurrency, []int{4})[0]
	rounds := scaleEnvInts(b, envScaleRounds, []int{3})[0]
	for _, be := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		b.Run(be.String(), func(b *testing.B) {
			redis := cluster.Options{Timeout: benchTimeout, Logger: slog.New(slog.DiscardHandler)}
			web := scaleServeOf(b, be)
			opts := limitertest.Options{Backend: be, Redis: redis, Tiers: []tiers.Tier{scaleTier}}
			if web != nil {
				opts.Limiter.Keys.Prefix = web.prefix
			}
			e := newEnv(b, opts)
			raw := e.raw(b)
			servers := scaleServers(b, raw)
			servers.requireEmpty(b)
			b.Cleanup(func() { servers.flush(b) })
			pooled := os.Getenv(envScalePooled) == "1"
			for _, n := range sizes {
				b.Run(fmt.Sprintf("slots=%d", n), func(b *testing.B) {
					for b.Loop() {
						scaleRun(b, e, web, servers, n, concurrency, rounds, false)
					}
				})
				if pooled {
					b.Run(fmt.Sprintf("slots=%d-pooled", n), func(b *testing.B) {
						for b.Loop() {
							scaleRun(b, e, web, servers, n, concurrency, rounds, true)
						}
					})
				}
			}
		})
	}
}

func scaleRun(b *testing.B, e *env, web *scaleServe, servers *scaleNodes, n, concurrency, rounds int, pooled bool) {
	ctx := context.Background()
	servers.flush(b)
	memBefore := servers.usedMemory(b)
	benchenv.LoadScript(b, servers.masters, lua.Sources()["acquire"])
	reqs := scaleLoad(b, e, n, concurrency, pooled)
	memAfter := servers.usedMemory(b)

	sides := []*scaleSide{{name: "", round: func() { scaleRound(b, ctx, e.lim, reqs, concurrency) }}}
	if web != nil {
		bodies := web.bodies(reqs)
		sides = append(sides, &scaleSide{name: "http-", round: func() { web.round(b, bodies, concurrency) }, serveCPU: web.cpu})
	}
	for r := range rounds {
		for i := range sides {
			side := sides[i]
			if r%2 == 1 { // the other order every other round
				side = sides[len(sides)-1-i]
			}
			side.measure(b, servers, n)
		}
	}
	for _, side := range sides {
		side.report(b, servers, n, concurrency)
	}
	b.ReportMetric(float64(memAfter-memBefore)/float64(n), "B/slot")
}

// scaleSide is one way of running a round, and its figures per round.
type scaleSide struct {
	name     string // the prefix of its metrics
	round    func()
	serveCPU func(*testing.B) time.Duration // nil: no serve process

	walls, masterCPU, replicaCPU, clientCPU, serve []float64
	busiest                                        []float64 // the busiest master's CPU per refresh
	bound                                          []float64 // wall ÷ the CPU bound of the round
}

func (s *scaleSide) measure(b *testing.B, servers *scaleNodes, n int) {
	var serve0, serve1 time.Duration
	if s.serveCPU != nil {
		serve0 = s.serveCPU(b)
	}
	each0 := mastersCPU(b, servers)
	cpu0, client0, start := servers.cpu(b), cpuTime(), time.Now()
	s.round()
	wall, client1, cpu1 := time.Since(start), cpuTime(), servers.cpu(b)
	each1, busiest := mastersCPU(b, servers), 0.0
	for i := range each1 {
		busiest = max(busiest, each1[i]-each0[i])
	}
	s.busiest = append(s.busiest, busiest/float64(n))
	if s.serveCPU != nil {
		serve1 = s.serveCPU(b)
	}
	s.walls = append(s.walls, wall.Seconds())
	s.masterCPU = append(s.masterCPU, (cpu1.masters-cpu0.masters)/float64(n))
	s.replicaCPU = append(s.replicaCPU, (cpu1.replicas-cpu0.replicas)/float64(n))
	s.clientCPU = append(s.clientCPU, float64((client1-client0).Microseconds())/float64(n))
	s.serve = append(s.serve, float64((serve1-serve0).Microseconds())/float64(n))
	// Every process of the round shares this machine's cores (as under
	// make bench), so the round takes at least the CPU it used over them.
	used := cpu1.masters - cpu0.masters + cpu1.replicas - cpu0.replicas + float64((client1 - client0 + serve1 - serve0).Microseconds())
	s.bound = append(s.bound, wall.Seconds()/(used/1e6/float64(runtime.NumCPU())))
}

func (s *scaleSide) report(b *testing.B, servers *scaleNodes, n, concurrency int) {
	interval := float64(scaleTier.HeartbeatInterval.Microseconds())
	perMaster := limitertest.Median(s.masterCPU) * float64(n) / float64(len(servers.masters)) // µs per round
	b.ReportMetric(limitertest.Median(s.walls), s.name+"round-s")
	b.ReportMetric(limitertest.Median(s.bound), s.name+"round/cpu-bound")
	b.ReportMetric(limitertest.Median(s.masterCPU), s.name+"redis-µs/refresh")
	b.ReportMetric(limitertest.Median(s.busiest), s.name+"busiest-master-µs/refresh")
	if len(servers.replicas) > 0 {
		b.ReportMetric(limitertest.Median(s.replicaCPU), s.name+"replica-µs/refresh")
	}
	b.ReportMetric(limitertest.Median(s.clientCPU), s.name+"client-µs/refresh")
	b.ReportMetric(100*perMaster/interval, s.name+"%core/master@20s")
	if s.serveCPU != nil {
		b.ReportMetric(limitertest.Median(s.serve), "serve-µs/refresh")
		b.ReportMetric(limitertest.Median(s.serve)*float64(n)/interval, "serve-cores@20s")
	}
	b.Logf("N=%d, %d masters, %d batches of %d in flight, %s: rounds %.2fs, redis µs/refresh %.2f (masters) %.2f (replicas), client µs/refresh %.2f, serve µs/refresh %.2f",
		n, len(servers.masters), concurrency, benchBatch, cmp.Or(strings.TrimSuffix(s.name, "-"), "library"), s.walls, s.masterCPU, s.replicaCPU, s.clientCPU, s.serve)
}

// scaleLoad acquires n slots, one per user, with the acquire script in
// pipelines of 1000, concurrency at a time, and returns the heartbeat
// requests for them. pooled: each stream also joins the pool key
// scalePool=scalePoolKey, its slot's record naming it, as an acquire
// naming the pool records it.
func scaleLoad(b *testing.B, e *env, n, concurrency int, pooled bool) []limiter.HeartbeatRequest {
	b.Helper()
	raw := e.raw(b)
	src := lua.Sources()["acquire"]
	sha := fmt.Sprintf("%x", sha1.Sum([]byte(src)))
	run := newUser(b)
	reqs := make([]limiter.HeartbeatRequest, n)
	for i := range reqs {
		reqs[i] = limiter.HeartbeatRequest{UserID: run + "-" + strconv.Itoa(i), Plan: scaleTier.Plan, StreamID: "s" + strconv.Itoa(i)}
	}
	var next atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	limit, ttl := strconv.Itoa(scaleTier.MaxConcurrentStreams), strconv.FormatInt(scaleTier.SlotTTL.Milliseconds(), 10)
	record, poolSlots := "", ""
	if pooled {
		// The records an acquire naming the pool writes (pkg/lua Record).
		record = ";plan=" + scaleTier.Plan + ";pools=" + scalePool + "=" + scalePoolKey
		var err error
		if poolSlots, err = e.keys.PoolKey(scalePool, scalePoolKey); err != nil {
			b.Fatal(err)
		}
	}
	poolLimit := strconv.Itoa(n) // every stream fits
	for range concurrency {
		wg.Go(func() {
			for {
				from := int(next.Add(benchBatch)) - benchBatch
				if from >= n || failed.Load() != nil {
					return
				}
				batch := reqs[from:min(from+benchBatch, n)]
				cmds := make(rueidis.Commands, 0, 2*len(batch))
				for _, r := range batch {
					key, _ := e.keys.UserKey(r.UserID)
					cmds = append(cmds, raw.B().Evalsha().Sha1(sha).Numkeys(int64(len(lua.AcquireKeys(key)))).Key(lua.AcquireKeys(key)...).Arg(r.StreamID, limit, ttl, record).Build())
					if pooled {
						member := r.StreamID + " " + r.UserID
						rec := ";plan=" + scaleTier.Plan + ";user=" + strconv.Itoa(len(r.UserID)) + ":" + r.UserID
						cmds = append(cmds, raw.B().Evalsha().Sha1(sha).Numkeys(int64(len(lua.AcquireKeys(poolSlots)))).Key(lua.AcquireKeys(poolSlots)...).Arg(member, poolLimit, ttl, rec).Build())
					}
				}
				for i, resp := range raw.DoMulti(context.Background(), cmds...) {
					got, err := scriptInts(resp)
					if err == nil && (len(got) < 7 || got[0] != 1) {
						err = fmt.Errorf("acquire %d of the batch from %d: %v, want granted", i, from, got)
					}
					if err != nil {
						failed.CompareAndSwap(nil, &err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		b.Fatalf("loading %d slots: %v", n, *err)
	}
	return reqs
}

// scaleRound heartbeats every slot of reqs once, in batches of benchBatch,
// concurrency batches at a time; every slot must come back alive.
func scaleRound(b *testing.B, ctx context.Context, lim *limiter.Limiter, reqs []limiter.HeartbeatRequest, concurrency int) {
	b.Helper()
	var next atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	for range concurrency {
		wg.Go(func() {
			for {
				from := int(next.Add(benchBatch)) - benchBatch
				if from >= len(reqs) || failed.Load() != nil {
					return
				}
				batch := reqs[from:min(from+benchBatch, len(reqs))]
				results, errs := lim.HeartbeatBatch(ctx, batch)
				for i, err := range errs {
					if err == nil && (!results[i].Alive || results[i].Degraded) {
						err = fmt.Errorf("%+v, want alive and not degraded", results[i])
					}
					if err != nil {
						err = fmt.Errorf("heartbeat %s: %w", batch[i].UserID, err)
						failed.CompareAndSwap(nil, &err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
}

func scaleEnvInts(b *testing.B, name string, def []int) []int {
	b.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var out []int
	for f := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			b.Fatalf("%s=%q: want positive integers, comma separated", name, v)
		}
		out = append(out, n)
	}
	return out
}

// scaleNodes are direct connections to every node of a deployment.
type scaleNodes struct{ masters, replicas []rueidis.Client }

func scaleServers(b *testing.B, c rueidis.Client) *scaleNodes {
	b.Helper()
	n := benchenv.Dial(b, c)
	return &scaleNodes{masters: n.Masters, replicas: n.Replicas}
}

func (s *scaleNodes) requireEmpty(b *testing.B) {
	b.Helper()
	for _, m := range s.masters {
		n, err := m.Do(context.Background(), m.B().Dbsize().Build()).AsInt64()
		if err != nil {
			b.Fatal(err)
		}
		if n != 0 {
			b.Fatalf("a server holds %d keys: BenchmarkScale empties its servers, so it runs on empty ones only", n)
		}
	}
}

// flush empties the servers, between sizes and at the end, by FLUSHALL
// ASYNC: each master drops its keys at once and frees them in the
// background. A plain FLUSHALL of a pooled size's keys (a sorted set of
// 900,000 members among 1.8 million keys) keeps a master busy past the
// cluster's node timeout on a loaded machine; its replica, not yet sent
// the flush, may then take over with every key.
func (s *scaleNodes) flush(b *testing.B) {
	b.Helper()
	for _, m := range s.masters {
		if err := m.Do(context.Background(), m.B().Flushall().Async().Build()).Error(); err != nil {
			b.Fatal(err)
		}
	}
	// The replicas must have dropped their copies before memory is read.
	for _, r := range s.replicas {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			n, err := r.Do(context.Background(), r.B().Dbsize().Build()).AsInt64()
			if err == nil && n == 0 {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("a replica still holds %d keys (%v) 30s after FLUSHALL; its ROLE: %s", n, err, role(r))
			}
		}
	}
}

// role is a node's answer to ROLE, for a message: a replica that was
// promoted reads "master".
func role(node rueidis.Client) string {
	arr, err := node.Do(context.Background(), node.B().Role().Build()).ToArray()
	if err != nil || len(arr) == 0 {
		return fmt.Sprintf("unknown (%v)", err)
	}
	kind, _ := arr[0].ToString()
	return kind
}

func (s *scaleNodes) usedMemory(b *testing.B) int64 {
	b.Helper()
	var total int64
	for _, m := range s.masters {
		total += benchenv.InfoInt(b, m, "memory", "used_memory")
	}
	return total
}

type scaleCPU struct{ masters, replicas float64 } // µs

func (s *scaleNodes) cpu(b *testing.B) scaleCPU {
	b.Helper()
	var out scaleCPU
	for _, m := range s.masters {
		out.masters += infoCPU(b, m)
	}
	for _, r := range s.replicas {
		out.replicas += infoCPU(b, r)
	}
	return out
}

// infoCPU is the CPU time of one server in µs, user and system.
func infoCPU(b *testing.B, node rueidis.Client) float64 {
	b.Helper()
	return benchenv.CPU(b, node)
}
