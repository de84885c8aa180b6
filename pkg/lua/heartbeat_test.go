package lua_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/redis/rueidis"
)

// eachServer runs fn on the standalone Redis, the Redis Cluster and the
// embedded store (embedded true).
func eachServer(t *testing.T, fn func(t *testing.T, c rueidis.Client, embedded bool)) {
	servers := []struct {
		name  string
		addrs func(t *testing.T) []string
	}{
		{"standalone", func(t *testing.T) []string { return []string{testenv.Redis(t)} }},
		{"cluster", func(t *testing.T) []string { return testenv.Cluster(t) }},
		{"embedded", func(t *testing.T) []string { return nil }},
	}
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			redis, err := cluster.New(cluster.Options{Addrs: s.addrs(t), Timeout: 5 * time.Second, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(redis.Close)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := redis.WaitConnected(ctx); err != nil {
				t.Fatal(err)
			}
			c, err := redis.Redis()
			if err != nil {
				t.Fatal(err)
			}
			fn(t, c, s.name == "embedded")
		})
	}
}

// privateServer returns a client of a standalone Redis of the test's
// own: its command counts are the test's alone.
func privateServer(t *testing.T) rueidis.Client {
	t.Helper()
	srv := testenv.StartRedis(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// commandCalls is how many times c's server has run the command name
// (lower case), its scripts' calls of it included.
func commandCalls(t *testing.T, c rueidis.Client, name string) int {
	t.Helper()
	info, err := c.Do(context.Background(), c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	for _, line := range strings.Split(info, "\r\n") {
		if strings.HasPrefix(line, "cmdstat_"+name+":calls=") {
			fmt.Sscanf(line, "cmdstat_"+name+":calls=%d", &n)
		}
	}
	return n
}

func expiretime(t *testing.T, c rueidis.Client, key string) int64 {
	t.Helper()
	at, err := c.Do(context.Background(), c.B().Pexpiretime().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatalf("PEXPIRETIME %s: %v", key, err)
	}
	return at
}

// TestHeartbeatMultiRefreshesAUsersSlotsInOneCall: several slots of one
// user in a batch are one script call; each gets its own answer, a lost
// one is not re-added, and the user's expired slots are counted once.
func TestHeartbeatMultiRefreshesAUsersSlotsInOneCall(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		run := keys.NewStreamID()[:12]
		user := "heartbeat-multi:" + run + ":{user}"
		other := "heartbeat-multi:" + run + ":{other}"
		for _, s := range []string{"a", "b", "c"} {
			if got, err := lua.Acquire(ctx, c, user, s, 5, time.Minute, lua.Record{}, false); err != nil || !got.Granted {
				t.Fatalf("acquire %s = %+v, %v", s, got, err)
			}
		}
		if got, err := lua.Acquire(ctx, c, user, "short", 5, 50*time.Millisecond, lua.Record{}, false); err != nil || !got.Granted {
			t.Fatalf("acquire short = %+v, %v", got, err)
		}
		if got, err := lua.Acquire(ctx, c, other, "x", 5, time.Minute, lua.Record{}, false); err != nil || !got.Granted {
			t.Fatalf("acquire x = %+v, %v", got, err)
		}
		time.Sleep(100 * time.Millisecond) // "short" expires

		slots := []lua.HeartbeatArgs{
			{Key: user, StreamID: "a"},
			{Key: other, StreamID: "x"},
			{Key: user, StreamID: "never"},
			{Key: user, StreamID: "c"},
			{Key: user, StreamID: "short"},
			{Key: user, StreamID: "b"},
		}
		before := time.Now()
		beats, errs := lua.HeartbeatMulti(ctx, c, slots, nil)
		wantAlive := []bool{true, true, false, true, false, true}
		for i, beat := range beats {
			if errs[i] != nil {
				t.Fatalf("slot %d (%s): %v", i, slots[i].StreamID, errs[i])
			}
			if beat.Alive != wantAlive[i] {
				t.Errorf("slot %d (%s): alive %v, want %v", i, slots[i].StreamID, beat.Alive, wantAlive[i])
			}
			if beat.Alive {
				if at := time.UnixMilli(beat.ExpiresAtMs); at.Before(before.Add(time.Minute-time.Second)) || at.After(time.Now().Add(time.Minute+time.Second)) {
					t.Errorf("slot %d (%s): expires at %v, want about a minute from now", i, slots[i].StreamID, at)
				}
			} else if beat.ExpiresAtMs != 0 {
				t.Errorf("slot %d (%s): lost, expires at %d, want 0", i, slots[i].StreamID, beat.ExpiresAtMs)
			}
		}
		if pruned := beats[0].Pruned + beats[2].Pruned + beats[3].Pruned + beats[4].Pruned + beats[5].Pruned; beats[0].Pruned != 1 || pruned != 1 {
			t.Errorf("pruned: %d on the user's first slot, %d in all; want 1 and 1 (the expired slot, counted once)", beats[0].Pruned, pruned)
		}
		for _, s := range []string{"never", "short"} {
			if err := c.Do(ctx, c.B().Zscore().Key(user).Member(s).Build()).Error(); !rueidis.IsRedisNil(err) {
				t.Errorf("ZSCORE %s after its heartbeat: %v, want nil (a lost slot is never re-added)", s, err)
			}
		}
	})
}

// TestHeartbeatMovesTheKeysExpiryOnlyWhenItMust: both keys expire
// together, at least one TTL after the latest slot and at most two, and a
// beat within that leaves the expiry as it is.
func TestHeartbeatMovesTheKeysExpiryOnlyWhenItMust(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, embedded bool) {
		ctx := context.Background()
		const ttl = time.Second
		key := fmt.Sprintf("heartbeat-expiry:%s:{user}", keys.NewStreamID()[:12])
		if got, err := lua.Acquire(ctx, c, key, "s", 1, ttl, lua.Record{}, false); err != nil || !got.Granted {
			t.Fatalf("acquire = %+v, %v", got, err)
		}
		// The same instant. The embedded store keeps a TTL relative to when
		// it was set, so what it reads back drifts by a few ms.
		slack := int64(0)
		if embedded {
			slack = 100
		}
		check := func(when string, beat lua.Beat) int64 {
			t.Helper()
			slots, records := expiretime(t, c, key), expiretime(t, c, keys.SlotRecords(key))
			if records < slots-slack || records > slots+slack {
				t.Errorf("%s: PEXPIRETIME of the records %d, of the slots %d: want the same", when, records, slots)
			}
			lo, hi := beat.ExpiresAtMs+ttl.Milliseconds(), beat.ExpiresAtMs+2*ttl.Milliseconds()
			if !embedded && (slots < lo || slots > hi) {
				t.Errorf("%s: the key expires at %d, want %d to %d (one to two TTLs after its slot's %d)", when, slots, lo, hi, beat.ExpiresAtMs)
			}
			return slots
		}
		// Acquire left the keys two TTLs past the slot, so a beat within
		// the slot's first TTL keeps them; the first beat after it, whose
		// slot's expiry + TTL passes them, moves them two TTLs past it.
		acquired := expiretime(t, c, key)
		time.Sleep(600 * time.Millisecond)
		early, err := lua.Heartbeat(ctx, c, "", key, "s", 0)
		if err != nil || !early.Alive {
			t.Fatalf("heartbeat = %+v, %v", early, err)
		}
		if kept := check("a heartbeat within the first TTL", early); !embedded && kept != acquired {
			t.Errorf("a heartbeat within the first TTL moved the key's expiry from %d to %d; want it kept", acquired, kept)
		}
		time.Sleep(600 * time.Millisecond)
		first, err := lua.Heartbeat(ctx, c, "", key, "s", 0)
		if err != nil || !first.Alive {
			t.Fatalf("heartbeat = %+v, %v", first, err)
		}
		moved := check("the first heartbeat after a TTL", first)
		if embedded {
			// Its TTLs stand still (keys go by its sweep), so PEXPIRETIME
			// reads later as time passes: the bounds do not apply.
			return
		}
		if want := first.ExpiresAtMs + 2*ttl.Milliseconds(); moved != want {
			t.Errorf("the first heartbeat after a TTL: the key expires at %d, want %d (its slot's expiry + 2 TTLs)", moved, want)
		}
		time.Sleep(100 * time.Millisecond)
		second, err := lua.Heartbeat(ctx, c, "", key, "s", 0)
		if err != nil || !second.Alive || second.ExpiresAtMs <= first.ExpiresAtMs {
			t.Fatalf("second heartbeat = %+v, %v; want alive, later than %d", second, err, first.ExpiresAtMs)
		}
		if kept := check("second heartbeat", second); kept != moved {
			t.Errorf("a heartbeat 100ms later moved the key's expiry from %d to %d; want it kept", moved, kept)
		}
	})
}

