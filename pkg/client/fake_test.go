package client_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/httpapi"
)

// fakeLimiter is an in-memory stand-in for the limiter's HTTP API, with
// hooks to count requests and inject failures. Slots never expire on their
// own: tests that need a lost slot remove it (drop). A slot belongs to the
// caller (Authorization header) that acquired it, as with api.tokensFile:
// another caller's acquire, heartbeat or release of it is not_slot_holder.
type fakeLimiter struct {
	t   *testing.T
	srv *httptest.Server

	mu       sync.Mutex
	tiers    map[string]fakeTier
	slots    map[string]map[string]bool // user → stream ids
	holders  map[fakeSlot]string        // the Authorization header each slot was acquired with
	nextID   int
	degraded bool // answer acquires and heartbeats degraded, keep nothing
	// beats records every batch request, in arrival order.
	beats    []fakeBatch
	releases int
	// onHeartbeats, when set, answers POST /v1/slots/heartbeats instead;
	// it returns false to fall through to the normal answer.
	onHeartbeats func(w http.ResponseWriter, r *http.Request) bool
	// onAcquire likewise for POST /v1/slots/acquire.
	onAcquire func(w http.ResponseWriter, r *http.Request) bool
	// onRelease, when set, runs before a release is applied: a slow one.
	onRelease func()
	// slotError, when set, gives the per-slot error of a batch result.
	slotError func(streamID string) *httpapi.Error
	headers   []http.Header // of every request
}

type fakeSlot struct{ userID, streamID string }

type fakeTier struct {
	limit      int
	intervalMs int64
}

type fakeBatch struct {
	at      time.Time
	streams []string
}

func newFake(t *testing.T) *fakeLimiter {
	t.Helper()
	f := &fakeLimiter{
		t:       t,
		tiers:   map[string]fakeTier{"free": {1, 50}, "paid": {3, 50}, "bulk": {100_000, 400}},
		slots:   map[string]map[string]bool{},
		holders: map[fakeSlot]string{},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+httpapi.PathAcquire, f.acquire)
	mux.HandleFunc("POST "+httpapi.PathHeartbeats, f.heartbeat)
	mux.HandleFunc("POST "+httpapi.PathRelease, f.release)
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.headers = append(f.headers, r.Header.Clone())
		f.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeLimiter) URL() string { return f.srv.URL }

func (f *fakeLimiter) acquire(w http.ResponseWriter, r *http.Request) {
	if f.onAcquire != nil && f.onAcquire(w, r) {
		return
	}
	var req httpapi.AcquireRequest
	if !decode(w, r, &req) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	tier, ok := f.tiers[req.Plan]
	if !ok {
		writeError(w, http.StatusUnprocessableEntity, httpapi.Error{Code: httpapi.CodeUnknownPlan, Message: "no plan " + req.Plan})
		return
	}
	if req.StreamID == "" {
		f.nextID++
		req.StreamID = fmt.Sprintf("s%d", f.nextID)
	}
	resp := httpapi.AcquireResponse{
		Granted: true, StreamID: req.StreamID, Limit: tier.limit,
		ExpiresAt: time.Now().Add(time.Duration(3*tier.intervalMs) * time.Millisecond).UTC(),
		TTLMs:     3 * tier.intervalMs, HeartbeatIntervalMs: tier.intervalMs, Degraded: f.degraded,
	}
	if !f.degraded {
		held := f.slots[req.UserID]
		if held == nil {
			held = map[string]bool{}
			f.slots[req.UserID] = held
		}
		if f.heldByAnotherLocked(r, req.UserID, req.StreamID) {
			writeError(w, http.StatusForbidden, notSlotHolder(req.UserID, req.StreamID))
			return
		}
		if !held[req.StreamID] && len(held) >= tier.limit {
			used, retry := len(held), int64(1500)
			writeError(w, http.StatusTooManyRequests, httpapi.Error{Code: httpapi.CodeStreamLimitReached, Message: "limit", Used: &used, Limit: &tier.limit, RetryAfterMs: &retry})
			return
		}
		held[req.StreamID] = true
		f.holders[fakeSlot{req.UserID, req.StreamID}] = r.Header.Get("Authorization")
		resp.Used = len(held)
	}
	writeJSON(w, http.StatusOK, resp)
}

