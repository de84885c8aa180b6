// Package proxytest sends and reads what a test of the proxy (pkg/proxy's
// own, and e2e's of `limiter proxy`) sends and reads over HTTP: requests
// written byte for byte, and the data lines of an SSE stream.
package proxytest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// RawRequest sends method target to the server at addr (host:port)
// exactly as written, over a new connection (Go's client would clean or
// re-escape some spellings), with header and body as a JSON body. The
// connection is closed on t's cleanup, at the latest 15s on; the caller
// closes the answer's body.
func RawRequest(t testing.TB, addr, method, target string, header http.Header, body string) *http.Response {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", method, target, addr, len(body))
	for name, values := range header {
		for _, v := range values {
			fmt.Fprintf(&b, "%s: %s\r\n", name, v)
		}
	}
	b.WriteString("\r\n" + body)
	if _, err := io.WriteString(conn, b.String()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	return resp
}

// SSEData returns the data lines of an SSE body as they arrive, and closes
// the channel when the body ends, cleanly or not: failure then holds the
// read's error, if any.
func SSEData(body io.Reader) (data <-chan string, failure *atomic.Value) {
	out := make(chan string, 64)
	failure = new(atomic.Value)
	go func() {
		defer close(out)
		sc := bufio.NewScanner(body)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				out <- line
			}
		}
		if err := sc.Err(); err != nil {
			failure.Store(err)
		}
	}()
	return out, failure
}