// TestHeartbeatOwnTTLReadsNoRecord: a slot given with its own TTL (a pool
// key's member, kept by its stream's slot's TTL) is kept by that TTL
// whatever its record says, gets no record when it has none, and is not
// checked for its holder; beside it in the same call, a slot given a
// fallback is still kept by its record, and a lost one is never re-added.
func TestHeartbeatOwnTTLReadsNoRecord(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := "heartbeat-own:" + keys.NewStreamID()[:12] + ":{pool}"
		for _, s := range []string{"own", "recorded"} {
			// Records of a 2-second TTL, taken by caller "a".
			if got, err := lua.Acquire(ctx, c, key, s, 5, 2*time.Second, lua.Record{Caller: "a"}, false); err != nil || !got.Granted {
				t.Fatalf("acquire %s = %+v, %v", s, got, err)
			}
		}
		// A member with no record at all.
		if err := c.Do(ctx, c.B().Zadd().Key(key).ScoreMember().ScoreMember(float64(time.Now().Add(time.Hour).UnixMilli()), "bare").Build()).Error(); err != nil {
			t.Fatal(err)
		}
		slots := []lua.HeartbeatArgs{
			{Key: key, StreamID: "own", TTL: time.Minute, Own: true},
			{Key: key, StreamID: "recorded", TTL: time.Minute},
			{Key: key, StreamID: "gone", TTL: time.Minute, Own: true},
		}
		before := time.Now()
		beats, errs := lua.HeartbeatMulti(ctx, c, slots, nil)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("slot %d: %v", i, err)
			}
		}
		if at := time.UnixMilli(beats[0].ExpiresAtMs); !beats[0].Alive || at.Before(before.Add(time.Minute-time.Second)) {
			t.Errorf("own: %+v (expires %v), want alive for about a minute: its TTL given, not its record's 2s", beats[0], at)
		}
		if at := time.UnixMilli(beats[1].ExpiresAtMs); !beats[1].Alive || at.After(time.Now().Add(3*time.Second)) {
			t.Errorf("recorded: %+v (expires %v), want alive for its record's 2s", beats[1], at)
		}
		if beats[2].Alive || beats[2].ExpiresAtMs != 0 {
			t.Errorf("gone: %+v, want lost", beats[2])
		}
		if err := c.Do(ctx, c.B().Zscore().Key(key).Member("gone").Build()).Error(); !rueidis.IsRedisNil(err) {
			t.Errorf("ZSCORE gone after its heartbeat: %v, want nil (a lost member is never re-added)", err)
		}

		// Another caller's heartbeat: the member given its TTL is kept (its
		// stream's slot was checked), the recorded one is not its to keep.
		beats, errs = lua.HeartbeatMulti(ctx, c, []lua.HeartbeatArgs{
			{Key: key, StreamID: "bare", TTL: time.Minute, Own: true, Caller: "b"},
			{Key: key, StreamID: "recorded", TTL: time.Minute, Caller: "b"},
		}, nil)
		if errs[0] != nil || errs[1] != nil {
			t.Fatalf("heartbeat as b: %v, %v", errs[0], errs[1])
		}
		if !beats[0].Alive || beats[1].Alive || !beats[1].NotHolder {
			t.Errorf("as b: bare %+v, recorded %+v; want bare kept and recorded left as a's", beats[0], beats[1])
		}
		if err := c.Do(ctx, c.B().Hget().Key(keys.SlotRecords(key)).Field("bare").Build()).Error(); !rueidis.IsRedisNil(err) {
			t.Errorf("HGET the record of bare: %v, want none written (its TTL came with the call)", err)
		}
	})
}