func (f *fakeLimiter) heartbeat(w http.ResponseWriter, r *http.Request) {
	var req httpapi.HeartbeatsRequest
	if !decode(w, r, &req) {
		return
	}
	batch := fakeBatch{at: time.Now()}
	for _, s := range req.Slots {
		batch.streams = append(batch.streams, s.StreamID)
	}
	f.mu.Lock()
	f.beats = append(f.beats, batch)
	hook := f.onHeartbeats
	f.mu.Unlock()
	if len(req.Slots) > httpapi.MaxBatch {
		writeError(w, http.StatusBadRequest, httpapi.Error{Code: httpapi.CodeInvalidRequest, Message: "batch too large"})
		return
	}
	if hook != nil && hook(w, r) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := httpapi.HeartbeatsResponse{Results: make([]httpapi.HeartbeatResult, len(req.Slots))}
	for i, s := range req.Slots {
		res := httpapi.HeartbeatResult{StreamID: s.StreamID}
		if f.slotError != nil {
			res.Error = f.slotError(s.StreamID)
		}
		switch {
		case res.Error != nil:
		case f.degraded:
			at := time.Now().Add(time.Second).UTC()
			res.Alive, res.Degraded, res.ExpiresAt = true, true, &at
		case f.heldByAnotherLocked(r, s.UserID, s.StreamID):
			e := notSlotHolder(s.UserID, s.StreamID)
			res.Error = &e
		case f.slots[s.UserID][s.StreamID]:
			at := time.Now().Add(time.Second).UTC()
			res.Alive, res.ExpiresAt = true, &at
		}
		out.Results[i] = res
	}
	writeJSON(w, http.StatusOK, out)
}

func (f *fakeLimiter) release(w http.ResponseWriter, r *http.Request) {
	var req httpapi.ReleaseRequest
	if !decode(w, r, &req) {
		return
	}
	if f.onRelease != nil {
		f.onRelease()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.releases++
	if f.heldByAnotherLocked(r, req.UserID, req.StreamID) {
		writeError(w, http.StatusForbidden, notSlotHolder(req.UserID, req.StreamID))
		return
	}
	released := f.slots[req.UserID][req.StreamID]
	delete(f.slots[req.UserID], req.StreamID)
	delete(f.holders, fakeSlot{req.UserID, req.StreamID})
	writeJSON(w, http.StatusOK, httpapi.ReleaseResponse{Released: released})
}

// drop removes a slot as support (or expiry) would.
func (f *fakeLimiter) drop(userID, streamID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.slots[userID], streamID)
	delete(f.holders, fakeSlot{userID, streamID})
}

// takeOver makes the slot held by the caller of token, at once: as if it
// had expired or been released by support and that caller acquired it.
func (f *fakeLimiter) takeOver(userID, streamID, token string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.slots[userID] == nil {
		f.slots[userID] = map[string]bool{}
	}
	f.slots[userID][streamID] = true
	f.holders[fakeSlot{userID, streamID}] = "Bearer " + token
}

// heldByAnotherLocked reports whether the slot is held by a caller other
// than r's. A slot put in place by a test (no recorded holder) is anyone's.
func (f *fakeLimiter) heldByAnotherLocked(r *http.Request, userID, streamID string) bool {
	holder, ok := f.holders[fakeSlot{userID, streamID}]
	return ok && f.slots[userID][streamID] && holder != r.Header.Get("Authorization")
}

func notSlotHolder(userID, streamID string) httpapi.Error {
	return httpapi.Error{Code: httpapi.CodeNotSlotHolder, Message: fmt.Sprintf("stream %s of user %s is held by another caller", streamID, userID)}
}

func (f *fakeLimiter) used(userID string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.slots[userID])
}

func (f *fakeLimiter) batches() []fakeBatch {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fakeBatch(nil), f.beats...)
}

func (f *fakeLimiter) set(fn func(f *fakeLimiter)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// waitBatches waits until at least n heartbeat requests arrived.
func (f *fakeLimiter) waitBatches(n int, within time.Duration) []fakeBatch {
	f.t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := f.batches()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("got %d heartbeat requests within %s, want at least %d", len(got), within, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	limit := int64(httpapi.MaxBodyBytes)
	if r.URL.Path == httpapi.PathHeartbeats {
		limit = 1 << 20 // the server's bound of a batch: 1000 slots of 32-character ids pass 64 KiB
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, httpapi.Error{Code: httpapi.CodeInvalidRequest, Message: err.Error()})
		return false
	}
	return true
}

func writeError(w http.ResponseWriter, status int, e httpapi.Error) {
	writeJSON(w, status, httpapi.ErrorResponse{Error: e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// hangUp closes the connection without an answer: a network error.
func hangUp(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		conn.Close()
	}
}

// hang answers nothing until the client gives up. The body is read first:
// the server notices a closed connection only once it reads past the body.
func hang(r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	<-r.Context().Done()
}
