package testenv

import (
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
)

// BlackHole returns the address of a TCP listener that accepts connections and
// never answers: it never reads and never closes them until the test's cleanup.
// Clients talking to it see their reads time out, as with a hung server.
func BlackHole(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("black hole: %v", err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		done  = make(chan struct{})
	)
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return // listener closed by cleanup
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, conn := range conns {
			conn.Close()
		}
	})
	return ln.Addr().String()
}

// FreeAddr returns "127.0.0.1:PORT" of a currently free port. Nothing holds
// the port afterwards, so another process may take it before the caller
// does. Ports come from 10000-19999: below the kernel's ephemeral range
// (32768 and up here), which a port-0 listener would draw from and which
// every outgoing connection of a parallel test also draws from, and apart
// from the 20000-39999 the Redis servers use.
func FreeAddr(t testing.TB) string {
	t.Helper()
	for range 100 {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(freeAddrMin+rand.IntN(freeAddrSpan)))
		if !handOut(addr) {
			continue // given to another caller of this process, who may not listen yet
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		if err := ln.Close(); err != nil {
			t.Fatalf("free address: %v", err)
		}
		return addr
	}
	t.Fatalf("free address: no free port in %d-%d", freeAddrMin, freeAddrMin+freeAddrSpan-1)
	return ""
}

const (
	freeAddrMin  = 10000
	freeAddrSpan = 10000
)

// handedOut are the addresses FreeAddr returned in this process: a server
// given two of them (its API and ops listeners) must not get one twice,
// which random picks alone do about once in 10,000 pairs.
var handedOut = struct {
	sync.Mutex
	addrs map[string]bool
}{addrs: map[string]bool{}}

// handOut records addr as handed out; false when it was before.
func handOut(addr string) bool {
	handedOut.Lock()
	defer handedOut.Unlock()
	if handedOut.addrs[addr] {
		return false
	}
	handedOut.addrs[addr] = true
	return true
}
