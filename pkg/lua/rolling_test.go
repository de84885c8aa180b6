package lua_test

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"strconv"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/lua"
	"github.com/redis/rueidis"
)

// The previous release's scripts (testdata/previous/README.md): its
// acquire, release and wait bodies, its lib_holder.lua and
// lib_tickets.lua, with the piece it shares with this release.
var (
	//go:embed testdata/previous/acquire.lua
	previousAcquireBody string
	//go:embed testdata/previous/release.lua
	previousReleaseBody string
	//go:embed testdata/previous/wait.lua
	previousWaitBody string
	//go:embed testdata/previous/lib_holder.lua
	previousLibHolder string
	//go:embed testdata/previous/lib_tickets.lua
	previousLibTickets string

	previousAcquireSource = lua.ComposeWhole(previousAcquireBody, lua.LibPrune, previousLibHolder, previousLibTickets)
	previousReleaseSource = lua.ComposeWhole(previousReleaseBody, lua.LibPrune, previousLibHolder, previousLibTickets)
	previousWaitSource    = lua.ComposeWhole(previousWaitBody, lua.LibPrune, previousLibHolder, previousLibTickets)
	previousAcquire       = rueidis.NewLuaScript(previousAcquireSource)
	previousRelease       = rueidis.NewLuaScript(previousReleaseSource)
	previousWait          = rueidis.NewLuaScript(previousWaitSource)
)

// TestThePreviousScriptsAreThePreviousRelease: composed here, the
// previous release's scripts are the ones its replicas load (their SHA1,
// the name Redis keeps a script by). When one of the pieces they share
// with this release changes, its previous version goes to testdata too.
func TestThePreviousScriptsAreThePreviousRelease(t *testing.T) {
	for name, c := range map[string]struct{ source, sha string }{
		"acquire": {previousAcquireSource, "738630d7b27464716e75d22318c97c7e36f974c5"},
		"release": {previousReleaseSource, "9c4d321cd5757cb4649a8c2802de1c1c73f1166b"},
		"wait":    {previousWaitSource, "01b2e2ee016a445b41869dca18eb2540e141d341"},
	} {
		if sum := sha1.Sum([]byte(c.source)); hex.EncodeToString(sum[:]) != c.sha {
			t.Errorf("the previous %s script composed here has SHA1 %x; want %s, the previous release's", name, sum, c.sha)
		}
	}
}

// TestARollingUpdateKeepsEachRequestsShare: while a rolling update runs,
// replicas of the previous release and of this one act on the same
// slots. The previous scripts read the first request a record names, as
// the one they knew, and keep the others; so a request this version
// named behind the latest keeps its share through an extension by the
// previous version, and its call asked again is answered that share.
// (The latest request's entry is the one the previous version replaces:
// that request, asked again, counts one more share, as before the
// list.) However the two versions leave the shares, the slot goes with
// the last of them, and not before.
func TestARollingUpdateKeepsEachRequestsShare(t *testing.T) {
	eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
		ctx := context.Background()
		key := newKey(t)
		rec := func(tok string) lua.Record { return lua.Record{Plan: "paid", Token: tok} }
		acquire := func(tok string) lua.Acquired {
			t.Helper()
			got, err := lua.Acquire(ctx, c, key, "s", 3, time.Minute, rec(tok), false)
			if err != nil || !got.Granted {
				t.Fatalf("acquire %s: %+v, %v", tok, got, err)
			}
			return got
		}
		previous := func(tok string) int64 {
			t.Helper()
			arr, err := previousAcquire.Exec(ctx, c, lua.AcquireKeys(key),
				[]string{"s", "3", "60000", ";by=0@" + tok + ";plan=paid", "1"}).ToArray()
			if err != nil || len(arr) != 9 {
				t.Fatalf("the previous acquire script, %s: %v, %v", tok, arr, err)
			}
			granted, err := arr[0].AsInt64()
			if err != nil || granted < 1 {
				t.Fatalf("the previous acquire script, %s: granted %d, %v", tok, granted, err)
			}
			return granted
		}

		a := acquire("tokA")
		acquire("tokB")
		if got := previous("tokC"); got != 2 {
			t.Fatalf("the previous version's acquire of the held stream: %d; want 2, an extension", got)
		}
		again := acquire("tokA")
		if again.Extended || again.Share() != a.Share() {
			t.Fatalf("A asked again after the previous version extended: Extended %v share %+v; want its first try's answer, a new slot, share %+v",
				again.Extended, again.Share(), a.Share())
		}

		// Shares 0 (A), 1 (B) and 2 (C), left in turn by this version and
		// the previous one.
		start := strconv.FormatInt(a.Share().StartedAtMs, 10)
		for share := range 3 {
			last := share == 2
			if share%2 == 1 {
				arr, err := previousRelease.Exec(ctx, c, lua.ReleaseKeys(key), []string{"s", "", strconv.Itoa(share), start}).ToArray()
				if err != nil || len(arr) == 0 {
					t.Fatalf("the previous release script, share %d: %v, %v", share, arr, err)
				}
				if released, _ := arr[0].AsInt64(); (released == 1) != last {
					t.Fatalf("the previous version leaves share %d of 3: answered %d; want the slot released by the last share only", share, released)
				}
				continue
			}
			rel, err := lua.ReleaseMember(ctx, c, "", lua.Member{Key: key, ID: "s", Owned: true, Share: lua.Share{Index: share, StartedAtMs: a.Share().StartedAtMs}})
			if err != nil || rel.Released != last {
				t.Fatalf("this version leaves share %d of 3: %+v, %v; want the slot released by the last share only", share, rel, err)
			}
		}
		if listed, err := lua.Slots(ctx, c, key, 1000); err != nil || len(listed.Slots) != 0 {
			t.Errorf("after every share left: %+v, %v; want no slot", listed.Slots, err)
		}
	})
}

