package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/joishi/limiter/internal/envoytest"
	"github.com/joishi/limiter/pkg/extproc"
)

// Through ext_proc, the requests of a user at the limit wait in line
// across three serve processes (--extproc-wait 20s, plan solo's maxWait
// 30s) and are served in the order they came, each as the stream before
// it ends; each extended Envoy's message timer by its wait plus the
// margin before it waited.
func TestExtProcWaitsInLineAcrossProcesses(t *testing.T) {
	s := startExtProcStackWith(t, 3, waitTiers, "--extproc-wait", "20s")
	user := "xw-" + randomID()
	prev, resp := request(t, s.envoys[0], user, "solo")
	if !granted(resp) {
		t.Fatalf("the first stream: %v, want granted", resp)
	}

	type answered struct {
		resp *extprocv3.ProcessingResponse
		err  error
	}
	var streams []*envoytest.Stream
	var answers []chan answered
	for i := range 3 {
		st, err := s.envoys[(i+1)%3].Open(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		ch := make(chan answered, 1)
		go func() {
			resp, err := st.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", user, "x-plan", "solo"), false)
			ch <- answered{resp, err}
		}()
		streams, answers = append(streams, st), append(answers, ch)
		awaitExtProcQueue(t, s, user, i+1)
	}

	for i, ch := range answers {
		// A response without a body: the stream is over, its slot released.
		if _, err := prev.ResponseHeaders(envoytest.Headers(":status", "200"), true); err != nil {
			t.Fatal(err)
		}
		var a answered
		select {
		case a = <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("waiter %d: no answer within 5s of the slot's release", i)
		}
		if a.err != nil || !granted(a.resp) {
			t.Fatalf("waiter %d: %v, %v; want granted", i, a.resp, a.err)
		}
		for j, later := range answers[i+1:] {
			select {
			case b := <-later:
				t.Fatalf("waiter %d answered before its turn: %v, %v", i+1+j, b.resp, b.err)
			default:
			}
		}
		if want := []time.Duration{20*time.Second + extproc.TimerMargin}; !slices.Equal(streams[i].Overrides, want) {
			t.Errorf("waiter %d sent override_message_timeout %v, want %v", i, streams[i].Overrides, want)
		}
		prev = streams[i]
	}
	if _, err := prev.ResponseHeaders(envoytest.Headers(":status", "200"), true); err != nil {
		t.Fatal(err)
	}
	s.awaitUsed(t, user, 0, 2*time.Second)
}

// awaitExtProcQueue waits up to 5s for user's queue to hold n acquires.
func awaitExtProcQueue(t *testing.T, s *extprocStack, user string, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := s.slots.Slots(context.Background(), user)
		if err == nil && len(got.Queue) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue of %s: %+v, %v; want %d waiting", user, got.Queue, err, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
