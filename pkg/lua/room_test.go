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

// TestRoomIsTheWaitScriptsTestOfAFreeSlot: Room finds a slot free under
// the limit at one less than it and none at it, does not count a slot
// expired by the caller's clock, and applies an override while it is in
// force by that clock, in both directions.
func TestRoomIsTheWaitScriptsTestOfAFreeSlot(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key, _ := keys.Schema{Prefix: "lua-room:"}.UserKey(fmt.Sprintf("u-%d", time.Now().UnixNano()))
		room := func(limit int, now time.Time) bool {
			t.Helper()
			got, err := lua.Room(ctx, c, key, limit, now)
			if err != nil {
				t.Fatal(err)
			}
			return got
		}
		now := time.Now()
		if !room(1, now) {
			t.Fatal("no slot held, limit 1: no room; want room")
		}
		for _, s := range []string{"a", "b"} {
			if got, err := lua.Acquire(ctx, c, key, s, 3, 5*time.Minute, lua.Record{}, false); err != nil || !got.Granted {
				t.Fatalf("acquire %s: %+v, %v", s, got, err)
			}
		}
		if !room(3, now) || room(2, now) {
			t.Fatal("2 slots held: want room under a limit of 3 and none under 2")
		}
		if !room(2, now.Add(6*time.Minute)) {
			t.Fatal("2 slots expired by the caller's clock, limit 2: no room; want room")
		}
		if _, err := lua.SetOverride(ctx, c, key, 3, time.Minute, "opal", "raise"); err != nil {
			t.Fatal(err)
		}
		if !room(2, now) {
			t.Fatal("an override of 3 in force, 2 held, plan limit 2: no room; want room")
		}
		if later := now.Add(90 * time.Second); room(2, later) || !room(3, later) {
			t.Fatal("the override expired by the caller's clock, 2 held: want the plan's limit applied (none under 2, room under 3)")
		}
		if _, err := lua.SetOverride(ctx, c, key, 2, time.Minute, "opal", "lower"); err != nil {
			t.Fatal(err)
		}
		if room(5, now) {
			t.Fatal("an override of 2 in force, 2 held, plan limit 5: room; want none")
		}
	})
}
