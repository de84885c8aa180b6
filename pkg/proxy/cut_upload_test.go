package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestAStreamCutWhileItsBodyIsSentIsAnswered503: a stream cut by Close
// while its client is still sending the request body (the upstream has answered nothing) is answered 503
// limiter_unavailable, as docs/proxy.md "Shutdown" says of a stream cut
// before its upstream answered.
func TestAStreamCutWhileItsBodyIsSentIsAnswered503(t *testing.T) {
	arrived := make(chan struct{}, 1)
	e := newEnv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	}), envOptions{})
	user := newUser()
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.proxy.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nX-User-Id: %s\r\nX-Plan: one\r\n\r\n", user)
	fmt.Fprintf(conn, "5\r\n{\"a\":\r\n")
	select {
	case <-arrived:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream never got the request")
	}
	time.Sleep(100 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if cut, released := e.Holder.Close(ctx); cut != 1 || released != 1 {
		t.Errorf("Close = %d cut, %d released; want 1, 1", cut, released)
	}
	_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		buf := make([]byte, 8<<20)
		n := runtime.Stack(buf, true)
		if i := strings.Index(string(buf[:n]), "mapRoundTripError"); i >= 0 {
			t.Logf("the handler is stuck in the transport's RoundTrip, which waits for its writeLoop, reading the client's body:\n%s", string(buf[max(0, i-200):min(n, i+600)]))
		}
		t.Fatalf("the cut request's answer: %v; want 503", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "limiter_unavailable") {
		t.Errorf("the cut request's answer: %d %q; want 503 limiter_unavailable", resp.StatusCode, body)
	}
}

// TestAStreamWhoseSlotIsLostWhileItsBodyIsSentIsAnswered503: the same
// for a slot lost (support releases it) while the client is still sending
// its body: docs/proxy.md says such a stream is
// answered 503 slot_lost before the upstream has answered.
func TestAStreamWhoseSlotIsLostWhileItsBodyIsSentIsAnswered503(t *testing.T) {
	arrived := make(chan struct{}, 1)
	e := newEnv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	}), envOptions{})
	user := newUser()
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.proxy.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nX-User-Id: %s\r\nX-Plan: one\r\n\r\n", user)
	fmt.Fprintf(conn, "5\r\n{\"a\":\r\n")
	select {
	case <-arrived:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream never got the request")
	}
	slots, err := e.Stack.Limiter.Slots(context.Background(), user)
	if err != nil || len(slots.Slots) != 1 {
		t.Fatalf("slots: %+v %v", slots, err)
	}
	if _, err := e.Stack.Limiter.Release(context.Background(), user, slots.Slots[0].StreamID); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(6 * time.Second)) // heartbeats (1s) find the loss
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("the answer to the stream whose slot was lost: %v; want 503 slot_lost", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "slot_lost") {
		t.Errorf("the answer: %d %q; want 503 slot_lost", resp.StatusCode, body)
	}
}
