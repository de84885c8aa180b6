package cluster

import (
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/keys"
)

func TestEmbeddedSweepDropsOnlyLongAbandonedKeys(t *testing.T) {
	store, err := startEmbedded(slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer store.close()
	now := time.Now()
	old := float64(now.Add(-25 * time.Hour).UnixMilli())
	recent := float64(now.Add(-time.Hour).UnixMilli())
	_, _ = store.server.ZAdd("abandoned", old, "s1")
	_, _ = store.server.ZAdd("expired-recently", recent, "s1")
	_, _ = store.server.ZAdd("mixed", old, "s1")
	_, _ = store.server.ZAdd("mixed", float64(now.Add(time.Minute).UnixMilli()), "s2")
	_ = store.server.Set("not-a-zset", "x")
	// A queue's scores are arrival times, no expiries: the sweep goes by
	// its tickets' expiries (t1's is live).
	_, _ = store.server.ZAdd(keys.Queue("p:{u}"), old, "t1")
	_, _ = store.server.ZAdd(keys.QueueExpiry("p:{u}"), float64(now.Add(time.Minute).UnixMilli()), "t1")
	store.server.HSet(keys.SlotRecords("abandoned"), "s1", "120000")
	store.server.HSet(keys.SlotRecords("mixed"), "s1", "120000", "s2", "120000")

	store.sweep(now)

	if store.server.Exists("abandoned") {
		t.Error("a key whose newest slot expired 25h ago survived the sweep")
	}
	if members, _ := store.server.SortedSet("mixed"); len(members) != 1 || members["s2"] == 0 {
		t.Errorf("mixed after the sweep = %v, want only the live slot s2", members)
	}
	if store.server.Exists(keys.SlotRecords("abandoned")) {
		t.Error("the records of a swept key survived the sweep")
	}
	if fields, _ := store.server.HKeys(keys.SlotRecords("mixed")); len(fields) != 1 || fields[0] != "s2" {
		t.Errorf("records of mixed after the sweep = %v, want only the live slot's s2", fields)
	}
	for _, key := range []string{"expired-recently", "mixed", "not-a-zset", keys.Queue("p:{u}")} {
		if !store.server.Exists(key) {
			t.Errorf("the sweep deleted %q", key)
		}
	}
}

// TestEmbeddedSweepDropsReleasedAnswers: release_all keeps each call's
// answer for a minute, which miniredis would keep for ever; the sweep
// drops an answer it already saw one sweep earlier.
func TestEmbeddedSweepDropsReleasedAnswers(t *testing.T) {
	store, err := startEmbedded(slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer store.close()
	answer, err := keys.ReleasedAnswer("p:{u}", "3f2a9c1e5b7d4a60")
	if err != nil {
		t.Fatal(err)
	}
	_ = store.server.Set(answer, "0 a b")
	_ = store.server.Set("p:{a:released:b}", "not an answer")
	now := time.Now()

	store.sweep(now)
	if !store.server.Exists(answer) {
		t.Fatal("the first sweep to see an answer dropped it; it may be less than a minute old")
	}
	store.sweep(now.Add(sweepEvery))
	if store.server.Exists(answer) {
		t.Error("an answer seen by the previous sweep survived the next")
	}
	if !store.server.Exists("p:{a:released:b}") {
		t.Error("the sweep dropped a key that only looks like an answer inside its hash tag")
	}
}

// TestEmbeddedSweepDropsExpiredOverrides: miniredis keeps an override's
// key past its expiry; the sweep deletes it once expired, and leaves one
// in force and other hashes alone.
func TestEmbeddedSweepDropsExpiredOverrides(t *testing.T) {
	store, err := startEmbedded(slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer store.close()
	now := time.Now()
	expired, live := keys.Override("p:{a}"), keys.Override("p:{b}")
	store.server.HSet(expired, "limit", "5", "expires_at", strconv.FormatInt(now.Add(-time.Second).UnixMilli(), 10))
	store.server.HSet(live, "limit", "5", "expires_at", strconv.FormatInt(now.Add(time.Hour).UnixMilli(), 10))
	store.server.HSet("p:{c:override}", "expires_at", "1")

	store.sweep(now)
	if store.server.Exists(expired) {
		t.Error("an expired override survived the sweep")
	}
	for _, key := range []string{live, "p:{c:override}"} {
		if !store.server.Exists(key) {
			t.Errorf("the sweep deleted %q", key)
		}
	}
}
