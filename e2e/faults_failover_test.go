package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/linearize"
	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/redis/rueidis"
)

const (
	failoverTTL      = 5 * time.Second
	failoverInterval = time.Second
	failoverUsers    = 18 // 6 per plan: 54 workers
	failoverWarmUp   = 4 * time.Second
	failoverAfter    = 6 * time.Second // traffic after every slot is served again
	// failoverTimeout is redis.timeout: the fault under test is a dead
	// master, not a slow one, so the deadline leaves room for the
	// stalls of a machine that runs three servers, six Redis nodes, the
	// load and other tests' processes beside them (at 250ms, the
	// default, a stall as the load started answered a grant degraded
	// before the kill, about one run in ten).
	failoverTimeout = time.Second
)

// TestFaultHardFailoverUnderLoad proves P2 (over-admission only in named
// windows) and P5 (every fail-open counted) across the loss of a Redis
// Cluster master. Three serve processes share a private 6-node cluster;
// 18 users (limits 1-3, one plan failing closed) each run limit+1 workers
// that acquire, heartbeat and release through random servers. One master is
// SIGKILLed mid-run and nothing is restarted: its replica takes over.
//
// It asserts that no user's key ever holds more than the limit (ZCARD,
// sampled directly); that every instant a user's workers held more streams
// than the limit is explained by streams granted degraded (fail-open) or
// later told slot_lost (an acknowledged write the failover lost, or a slot
// that expired while its shard was away), all of them overlapping the fault
// window; that no counted stream of a user on a healthy shard was lost
// (their calls may still fail open for a moment: with Redis' default
// cluster-require-full-coverage every node answers CLUSTERDOWN from the
// moment the master is marked failed until its replica takes over); that calls
// answer from Redis again within 15s of the kill; that the recorded
// histories are linearizable against the cap (internal/linearize), the
// killed master's slots granted before the window's end allowed to vanish
// and calls without an answer allowed to take effect or not; and that the
// degraded grants counted on /metrics equal the degraded answers the
// clients saw.
//
// It runs twice, without and with redis.syncReplicas: 1 (each grant waits
// until the master's replica has it), and prints both; with it, a counted
// grant the failover lost must be one that was reported unsynced.
func TestFaultHardFailoverUnderLoad(t *testing.T) {
	var runs [2]failoverFigures
	for i, replicas := range []int{0, 1} {
		t.Run(fmt.Sprintf("syncReplicas=%d", replicas), func(t *testing.T) {
			runs[i] = runHardFailover(t, replicas)
			runs[i].log(t)
			if replicas > 0 && runs[i].lostEarly > runs[i].unsynced {
				t.Errorf("%d acknowledged slots lost with syncReplicas %d, but only %d grants were reported unsynced",
					runs[i].lostEarly, replicas, runs[i].unsynced)
			}
		})
	}
	for i, f := range runs {
		t.Logf("syncReplicas=%d: over-admission max %d, %.2f stream-seconds; %d degraded grants; %d acknowledged slots lost; %d unsynced grants",
			i, f.oa.maxExcess, f.oa.excessSeconds, f.degradedSeen, f.lostEarly, f.unsynced)
	}
}

// failoverFigures are what one hard-failover run measured.
type failoverFigures struct {
	stats                  callStats
	oa                     overAdmission
	maxZCard, zcardSamples int
	zcardOver              int
	degradedSeen, counted  int
	promoted, recovered    time.Duration // after the kill; recovered: Open plans
	closedRecovered        time.Duration // the last unanswered call of a Closed plan
	lostEarly, lostExpired int           // counted holds told slot_lost
	lostDegraded           int           // degraded holds told slot_lost
	affectedUsers          int
	healthyUnanswered      int
	history                []opRecord
	users                  []loadUser
	kill, windowEnd        time.Time
	affected               map[int]bool
	lin                    linearize.Verdict
	linTook                time.Duration
	unsynced               int    // limiter_acquire_unsynced_total over the servers
	noAnswer               string // one transport error, if any
	slowest                opRecord
	overDeadline           int // calls slower than failoverTimeout + 100ms
}