// TestAGiveBackLeavesALaterSharesExpiry: a stream's slot whose first
// request crashed (its expiry E0) is extended by a request of this
// release (to E1, a few ms later, by the slot's own TTL), then by one of
// the previous release whose plan's TTL is shorter (its user's plan
// changed meanwhile): that one's ZADD GT
// leaves E1, and it is answered E1. The first of the two gives up: it
// gives its time back only once no later share is held, so the slot
// keeps the expiry the previous release's request was answered while
// that request holds it, and goes back to E0 once it left first.
func TestAGiveBackLeavesALaterSharesExpiry(t *testing.T) {
	for _, later := range []struct {
		name  string
		left  bool // the previous release's request gave up first
		wantB func(e0, e1 int64) int64
	}{
		{"held", false, func(_, e1 int64) int64 { return e1 }},
		{"given up first", true, func(e0, _ int64) int64 { return e0 }},
	} {
		t.Run(later.name, func(t *testing.T) {
			eachServer(t, func(t *testing.T, c rueidis.Client, _ bool) {
				ctx := context.Background()
				key := newKey(t)
				a, err := lua.Acquire(ctx, c, key, "s", 3, time.Minute, lua.Record{Plan: "paid", Token: "tokA"}, false)
				if err != nil || !a.Granted {
					t.Fatalf("acquire A: %+v, %v", a, err)
				}
				time.Sleep(3 * time.Millisecond) // for B to move the slot
				b, err := lua.Acquire(ctx, c, key, "s", 3, time.Minute, lua.Record{Plan: "paid", Token: "tokB"}, false)
				if err != nil || !b.Extended || b.Extension().FromMs != a.ExpiresAtMs {
					t.Fatalf("acquire B: %+v (extension %+v), %v; want an extension from A's expiry %d", b, b.Extension(), err, a.ExpiresAtMs)
				}
				arr, err := previousAcquire.Exec(ctx, c, lua.AcquireKeys(key),
					[]string{"s", "3", "30000", ";by=0@tokC;plan=paid", "1"}).ToArray()
				if err != nil || len(arr) != 9 {
					t.Fatalf("the previous acquire script, C: %v, %v", arr, err)
				}
				granted, _ := arr[0].AsInt64()
				answered, _ := arr[2].AsInt64()
				if granted != 2 || answered != b.ExpiresAtMs {
					t.Fatalf("the previous acquire script, C: granted %d expiring at %d; want 2, an extension answered B's %d", granted, answered, b.ExpiresAtMs)
				}
				if later.left {
					arr, err := previousRelease.Exec(ctx, c, lua.ReleaseKeys(key),
						[]string{"s", "", "2", strconv.FormatInt(a.StartedAtMs, 10)}).ToArray()
					if err != nil || len(arr) == 0 {
						t.Fatalf("the previous release script, C: %v, %v", arr, err)
					}
				}
				rel, err := lua.ReleaseMember(ctx, c, "", lua.Member{Key: key, ID: "s", Owned: true, Share: b.Share(), Back: b.Extension()})
				if err != nil || rel.Released {
					t.Fatalf("B gives up: %+v, %v; want the slot kept for A's share", rel, err)
				}
				score, err := c.Do(ctx, c.B().Zscore().Key(key).Member("s").Build()).AsInt64()
				if err != nil {
					t.Fatalf("the slot after B gave up: %v", err)
				}
				if want := later.wantB(a.ExpiresAtMs, b.ExpiresAtMs); score != want {
					t.Errorf("after B gave up, the slot expires at %d; want %d (A's %d, B's and C's %d)", score, want, a.ExpiresAtMs, b.ExpiresAtMs)
				}
			})
		})
	}
}