// TestAcquireAllDecidesEachAsAlone: AcquireAll's scripts, in one pipeline
// to a server that lacks the script (SCRIPT FLUSH, as after a restart),
// answer as each would alone, in order: a new slot, a refusal at the
// limit, another caller's stream left as it is, each on its own key.
func TestAcquireAllDecidesEachAsAlone(t *testing.T) {
	t.Parallel()
	c := privateServer(t)
	ctx := context.Background()
	run := keys.NewStreamID()[:12]
	full, other := "acquire-all:"+run+":{full}", "acquire-all:"+run+":{other}"
	if got, err := lua.Acquire(ctx, c, full, "held", 1, time.Minute, lua.Record{}, false); err != nil || !got.Granted {
		t.Fatalf("acquire held = %+v, %v", got, err)
	}
	if got, err := lua.Acquire(ctx, c, other, "theirs", 5, time.Minute, lua.Record{Caller: "a"}, false); err != nil || !got.Granted {
		t.Fatalf("acquire theirs = %+v, %v", got, err)
	}
	if err := c.Do(ctx, c.B().ScriptFlush().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	got, errs := lua.AcquireAll(ctx, c, []lua.AcquireArgs{
		{Key: other, StreamID: "new", Limit: 5, TTL: time.Minute, Rec: lua.Record{Caller: "b"}},
		{Key: full, StreamID: "second", Limit: 1, TTL: time.Minute},
		{Key: other, StreamID: "theirs", Limit: 5, TTL: time.Minute, Rec: lua.Record{Caller: "b"}},
	}, nil)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
	}
	if !got[0].Granted || got[0].Extended || got[0].Used != 2 {
		t.Errorf("new: %+v, want a new slot, 2 used", got[0])
	}
	if got[1].Granted || got[1].Used != 1 || got[1].RetryAfterMs <= 0 {
		t.Errorf("second at limit 1: %+v, want refused with a retry", got[1])
	}
	if got[2].Granted || !got[2].NotHolder {
		t.Errorf("another caller's stream: %+v, want left as it is", got[2])
	}
}

