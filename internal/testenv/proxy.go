package testenv

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy forwards TCP connections to a target and can be switched into a
// black hole while running: connections stay open but no byte moves either
// way, as when a network path silently drops packets.
type Proxy struct {
	ln     net.Listener
	target string
	holed  atomic.Bool
	delay  atomic.Int64 // nanoseconds added before forwarding each read
	drops  atomic.Int64 // script calls left whose reply is dropped (DropReplies)
	losses atomic.Int64 // script calls left that are dropped on their way (DropCalls)
	passes atomic.Int64 // script calls left to relay before those (DropRepliesAfter)
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup

	accepted atomic.Int64 // connections accepted from clients
	scripts  atomic.Int64 // script calls written to the target (ScriptCalls)
}

// link is one proxied connection: the client's and the target's ends.
type link struct {
	client, server net.Conn
	// dropReply: a script call was forwarded whose reply must not be.
	dropReply atomic.Bool
}

// StartProxy listens on a free loopback port and forwards to target until
// the test's cleanup.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	p := &Proxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's listen address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// BlackHole stops all traffic through the proxy; connections stay open.
func (p *Proxy) BlackHole() { p.holed.Store(true) }

// SetLatency delays every chunk forwarded in either direction by d.
func (p *Proxy) SetLatency(d time.Duration) { p.delay.Store(int64(d)) }

// Accepted returns how many connections clients have opened through the
// proxy so far, black-holed ones included: a rise shows a client redialling.
func (p *Proxy) Accepted() int { return int(p.accepted.Load()) }

// ScriptCalls returns how many script calls (chunks holding EVAL or
// EVALSHA, as DropReplies counts them) the proxy has written to the target
// so far: once it rises, a call is Redis's to run, whatever its caller
// does next.
func (p *Proxy) ScriptCalls() int { return int(p.scripts.Load()) }

// DropReplies makes the next n script calls (a chunk from a client holding
// EVAL or EVALSHA, as Redis clients send them) reach the target, and then
// closes both ends of that connection instead of relaying the reply: the
// call ran, its answer is lost, and the client sees the connection drop.
// Other traffic (handshakes, PINGs) passes.
func (p *Proxy) DropReplies(n int) { p.DropRepliesAfter(0, n) }

// DropCalls makes the next n script calls (as DropReplies counts them)
// never reach the target: the proxy closes both ends of the connection
// instead of forwarding the chunk that holds one. The call did not run,
// and the client sees the connection drop, as it does when a reply is
// lost.
func (p *Proxy) DropCalls(n int) { p.losses.Store(int64(n)) }

// DropRepliesAfter is DropReplies for the n script calls that follow the
// next skip, whose replies are relayed.
func (p *Proxy) DropRepliesAfter(skip, n int) {
	p.drops.Store(0)
	p.passes.Store(int64(skip))
	p.drops.Store(int64(n))
}

// DropsLeft is how many of the script calls DropReplies named have not
// been made yet.
func (p *Proxy) DropsLeft() int { return int(p.drops.Load()) }

// Restore drops every connection (their data is lost, as after a network
// partition) and forwards new ones again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.holed.Store(false)
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.track(client)
		p.accepted.Add(1)
		if p.holed.Load() {
			continue // accepted, never answered
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		p.track(server)
		l := &link{client: client, server: server}
		p.wg.Add(2)
		go p.pipe(l, server, client)
		go p.pipe(l, client, server)
	}
}

func (p *Proxy) track(c net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
}

// pipe copies src to dst, one direction of l, until either closes. While
// the proxy is holed it swallows what it reads: nothing reaches the other
// side, nothing answers.
func (p *Proxy) pipe(l *link, dst, src net.Conn) {
	defer p.wg.Done()
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if d := time.Duration(p.delay.Load()); n > 0 && d > 0 {
			time.Sleep(d)
		}
		if n > 0 && src == l.server && l.dropReply.Load() {
			l.client.Close()
			l.server.Close()
			return
		}
		if n > 0 && src == l.client && p.takeLoss(buf[:n]) {
			l.client.Close()
			l.server.Close()
			return
		}
		if n > 0 && src == l.client && p.takeDrop(buf[:n]) {
			l.dropReply.Store(true)
		}
		if n > 0 && !p.holed.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			if src == l.client && bytes.Contains(buf[:n], []byte("EVAL")) {
				p.scripts.Add(1)
			}
		}
		if err != nil {
			return
		}
	}
}

// takeDrop reports whether chunk is a script call whose reply DropReplies
// asked to drop, and counts it.
func (p *Proxy) takeDrop(chunk []byte) bool {
	if !bytes.Contains(chunk, []byte("EVAL")) || p.drops.Load() <= 0 {
		return false
	}
	for {
		left := p.passes.Load()
		if left <= 0 {
			break
		}
		if p.passes.CompareAndSwap(left, left-1) {
			return false
		}
	}
	for {
		left := p.drops.Load()
		if left <= 0 {
			return false
		}
		if p.drops.CompareAndSwap(left, left-1) {
			return true
		}
	}
}

// takeLoss reports whether chunk is a script call DropCalls asked to
// drop on its way, and counts it.
func (p *Proxy) takeLoss(chunk []byte) bool {
	if !bytes.Contains(chunk, []byte("EVAL")) {
		return false
	}
	for {
		left := p.losses.Load()
		if left <= 0 {
			return false
		}
		if p.losses.CompareAndSwap(left, left-1) {
			return true
		}
	}
}

func (p *Proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
