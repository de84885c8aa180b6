package limiter

import (
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/lua"
)

// TestJoinedGrantsHoldTwoGenerations: a full generation of joinedGenMax
// streams is all remembered; the next stream starts a generation and
// the full one is still remembered; a stream is forgotten once two
// generations came after its own, by count or by joinedGenFor; peek
// returns what is remembered and keeps it, take forgets it.
func TestJoinedGrantsHoldTwoGenerations(t *testing.T) {
	var j joinedGrants
	now := time.Unix(1_700_000_000, 0)
	grant := []lua.PoolKey{{Pool: "model", Key: "m"}}
	id := func(i int) string { return "s-" + string(rune('a'+i%26)) + time.Duration(i).String() }
	for i := range joinedGenMax {
		j.remember("u", id(i), "", grant, now)
	}
	if n := j.len(); n != joinedGenMax {
		t.Fatalf("after %d grants, %d remembered; want all", joinedGenMax, n)
	}
	j.remember("u", id(joinedGenMax), "", grant, now) // the max + 1st
	if n := j.len(); n != joinedGenMax+1 {
		t.Fatalf("after %d grants, %d remembered; want all", joinedGenMax+1, n)
	}
	if got := j.peek("u", id(0)); len(got) != 1 || got[0] != grant[0] {
		t.Fatalf("peek of the first stream, one generation back: %+v; want %+v", got, grant)
	}
	if got := j.take("u", id(0)); len(got) != 1 || got[0] != grant[0] {
		t.Fatalf("take of the first stream, one generation back: %+v; want %+v", got, grant)
	}
	if got := j.take("u", id(0)); got != nil {
		t.Fatalf("take of a stream taken already: %+v; want nil", got)
	}
	if got := j.peek("u", id(0)); got != nil {
		t.Fatalf("peek of a stream taken already: %+v; want nil", got)
	}
	if got := j.take("v", id(1)); got != nil {
		t.Fatalf("take of another user's stream of the same id: %+v; want nil", got)
	}

	// Just short of joinedGenFor the generation goes on; at it, a new one
	// starts, and the one before the max + 1st's is forgotten.
	j.remember("u", "late", "", grant, now.Add(joinedGenFor-time.Nanosecond))
	if n := j.len(); n != joinedGenMax+1 {
		t.Fatalf("a grant just short of %v later: %d remembered; want %d", joinedGenFor, n, joinedGenMax+1)
	}
	j.remember("u", "later", "", grant, now.Add(joinedGenFor))
	if got := j.take("u", id(1)); got != nil {
		t.Fatalf("a stream two generations back: %+v; want forgotten", got)
	}
	for _, s := range []string{id(joinedGenMax), "late", "later"} {
		if got := j.take("u", s); len(got) != 1 {
			t.Errorf("take of %s, in the last two generations: %+v; want its grant", s, got)
		}
	}
	if n := j.len(); n != 0 {
		t.Errorf("%d remembered after every stream was taken or forgotten; want 0", n)
	}

	// A caller's: for heartbeats (peek) only; take forgets it.
	j.remember("u", "callers", "svc", grant, now)
	if got := j.peek("u", "callers"); len(got) != 1 {
		t.Errorf("peek of a caller's stream: %+v; want its pool keys", got)
	}
	if got := j.take("u", "callers"); got != nil {
		t.Errorf("take of a caller's stream: %+v; want nil (its release reads its record)", got)
	}
	if n := j.len(); n != 0 {
		t.Errorf("%d remembered after a caller's stream was taken; want 0", n)
	}
}
