package lua_test

import (
	"context"
	"fmt"
	"log/slog"
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
