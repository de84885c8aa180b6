package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/proxy"
)

// A client that reads nothing, its connection open, holds its slot no
// longer than the stall timeout: the proxy's write to it blocks once the
// buffers between them fill, the write's deadline cuts the stream, and
// the slot is released, as for a client that went away. A stream quiet
// for twice that timeout, its client there, is not cut, nor is its last
// chunk after the quiet.
func TestAClientThatReadsNothingLosesItsSlot(t *testing.T) {
	const stall = 300 * time.Millisecond
	upstreamDone := make(chan struct{}, 8)
	e := newEnv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { upstreamDone <- struct{}{} }()
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		if r.URL.Query().Has("quiet") {
			fmt.Fprint(w, "data: first\n\n")
			_ = rc.Flush()
			time.Sleep(2 * stall)
			fmt.Fprint(w, "data: last\n\n")
			return
		}
		chunk := []byte("data: " + strings.Repeat("x", 32<<10) + "\n\n")
		for range 8 << 10 { // up to 256 MiB: far more than the buffers hold
			if _, err := w.Write(chunk); err != nil {
				return
			}
			if rc.Flush() != nil || r.Context().Err() != nil {
				return
			}
		}
	}), envOptions{proxy: proxy.Options{StallTimeout: stall}})
	ctx := context.Background()
	held := func(user string) int {
		t.Helper()
		slots, err := e.Stack.Limiter.Slots(ctx, user)
		if err != nil {
			t.Fatal(err)
		}
		return slots.Used
	}

	t.Run("stalled", func(t *testing.T) {
		user := newUser()
		d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
			return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		}}
		conn, err := d.Dial("tcp", strings.TrimPrefix(e.proxy.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-User-Id: %s\r\nX-Plan: one\r\n\r\n", user)
		if line, err := bufio.NewReaderSize(conn, 16).ReadString('\n'); err != nil || !strings.Contains(line, "200") {
			t.Fatalf("the status line: %q, %v; want 200", line, err)
		}
		if n := held(user); n != 1 {
			t.Fatalf("the streaming client holds %d slots, want 1", n)
		}
		// The client reads nothing more.
		deadline := time.Now().Add(10 * time.Second)
		for held(user) != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("a client that read nothing for 10s still holds its slot; want it released after the stall timeout (%s)", stall)
			}
			time.Sleep(20 * time.Millisecond)
		}
		select {
		case <-upstreamDone:
		case <-time.After(5 * time.Second):
			t.Error("the upstream's request did not end once the stream was cut")
		}
		// Counted apart from clients that went away.
		waitMetric(t, e, `limiter_streams_held_total{end="stalled",mode="proxy"}`, "1")
		if got := e.Metric(t, `limiter_streams_held_total{end="client_gone",mode="proxy"}`); got != "" && got != "0" {
			t.Errorf("the stalled stream counted as client_gone too: %s", got)
		}
	})

	t.Run("quiet", func(t *testing.T) {
		user := newUser()
		resp := e.do(t, e.request(t, ctx, http.MethodGet, "/v1/chat/completions?quiet", user, "one", nil))
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(body) != "data: first\n\ndata: last\n\n" {
			t.Fatalf("a stream quiet for %s: %q, %v; want both chunks, whole", 2*stall, body, err)
		}
		<-upstreamDone
		if n := held(user); n != 0 {
			t.Errorf("after the stream's end the user holds %d slots, want 0", n)
		}
	})
}
