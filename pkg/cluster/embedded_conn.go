package cluster

import (
	"net"
	"sync"
)

// replyBuffer is the embedded store's end of a connection: it keeps the
// store's replies and writes them to the connection from a goroutine of
// its own, so the store never waits for its client to read. Redis does
// the same (a client's replies wait in its output buffer), and the client
// depends on it: rueidis writes a whole pipeline before it reads the
// first reply, and a net.Pipe holds no byte, so a store that waited to
// write a reply would stop reading the pipeline, and both would wait for
// ever.
type replyBuffer struct {
	net.Conn
	mu      sync.Mutex
	pending []byte // replies not yet handed to Conn
	err     error  // why the writer stopped; Write fails with it
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
}

func newReplyBuffer(conn net.Conn) *replyBuffer {
	b := &replyBuffer{Conn: conn, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go b.writeLoop()
	return b
}

// Write queues p and returns at once.
func (b *replyBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	if b.err != nil {
		b.mu.Unlock()
		return 0, b.err
	}
	b.pending = append(b.pending, p...)
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default: // a wake-up is already due
	}
	return len(p), nil
}

// writeLoop hands the queued replies to Conn until Close, or until Conn
// fails.
func (b *replyBuffer) writeLoop() {
	defer close(b.done)
	var out []byte
	for {
		select {
		case <-b.stop:
			return
		case <-b.wake:
		}
		b.mu.Lock()
		out, b.pending = b.pending, out[:0]
		b.mu.Unlock()
		if _, err := b.Conn.Write(out); err != nil {
			b.mu.Lock()
			b.err = err
			b.mu.Unlock()
			return
		}
	}
}

// Close closes Conn, which ends a write in progress, and waits for the
// writer to stop. Replies still queued are dropped, as a closed socket
// drops them.
func (b *replyBuffer) Close() error {
	err := b.Conn.Close()
	b.once.Do(func() { close(b.stop) })
	<-b.done
	return err
}
