package lua_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/redis/rueidis"
)

// TestAnOverrideReplacesThePlansLimitUntilItExpires: the acquire script
// reads the user's override in the call that counts the slots, in both
// directions (more streams, and none), and stops applying it at its
// expiry by Redis time even where the store keeps the key (the embedded
// store never expires keys by itself).
func TestAnOverrideReplacesThePlansLimitUntilItExpires(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, embedded bool) {
		ctx := context.Background()
		key, _ := keys.Schema{Prefix: "lua-override:"}.UserKey(fmt.Sprintf("u-%d", time.Now().UnixNano()))
		acquire := func(stream string) lua.Acquired {
			t.Helper()
			got, err := lua.Acquire(ctx, c, key, stream, 1, time.Minute, lua.Record{}, false)
			if err != nil {
				t.Fatal(err)
			}
			return got
		}
		if got := acquire("a"); !got.Granted || got.Override != -1 {
			t.Fatalf("first acquire without an override: got %+v, want granted, override -1", got)
		}
		if got := acquire("b"); got.Granted {
			t.Fatalf("second acquire at the plan's limit of 1: got %+v, want denied", got)
		}

		set, err := lua.SetOverride(ctx, c, key, 3, 400*time.Millisecond, "opal", "ticket 1")
		if err != nil {
			t.Fatal(err)
		}
		if set.Limit != 3 || set.ExpiresAtMs-set.SetAtMs != 400 {
			t.Fatalf("SetOverride: got %+v, want limit 3 expiring 400ms after it was set", set)
		}
		for _, s := range []string{"b", "c"} {
			if got := acquire(s); !got.Granted || got.Override != 3 {
				t.Fatalf("acquire %s under an override of 3: got %+v, want granted with override 3", s, got)
			}
		}
		if got := acquire("d"); got.Granted || got.Used != 3 || got.Override != 3 {
			t.Fatalf("4th acquire under an override of 3: got %+v, want denied at used 3", got)
		}
		listing, err := lua.Slots(ctx, c, key, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if o := listing.Override; o == nil || o.Limit != 3 || o.Actor != "opal" || o.Reason != "ticket 1" || o.ExpiresAtMs != set.ExpiresAtMs {
			t.Fatalf("listed override: got %+v, want the one set", o)
		}

		time.Sleep(500 * time.Millisecond)
		if !embedded {
			if n, err := c.Do(ctx, c.B().Exists().Key(keys.Override(key)).Build()).AsInt64(); err != nil || n != 0 {
				t.Errorf("override key after its expiry: EXISTS %d, %v; want 0 (it expires with the override)", n, err)
			}
		}
		if got := acquire("d"); got.Granted || got.Override != -1 {
			t.Fatalf("acquire after the override expired: got %+v, want denied by the plan's limit, override -1", got)
		}
		if listing, err := lua.Slots(ctx, c, key, 1000); err != nil || listing.Override != nil {
			t.Fatalf("listed override after its expiry: got %+v, %v; want none", listing.Override, err)
		}

		// An override of 0: the user may not stream at all, whatever the plan.
		if _, err := lua.SetOverride(ctx, c, key, 0, time.Minute, "opal", "abuse"); err != nil {
			t.Fatal(err)
		}
		if _, err := lua.ReleaseAll(ctx, c, key, key+":released:x", time.Minute); err != nil {
			t.Fatal(err)
		}
		if got := acquire("e"); got.Granted || got.RetryAfterMs != time.Minute.Milliseconds() || got.Override != 0 {
			t.Fatalf("acquire under an override of 0: got %+v, want denied, retry after a TTL", got)
		}
		if ok, err := lua.RemoveOverride(ctx, c, key); err != nil || !ok {
			t.Fatalf("RemoveOverride of one in force: got %v, %v; want true", ok, err)
		}
		if ok, err := lua.RemoveOverride(ctx, c, key); err != nil || ok {
			t.Fatalf("RemoveOverride again: got %v, %v; want false (none in force)", ok, err)
		}
		if got := acquire("e"); !got.Granted || got.Override != -1 {
			t.Fatalf("acquire after the override was removed: got %+v, want granted by the plan", got)
		}
	})
}

// TestTheSlotsListingCarriesEachSlotsRecord: a slot's record holds the
// start (Redis time), caller, plan and label the acquire wrote; a
// re-acquire of a held slot keeps the first record.
func TestTheSlotsListingCarriesEachSlotsRecord(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key, _ := keys.Schema{Prefix: "lua-records:"}.UserKey(fmt.Sprintf("u-%d", time.Now().UnixNano()))
		rec := lua.Record{Caller: "chat-api", Plan: "paid", Label: "model=gpt;pod=7"}
		if _, err := lua.Acquire(ctx, c, key, "s", 3, time.Minute, rec, false); err != nil {
			t.Fatal(err)
		}
		first, err := lua.Slots(ctx, c, key, 1000)
		if err != nil || len(first.Slots) != 1 {
			t.Fatalf("Slots: got %+v, %v; want one slot", first, err)
		}
		got := first.Slots[0].Record
		if got.Record != rec || got.TTL != time.Minute {
			t.Errorf("record: got %+v, want %+v with a 1m TTL", got, rec)
		}
		if age := first.NowMs - got.StartedAtMs; got.StartedAtMs == 0 || age < 0 || age > 2000 {
			t.Errorf("started at %d, listed at %d: want a start by Redis time just before", got.StartedAtMs, first.NowMs)
		}
		time.Sleep(20 * time.Millisecond)
		if _, err := lua.Acquire(ctx, c, key, "s", 3, time.Minute, lua.Record{Caller: "other", Plan: "free"}, false); err != nil {
			t.Fatal(err)
		}
		again, err := lua.Slots(ctx, c, key, 1000)
		if err != nil || len(again.Slots) != 1 || again.Slots[0].Record != got {
			t.Fatalf("record after a re-acquire of the held slot: got %+v, %v; want the first one kept, %+v", again.Slots, err, got)
		}
	})
}
