package testenv

import (
	"testing"
	"time"
)

// SetPassword makes the server's default user require password ("" for
// none), as rotating the Secret a deployment mounts does, and drops every
// other client connection, as a restart or a failover would: each client
// then authenticates anew. current is the password required until now (""
// for none).
func (s *Server) SetPassword(t testing.TB, current, password string) {
	t.Helper()
	var commands [][]string
	if current != "" {
		commands = append(commands, []string{"AUTH", current})
	}
	commands = append(commands,
		[]string{"CONFIG", "SET", "requirepass", password},
		[]string{"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"})
	if _, err := doAll(s.Addr(), 2*time.Second, commands...); err != nil {
		t.Fatalf("setting the password of redis-server %s: %v", s.Addr(), err)
	}
}
