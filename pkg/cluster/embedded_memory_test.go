package cluster

import (
	"reflect"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/lua"
)

// heapInUse returns the live heap after a full collection.
func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var stats runtime.MemStats
	runtime.ReadMemStats(&stats)
	return int64(stats.HeapAlloc)
}

// watchEntries is how many keys miniredis keeps a WATCH version of. It
// fails the test when miniredis no longer has that map: the sweep then
// cannot bound the store's memory (see dropWatchVersions).
func watchEntries(t *testing.T, store *embeddedStore) int {
	t.Helper()
	field := reflect.ValueOf(store.server.DB(0)).Elem().FieldByName("keyVersion")
	if !field.IsValid() || field.Type() != reflect.TypeFor[map[string]uint]() {
		t.Fatal("miniredis's RedisDB has no keyVersion map[string]uint: a miniredis upgrade changed it, and the embedded store's sweep no longer bounds its memory; see dropWatchVersions")
	}
	return field.Len()
}

// TestEmbeddedStoreMemoryFollowsLiveKeys: a user who acquired and
// released a stream leaves nothing in the embedded store after the next
// sweep, though miniredis keeps a WATCH version for every key name ever
// written (deleting a key bumps it).
func TestEmbeddedStoreMemoryFollowsLiveKeys(t *testing.T) {
	c, ctx := onEmbedded(t)
	redis := connected(t, c)
	store := c.embedded
	if !store.watch.found() {
		t.Fatal("the embedded store did not find miniredis's WATCH versions (a miniredis upgrade changed them): its memory grows with every key name ever written")
	}
	user := func(i int) string { return "joishi:streams:{user-" + strconv.Itoa(i) + "-0123456789}" }
	const users = 1000
	for i := range users {
		got, err := lua.Acquire(ctx, redis, user(i), "s1", 1, time.Minute, lua.Record{Caller: "alice"}, false)
		if err != nil || !got.Granted {
			t.Fatalf("acquire = %+v, %v; want granted", got, err)
		}
		if _, err := lua.Release(ctx, redis, "alice", user(i), "s1"); err != nil {
			t.Fatal(err)
		}
	}
	store.sweep(time.Now())
	if live, entries := len(store.server.Keys()), watchEntries(t, store); entries > live {
		t.Errorf("after %d users acquired and released a stream, and a sweep: %d keys live, %d WATCH versions kept; want no more than the live keys", users, live, entries)
	}

	// At scale, with the store's own commands.
	const more = 20000
	before := heapInUse()
	for i := range more {
		key := user(users + i)
		_, _ = store.server.ZAdd(key, 1, "s1")
		store.server.HSet(keys.SlotRecords(key), "s1", "60000;started=1;caller=alice")
		_, _ = store.server.ZRem(key, "s1")
		store.server.Del(keys.SlotRecords(key))
	}
	store.sweep(time.Now())
	grown := heapInUse() - before
	live, entries := len(store.server.Keys()), watchEntries(t, store)
	t.Logf("after %d more users and a sweep: %d keys live, %d WATCH versions kept, heap %+d bytes (%d a user)", more, live, entries, grown, grown/more)
	if entries > live {
		t.Errorf("after %d more users and a sweep: %d keys live, %d WATCH versions kept; want no more than the live keys", more, live, entries)
	}
	if grown > more*20 {
		t.Errorf("heap grew by %d bytes (%d a user) for %d users who hold nothing; want under 20 a user", grown, grown/more, more)
	}
}