// TestHeartbeatMovesGivenMembersInOneZADD: the members given their TTL
// (a pool key's, in one call) move in one ZADD, in chunks of 500, one
// command for Redis to run and its replicas to apply, not one each; and
// they answer as one ZADD each did: a member already later keeps its
// later expiry, a missing one is lost and not re-added.
func TestHeartbeatMovesGivenMembersInOneZADD(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := "heartbeat-given:" + keys.NewStreamID()[:12] + ":{pool}"
		soon, later := time.Now().Add(10*time.Second).UnixMilli(), time.Now().Add(2*time.Hour).UnixMilli()
		var slots []lua.HeartbeatArgs
		for i := range 600 {
			slots = append(slots, lua.HeartbeatArgs{Key: key, StreamID: fmt.Sprintf("m%d", i), TTL: time.Minute, Own: true})
		}
		zadd := c.B().Zadd().Key(key).ScoreMember()
		for _, s := range slots {
			zadd = zadd.ScoreMember(float64(soon), s.StreamID)
		}
		if err := c.Do(ctx, zadd.ScoreMember(float64(later), "later").Build()).Error(); err != nil {
			t.Fatal(err)
		}
		slots = append(slots[:300:300], append([]lua.HeartbeatArgs{
			{Key: key, StreamID: "later", TTL: time.Minute, Own: true},
			{Key: key, StreamID: "gone", TTL: time.Minute, Own: true},
		}, slots[300:]...)...)
		before := time.Now()
		beats, errs := lua.HeartbeatMulti(ctx, c, slots, nil)
		for i, b := range beats {
			if errs[i] != nil {
				t.Fatalf("slot %d: %v", i, errs[i])
			}
			at := time.UnixMilli(b.ExpiresAtMs)
			switch id := slots[i].StreamID; id {
			case "later":
				if !b.Alive || b.ExpiresAtMs != later {
					t.Errorf("later: %+v, want alive with its own later expiry %d", b, later)
				}
			case "gone":
				if b.Alive || b.ExpiresAtMs != 0 {
					t.Errorf("gone: %+v, want lost", b)
				}
			default:
				if !b.Alive || at.Before(before.Add(time.Minute-time.Second)) || at.After(time.Now().Add(time.Minute)) {
					t.Fatalf("%s: %+v (expires %v), want alive for a minute from the call", id, b, at)
				}
			}
		}
		if err := c.Do(ctx, c.B().Zscore().Key(key).Member("gone").Build()).Error(); !rueidis.IsRedisNil(err) {
			t.Errorf("ZSCORE gone after its heartbeat: %v, want nil (a lost member is never re-added)", err)
		}
		if n, err := c.Do(ctx, c.B().Zcard().Key(key).Build()).AsInt64(); err != nil || n != 601 {
			t.Errorf("ZCARD = %d, %v; want the 601 members held", n, err)
		}
	})

	// The commands, counted on a server of the test's own.
	t.Run("commands", func(t *testing.T) {
		t.Parallel()
		c := privateServer(t)
		ctx := context.Background()
		zadds := func() int { return commandCalls(t, c, "zadd") }
		for _, tc := range []struct{ members, zadds int }{{1, 1}, {499, 1}, {500, 1}, {501, 2}, {1001, 3}} {
			key := fmt.Sprintf("heartbeat-given-%d:{pool}", tc.members)
			var slots []lua.HeartbeatArgs
			zadd := c.B().Zadd().Key(key).ScoreMember()
			for i := range tc.members {
				slots = append(slots, lua.HeartbeatArgs{Key: key, StreamID: fmt.Sprintf("m%d", i), TTL: time.Minute, Own: true})
				zadd = zadd.ScoreMember(float64(time.Now().Add(time.Second).UnixMilli()), slots[i].StreamID)
			}
			if err := c.Do(ctx, zadd.Build()).Error(); err != nil {
				t.Fatal(err)
			}
			from := zadds()
			beats, errs := lua.HeartbeatMulti(ctx, c, slots, nil)
			for i := range beats {
				if errs[i] != nil || !beats[i].Alive {
					t.Fatalf("%d members: member %d: %+v, %v; want alive", tc.members, i, beats[i], errs[i])
				}
			}
			if got := zadds() - from; got != tc.zadds {
				t.Errorf("%d members given their TTL: %d ZADDs, want %d", tc.members, got, tc.zadds)
			}
		}
	})
}