func (f failoverFigures) log(t *testing.T) {
	t.Helper()
	t.Logf("calls: %d (grants %d, denials %d, degraded %d, 503 %d, 410 %d, no answer %d, cut by the end %d, other %d)",
		f.stats.total, f.stats.granted, f.stats.denied, f.stats.degraded, f.stats.unavailable, f.stats.lost, f.stats.transport, f.stats.cut, f.stats.other)
	t.Logf("failover: replica promoted %v after the SIGKILL; last call without an answer from Redis %v after it (Open plans), %v (the Closed plan)",
		f.promoted.Round(time.Millisecond), f.recovered.Round(time.Millisecond), f.closedRecovered.Round(time.Millisecond))
	t.Logf("ZCARD: %d samples, max %d, %d above the user's limit", f.zcardSamples, f.maxZCard, f.zcardOver)
	t.Logf("over-admission: max %d stream(s) above a limit, %.2f stream-seconds in all, %d instants unexplained",
		f.oa.maxExcess, f.oa.excessSeconds, f.oa.unexplained)
	t.Logf("windows: %d degraded grants (metric %d); held streams told slot_lost: %d acknowledged then lost, %d expired while away, %d degraded; %d grants unsynced",
		f.degradedSeen, f.counted, f.lostEarly, f.lostExpired, f.lostDegraded, f.unsynced)
	t.Logf("users on the killed master: %d of %d; calls of the other users without an answer: %d",
		f.affectedUsers, len(f.users), f.healthyUnanswered)
	if f.noAnswer != "" {
		t.Logf("a call without an answer: %s", f.noAnswer)
	}
	t.Logf("latency: slowest call %v (%s, status %d); %d calls over redis.timeout+100ms (%v)",
		f.slowest.ret.Sub(f.slowest.call).Round(time.Millisecond), f.slowest.kind, f.slowest.status, f.overDeadline, failoverTimeout+100*time.Millisecond)
	t.Logf("linearizable against the cap: %v (%d users, %d calls, %d users needed their unanswered calls) in %v",
		f.lin.OK(), f.lin.Users, f.lin.Ops, f.lin.Widened, f.linTook.Round(time.Millisecond))
}

func failoverConfig(addrs []string, prefix string) string {
	return fmt.Sprintf(`redis:
  addrs: ["%s"]
  keyPrefix: %q
  shardsRefreshInterval: 1s
  timeout: %s
tiers:
  source: static
  static:
%s`, strings.Join(addrs, `", "`), prefix, failoverTimeout, faultTiers(failoverTTL, failoverInterval))
}

