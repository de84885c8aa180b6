package testenv

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// SlowClient is an HTTP/1.1 client that sends its request slowly, as a
// slowloris attacker does: Fast at once, then Slow one byte every Every.
type SlowClient struct {
	// Fast is sent at once: "" to send the whole request slowly, or the
	// request line and headers to send only the body slowly.
	Fast string
	// Slow is sent one byte at a time; make it long enough to outlast the
	// server's timeout.
	Slow string
	// Every is the pause before each byte of Slow.
	Every time.Duration
}

// SlowHeaders is a SlowClient whose header lines never end.
func SlowHeaders(path string, every time.Duration) SlowClient {
	return SlowClient{Fast: "POST " + path + " HTTP/1.1\r\nHost: limiter\r\n", Slow: "X-Slow: " + strings.Repeat("a", 1<<16), Every: every}
}

// SlowBody is a SlowClient whose complete headers announce a JSON body it
// then sends one byte every every.
func SlowBody(path string, every time.Duration) SlowClient {
	body := strings.Repeat(" ", 1<<12) // JSON whitespace, never the object
	return SlowClient{
		Fast:  fmt.Sprintf("POST %s HTTP/1.1\r\nHost: limiter\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, len(body)),
		Slow:  body,
		Every: every,
	}
}

// HeldOpen connects to addr, sends the request, and returns how long the
// server kept the connection open before closing it: until a read sees EOF
// or a reset. It gives up after limit and returns ok false: the server
// never cut the client.
func (c SlowClient) HeldOpen(t testing.TB, addr string, limit time.Duration) (held time.Duration, ok bool) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("slow client: %v", err)
	}
	defer conn.Close()
	start := time.Now()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		if _, err := io.WriteString(conn, c.Fast); err != nil {
			return
		}
		for i := range len(c.Slow) {
			select {
			case <-stop:
				return
			case <-time.After(c.Every):
			}
			if _, err := conn.Write([]byte{c.Slow[i]}); err != nil {
				return // the server closed the connection
			}
		}
	}()
	if err := conn.SetReadDeadline(start.Add(limit)); err != nil {
		t.Fatal(err)
	}
	// Whatever the server answers (nothing, or an error status) is read
	// and dropped: only the end of the connection counts.
	_, err = io.Copy(io.Discard, conn)
	held = time.Since(start)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return held, false
	}
	return held, true
}
