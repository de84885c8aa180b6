package testenv

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Private servers take ports below Linux's ephemeral range (32768 and up), so
// an outgoing connection cannot occupy a stopped server's port before Start.
const (
	portMin  = 20000
	portSpan = 10000

	bootTimeout = 10 * time.Second // for redis-server to answer PING
	stopTimeout = 10 * time.Second // for SHUTDOWN, then again for SIGTERM
)

// Server is a private standalone redis-server that a test may stop, kill and
// restart on the same port. Its methods are safe for concurrent use; Start
// reports failure through the test, so call it from the test's goroutine.
type Server struct {
	t    testing.TB
	bin  string
	args []string // without --port
	dir  string
	port int

	mu     sync.Mutex
	cmd    *exec.Cmd     // nil before the first start
	exited chan struct{} // closed once cmd has exited
}

// StartRedis starts a private standalone redis-server on a free port, with its
// data in a temporary directory; t.Cleanup stops it. It persists nothing.
// An absent redis-server binary is fatal if Required, else the test is skipped.
func StartRedis(t testing.TB) *Server {
	t.Helper()
	bin := redisBinary(t, "redis-server")
	s := &Server{t: t, bin: bin, dir: t.TempDir()}
	s.args = serverArgs(bin, s.dir)
	t.Cleanup(s.Kill) // registered after TempDir, so it runs before the removal

	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	for attempt := 0; attempt < 20; attempt++ {
		if s.port, err = freePortInRange(); err != nil {
			break
		}
		if err = s.launch(); err == nil {
			return s
		}
		// Most likely another process bound the port first: try another one.
	}
	t.Fatalf("start redis-server: %v", err)
	return nil
}

func serverArgs(bin, dir string) []string {
	args := []string{
		"--bind", "127.0.0.1",
		"--daemonize", "no",
		"--dir", dir,
		"--logfile", filepath.Join(dir, "redis.log"),
		"--save", "",
		"--appendonly", "no",
		"--maxmemory-policy", "noeviction",
	}
	if redisMajorVersion(bin) >= 7 {
		args = append(args, "--enable-debug-command", "yes")
	}
	return args
}

// redisMajorVersion parses "Redis server v=7.0.15 sha=..."; 0 if it cannot.
func redisMajorVersion(bin string) int {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return 0
	}
	_, version, ok := strings.Cut(string(out), " v=")
	if !ok {
		return 0
	}
	major, _, _ := strings.Cut(version, ".")
	n, _ := strconv.Atoi(major)
	return n
}

func freePortInRange() (int, error) {
	for i := 0; i < 100; i++ {
		port := portMin + rand.IntN(portSpan)
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		ln.Close()
		return port, nil
	}
	return 0, fmt.Errorf("no free port in %d-%d", portMin, portMin+portSpan-1)
}

// Addr returns the server's "127.0.0.1:PORT"; it stays the same across restarts.
func (s *Server) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// Start (re)starts the server on the same port, retrying for a few seconds if
// the port is still held. It does nothing if the server runs, and fails the
// test if it cannot start.
func (s *Server) Start() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running() {
		return
	}
	deadline := time.Now().Add(bootTimeout)
	for {
		err := s.launch()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("restart redis-server on %s: %v", s.Addr(), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop shuts the server down gracefully (SHUTDOWN NOSAVE, then SIGTERM, then
// SIGKILL as a last resort) and waits until its port is closed. It does
// nothing if the server is not running.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running() {
		return
	}
	// On success the server closes the connection without a reply.
	_, _ = do(s.Addr(), time.Second, "SHUTDOWN", "NOSAVE")
	if !s.waitExit(stopTimeout) {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		if !s.waitExit(stopTimeout) {
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	}
	s.waitPortClosed()
}

// Kill kills the server with SIGKILL, as a crash would, and waits until its
// port is closed. It does nothing if the server is not running.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running() {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.waitPortClosed()
}

// running reports whether the server process is alive; s.mu must be held.
func (s *Server) running() bool {
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

func (s *Server) waitExit(timeout time.Duration) bool {
	select {
	case <-s.exited:
		return true
	case <-time.After(timeout):
		return false
	}
}

func (s *Server) waitPortClosed() {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		conn, err := net.DialTimeout("tcp", s.Addr(), 100*time.Millisecond)
		if err != nil {
			return
		}
		conn.Close()
		time.Sleep(20 * time.Millisecond)
	}
}

// launch starts redis-server on s.port and waits until it answers as itself
// (a PING answered by another process on the port does not count); s.mu must
// be held.
func (s *Server) launch() error {
	cmd := exec.Command(s.bin, append([]string{"--port", strconv.Itoa(s.port)}, s.args...)...)
	cmd.Dir = s.dir
	setProcAttr(cmd)
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()

	pid := strconv.Itoa(cmd.Process.Pid)
	deadline := time.Now().Add(bootTimeout)
	for {
		select {
		case <-exited:
			return fmt.Errorf("redis-server exited on port %d: %s", s.port, s.logTail())
		default:
		}
		if reply, err := do(s.Addr(), 500*time.Millisecond, "INFO", "server"); err == nil {
			if info, ok := reply.(string); ok && infoField(info, "process_id") == pid {
				s.cmd, s.exited = cmd, exited
				return nil
			}
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return errors.New("redis-server did not answer within " + bootTimeout.String() + ": " + s.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logTail returns the last lines of the server's log, for error messages.
func (s *Server) logTail() string {
	data, err := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	if err != nil {
		return "(no log)"
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, "\n")
}