func runHardFailover(t *testing.T, syncReplicas int) failoverFigures {
	cl := testenv.StartPrivateCluster(t)
	run := randomID()
	prefix := "e2e-" + run + ":"
	config := strings.Replace(failoverConfig(cl.Addrs, prefix), "redis:\n", fmt.Sprintf("redis:\n  syncReplicas: %d\n", syncReplicas), 1)
	servers := make([]*servetest.Process, 3)
	for i := range servers {
		servers[i] = servetest.Start(t, servetest.Options{Config: config, AwaitRedis: true})
	}
	users := loadUsers("fo-"+run+"-", failoverUsers)
	keyOf := func(u loadUser) string { return prefix + "{" + u.id + "}" }
	victim := cl.MasterOf(keyOf(users[0]))
	f := failoverFigures{users: users, affected: map[int]bool{}}
	for i, u := range users {
		if cl.MasterOf(keyOf(u)) == victim {
			f.affected[i] = true
		}
	}
	f.affectedUsers = len(f.affected)

	// ZCARD of every user's key, straight from Redis, every 50ms.
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: cl.Addrs, DisableCache: true,
		ClusterOption: rueidis.ClusterOption{ShardsRefreshInterval: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	sampleCtx, stopSampling := context.WithCancel(context.Background())
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		cmds := make(rueidis.Commands, len(users))
		for i, u := range users {
			cmds[i] = rc.B().Zcard().Key(keyOf(u)).Build().Pin()
		}
		for sleepCtx(sampleCtx, 50*time.Millisecond) {
			ctx, cancel := context.WithTimeout(sampleCtx, 500*time.Millisecond)
			for i, resp := range rc.DoMulti(ctx, cmds...) {
				n, err := resp.AsInt64()
				if err != nil {
					continue
				}
				f.zcardSamples++
				f.maxZCard = max(f.maxZCard, int(n))
				if int(n) > users[i].limit {
					f.zcardOver++
				}
			}
			cancel()
		}
	}()

	load := newLoadRun(urls(servers), users, failoverTTL, failoverInterval)
	loadCtx, stopLoad := context.WithCancel(context.Background())
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		load.run(loadCtx)
	}()
	defer func() { stopLoad(); <-loadDone }()

	time.Sleep(failoverWarmUp)
	f.kill = time.Now()
	cl.Kill(victim)
	cl.AwaitServed(30 * time.Second)
	f.promoted = time.Since(f.kill)
	time.Sleep(failoverAfter)
	stopLoad()
	<-loadDone
	stopSampling()
	sampler.Wait()

	f.stats = load.stats()
	f.oa = load.overAdmitted()
	f.history = load.records()
	if last := load.lastUnanswered(false); !last.IsZero() {
		f.recovered = last.Sub(f.kill)
	}
	if last := load.lastUnanswered(true); !last.IsZero() {
		f.closedRecovered = last.Sub(f.kill)
	}
	f.windowEnd = f.kill.Add(max(f.recovered, f.promoted))
	if syncReplicas == 0 {
		f.windowEnd = f.kill.Add(max(f.recovered, f.closedRecovered, f.promoted))
	}
	f.degradedSeen = load.degradedAcquires()
	var samples []map[string]float64
	for _, s := range servers {
		samples = append(samples, scrape(t, s))
	}
	f.counted = int(metricSum(t, samples, func(series string) bool {
		return strings.HasPrefix(series, `limiter_acquire_total{outcome="degraded",`)
	}))
	f.unsynced = int(metricSum(t, samples, func(series string) bool {
		return strings.HasPrefix(series, "limiter_acquire_unsynced_total{")
	}))
	for _, h := range load.holds {
		switch {
		case !h.lost:
		case h.degraded:
			f.lostDegraded++
		case h.early:
			f.lostEarly++
		default:
			f.lostExpired++
		}
	}
	for _, o := range f.history {
		if !f.affected[o.user] && !o.answered() {
			f.healthyUnanswered++
		}
		if o.status == 0 && !o.cut && f.noAnswer == "" {
			f.noAnswer = fmt.Sprintf("%s of %s at %+dms: %s", o.kind, users[o.user].id, o.call.Sub(f.kill).Milliseconds(), o.err)
		}
		took := o.ret.Sub(o.call)
		if took > f.slowest.ret.Sub(f.slowest.call) {
			f.slowest = o
		}
		if took > failoverTimeout+100*time.Millisecond {
			f.overDeadline++
		}
	}
	// Slots of the killed master's users granted before the window ended
	// may vanish (lost acknowledged writes, expiry while away); every other
	// slot must behave as the cap says.
	linStart := time.Now()
	f.lin = linearize.Check(load.history(func(o opRecord) bool {
		return f.affected[o.user] && o.call.Before(f.windowEnd)
	}), linearize.Options{})
	f.linTook = time.Since(linStart)

	// The checks.
	if f.zcardOver > 0 {
		t.Errorf("ZCARD above the user's limit in %d of %d samples (max %d): the acquire script let a key exceed its limit",
			f.zcardOver, f.zcardSamples, f.maxZCard)
	}
	if f.oa.unexplained > 0 {
		t.Errorf("over-admission outside any fault window at %d instants, e.g. %s", f.oa.unexplained, f.oa.example)
	}
	slack := failoverInterval + time.Second
	for _, h := range f.oa.explainedBy {
		if h.end.Before(f.kill) || h.start.After(f.windowEnd.Add(slack)) {
			t.Errorf("stream %s of %s explained an over-admission but was held %s-%s, outside the fault window %s-%s",
				h.stream, users[h.user].id, h.start.Format(time.StampMilli), h.end.Format(time.StampMilli),
				f.kill.Format(time.StampMilli), f.windowEnd.Format(time.StampMilli))
		}
	}
	for _, h := range load.holds {
		if h.lost && !h.degraded && !f.affected[h.user] {
			t.Errorf("counted stream %s of %s, whose key is on a healthy master, was told slot_lost at %s",
				h.stream, users[h.user].id, h.end.Format(time.StampMilli))
		}
	}
	for _, o := range f.history {
		if !o.answered() && o.call.Before(f.kill) && o.ret.Before(f.kill) {
			t.Errorf("before the kill, %s of %s (%s) got status %d degraded %v: the run was not clean before the fault",
				o.kind, users[o.user].id, o.stream, o.status, o.degraded)
			break
		}
	}
	if f.recovered > 15*time.Second {
		t.Errorf("calls of Open plans still went unanswered by Redis %v after the kill, want within 15s", f.recovered)
	}
	// With syncReplicas, the promoted master has no replica left to
	// confirm grants, so the Closed plan refuses them on its shard for as
	// long as that lasts: by design, not an outage to recover from.
	if syncReplicas == 0 && f.closedRecovered > 15*time.Second {
		t.Errorf("calls of the Closed plan still went unanswered by Redis %v after the kill, want within 15s", f.closedRecovered)
	}
	if !f.lin.OK() {
		t.Errorf("histories not linearizable against the cap, fault window allowed for: illegal for %v, undecided for %v",
			f.lin.Illegal, f.lin.Undecided)
		named := f.lin.Undecided
		if len(f.lin.Illegal) > 0 {
			named = f.lin.Illegal
		}
		logUserHistory(t, load, named[0], f.kill)
	}
	if f.counted != f.degradedSeen {
		t.Errorf("limiter_acquire_total{outcome=\"degraded\"} summed over the servers = %d, want %d (the degraded grants the clients saw)",
			f.counted, f.degradedSeen)
	}
	if f.stats.granted == 0 || f.stats.denied == 0 {
		t.Errorf("the load made %d grants and %d denials; want both (contention on every user)", f.stats.granted, f.stats.denied)
	}
	return f
}
