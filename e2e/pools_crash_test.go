package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/redis/rueidis"
)

// poolsCrashConfig is free=1 with a 2s TTL and pool model, gpt-4o capped
// at 1, on the shared Redis Cluster under prefix.
func poolsCrashConfig(t *testing.T, prefix string) string {
	t.Helper()
	return serveConfig(testenv.Cluster(t), prefix, incidentTiers) + `pools:
  static:
    - pool: model
      keys: {gpt-4o: 1}
`
}

// acquireStatus sends an acquire to srv and returns its status and code.
func acquireStatus(t *testing.T, srv *servetest.Process, user string, pools map[string]string) (int, string) {
	t.Helper()
	body := map[string]any{"user_id": user, "plan": "free"}
	if pools != nil {
		body["pools"] = pools
	}
	status, _, data := call(t, &http.Client{Timeout: 10 * time.Second}, http.MethodPost, srv.API+"/v1/slots/acquire", body, nil)
	var e httpapi.ErrorResponse
	_ = json.Unmarshal(data, &e)
	return status, e.Error.Code
}

// TestPoolCrashAfterTheAcquiresCalls: a serve process SIGKILLed after
// its acquire's scripts took the user's slot and the pool key's
// membership (sent at once), before it answered, leaves both held: the
// user and the key refuse others right after the crash. Both expire by
// their own scores within the TTL, with no reaper.
func TestPoolCrashAfterTheAcquiresCalls(t *testing.T) {
	prefix := "e2e-pools-crash-" + randomID() + ":"
	config := poolsCrashConfig(t, prefix)
	healthy := servetest.Start(t, servetest.Options{Config: config, AwaitRedis: true})
	faulty := servetest.Start(t, servetest.Options{Config: config, AwaitRedis: true, FaultPoint: "after-acquire-calls"})
	redis, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: testenv.Cluster(t), DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer redis.Close()

	user := "crash-" + randomID()
	body := `{"user_id":"` + user + `","plan":"free","pools":{"model":"gpt-4o"}}`
	go func() { // stops for good at the fault point: the kill ends it
		resp, err := (&http.Client{Timeout: 15 * time.Second}).Post(faulty.API+"/v1/slots/acquire", "application/json", strings.NewReader(body))
		if err == nil {
			resp.Body.Close()
		}
	}()
	userKey := prefix + "{" + user + "}"
	poolKey := prefix + "pool:{model=gpt-4o}"
	eventually(t, 5*time.Second, "the faulty process took the user's slot and the key's membership", func() bool {
		u, err1 := redis.Do(context.Background(), redis.B().Zcard().Key(userKey).Build()).AsInt64()
		p, err2 := redis.Do(context.Background(), redis.B().Zcard().Key(poolKey).Build()).AsInt64()
		return err1 == nil && err2 == nil && u == 1 && p == 1
	})
	faulty.Kill()
	killed := time.Now()

	if status, code := acquireStatus(t, healthy, user, nil); status != http.StatusTooManyRequests || code != httpapi.CodeStreamLimitReached {
		t.Errorf("the user's acquire right after the crash: %d %s; want 429 stream_limit_reached (the slot is held until it expires)", status, code)
	}
	other := "crash-other-" + randomID()
	if status, code := acquireStatus(t, healthy, other, map[string]string{"model": "gpt-4o"}); status != http.StatusTooManyRequests || code != httpapi.CodePoolLimitReached {
		t.Errorf("another user's model=gpt-4o right after the crash: %d %s; want 429 pool_limit_reached (the membership is held until it expires)", status, code)
	}
	eventually(t, 4*time.Second, "the crashed process's slot and membership expired (2s TTL)", func() bool {
		status, _ := acquireStatus(t, healthy, user, map[string]string{"model": "gpt-4o"})
		return status == http.StatusOK
	})
	if held := time.Since(killed); held > 2*time.Second+time.Second {
		t.Errorf("the crashed slot and membership were held %s after the kill, past their 2s TTL", held)
	}
}

// TestPoolMembershipOfACrashedHolderExpires: a stream that joined
// model=gpt-4o and whose holder stops (its serve process SIGKILLed, its
// client gone with it, no release, no heartbeat) frees the pool key
// within the slot TTL, with no reaper.
func TestPoolMembershipOfACrashedHolderExpires(t *testing.T) {
	prefix := "e2e-pools-expire-" + randomID() + ":"
	config := poolsCrashConfig(t, prefix)
	a := servetest.Start(t, servetest.Options{Config: config, AwaitRedis: true})
	b := servetest.Start(t, servetest.Options{Config: config, AwaitRedis: true})
	if status, code := acquireStatus(t, a, "holder-"+randomID(), map[string]string{"model": "gpt-4o"}); status != http.StatusOK {
		t.Fatalf("holder's acquire: %d %s", status, code)
	}
	a.Kill()
	killed := time.Now()
	if status, code := acquireStatus(t, b, "next-"+randomID(), map[string]string{"model": "gpt-4o"}); status != http.StatusTooManyRequests || code != httpapi.CodePoolLimitReached {
		t.Fatalf("acquire of the held key right after the crash: %d %s; want 429 pool_limit_reached", status, code)
	}
	eventually(t, 4*time.Second, "the crashed holder's membership expired (2s TTL)", func() bool {
		status, _ := acquireStatus(t, b, "next-"+randomID(), map[string]string{"model": "gpt-4o"})
		return status == http.StatusOK
	})
	if held := time.Since(killed); held > 3*time.Second {
		t.Errorf("the membership was held %s after the crash, past its 2s TTL", held)
	}
}