// TestAHeartbeatOfARecordWithoutItsTTLIsOneEverywhere: a slot whose
// record holds no TTL first (";caller=x") is kept by the heartbeat's
// fallback TTL on every backend: Redis, and the embedded store, whose
// string.match answers nothing (not nil) when there is no match.
func TestAHeartbeatOfARecordWithoutItsTTLIsOneEverywhere(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, embedded bool) {
		ctx := context.Background()
		key := newKey(t)
		if err := c.Do(ctx, c.B().Zadd().Key(key).ScoreMember().ScoreMember(float64(time.Now().Add(time.Minute).UnixMilli()), "s").Build()).Error(); err != nil {
			t.Fatal(err)
		}
		if err := c.Do(ctx, c.B().Hset().Key(keys.SlotRecords(key)).FieldValue().FieldValue("s", ";caller=x").Build()).Error(); err != nil {
			t.Fatal(err)
		}
		beat, err := lua.Heartbeat(ctx, c, "", key, "s", 2*time.Minute)
		if err != nil || !beat.Alive || time.Until(time.UnixMilli(beat.ExpiresAtMs)) < 90*time.Second {
			t.Errorf("embedded %v: the heartbeat of a slot whose record has no TTL: %+v, %v; want alive for the fallback's 2m", embedded, beat, err)
		}
	})
}
