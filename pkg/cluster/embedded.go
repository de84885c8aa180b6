package cluster

import (
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
)

// embeddedStore is an in-process Redis-compatible server. It runs the same
// Lua scripts as Redis, but it holds one process's state only: two replicas
// on embedded stores enforce two separate limits.
//
// It has no listener: each connection is one end of a net.Pipe whose other
// end the store serves (see dial), so only the client handed those
// connections reaches it. A port, even on loopback and behind a password,
// is open to every process in the pod's network namespace, and one that
// wrote to the store could free or take slots past api.tokensFile.
type embeddedStore struct {
	server *miniredis.Miniredis
	conns  *server.Server // serves the connections dial makes
	logger *slog.Logger
	stop   chan struct{}
	done   chan struct{}
	// watch drops miniredis's versions of deleted keys (see
	// watchVersions); empty when miniredis no longer has them.
	watch watchVersions
	// answers are the release_all answers the last sweep found; the next
	// one drops them (the sweep goroutine's alone).
	answers map[string]bool
}

// sweepEvery is how often the embedded store drops abandoned slot keys
// and queues.
// miniredis never expires keys by itself (its TTLs only move with
// FastForward, which would shorten keys set since the last call), so the
// store sweeps instead: a sorted set whose newest slot expired more than
// sweepAfter ago is deleted. Slot expiry never depends on this (scripts
// compare scores with TIME); the sweep only bounds memory, and it is later
// than Redis's own key expiry, so pruned slots are still counted first.
// (Slots expired that long are removed one by one, with their records, by
// a script, so that no acquire comes between; an emptied key goes.) A
// wait queue whose latest ticket expired more than sweepAfter ago (its
// waiters' servers stopped refreshing them) goes with its tickets'
// expiries and records, by a script too, so that a ticket queued
// meanwhile stays: on Redis its keys expire two ticket TTLs past the
// latest ticket. The answers release_all keeps for a minute go at the
// sweep after the one that first found them, and a support override at
// the first sweep after its expiry (the scripts stop applying it at the
// expiry itself). Each sweep also drops miniredis's WATCH versions of the
// keys deleted since the last (see watchVersions).
const (
	sweepEvery = time.Minute
	sweepAfter = 24 * time.Hour
)

// embeddedAddr is what the client names the embedded store by, in its
// logs and spans: the store has no network address.
const embeddedAddr = "in-process"

func startEmbedded(logger *slog.Logger) (*embeddedStore, error) {
	store := miniredis.NewMiniRedis()
	// miniredis starts a store without a listener at its first Dial; that
	// connection is not needed.
	conn, err := store.Dial()
	if err != nil {
		return nil, fmt.Errorf("starting the embedded store: %w", err)
	}
	conn.Close()
	s := &embeddedStore{server: store, conns: store.Server(), logger: logger, stop: make(chan struct{}), done: make(chan struct{})}
	var found bool
	if s.watch, found = findWatchVersions(store.DB(0)); !found {
		logger.Warn("the embedded store cannot drop the WATCH versions of deleted keys (miniredis changed): its memory grows with every user id it sees until restart")
	}
	go s.sweepLoop()
	return s, nil
}

// dial returns a new connection to the store, served until either end
// closes. (miniredis's own Dial serves a bare net.Pipe: see replyBuffer.)
func (s *embeddedStore) dial() (net.Conn, error) {
	select {
	case <-s.stop:
		return nil, net.ErrClosed
	default:
	}
	client, store := net.Pipe()
	s.conns.ServeConn(newReplyBuffer(store))
	return client, nil
}

func (s *embeddedStore) sweepLoop() {
	defer close(s.done)
	ticker := time.NewTicker(sweepEvery)
	defer ticker.Stop()
	for {
		select {
		case <-s.stop:
			return
		case now := <-ticker.C:
			s.sweep(now)
		}
	}
}

func (s *embeddedStore) close() {
	close(s.stop)
	<-s.done
	s.server.Close()
}
