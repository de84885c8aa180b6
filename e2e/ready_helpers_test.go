package e2e

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
)

// launched is a `limiter serve` started without waiting for anything, so
// that a test can watch its readiness from the first instant.
type launched struct {
	api, ops string // base URLs
	started  time.Time
	output   *testenv.Buffer
	cmd      *exec.Cmd
	done     chan struct{}
}

// launch starts `limiter serve` with config and returns at once; the
// process is killed at the test's cleanup. (servetest.Start returns only
// once /healthz answers, when readiness may already have turned.)
func launch(t *testing.T, config string) *launched {
	t.Helper()
	bin := servetest.Binary(t)
	cfg := filepath.Join(t.TempDir(), "limiter.yaml")
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	api, ops, admin := testenv.FreeAddr(t), testenv.FreeAddr(t), testenv.FreeAddr(t)
	p := &launched{api: "http://" + api, ops: "http://" + ops, output: &testenv.Buffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, "serve", "--config", cfg, "--http-addr", api, "--ops-addr", ops, "--admin-addr", admin)
	p.cmd.Stdout, p.cmd.Stderr = p.output, p.output
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting limiter serve: %v", err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
		if t.Failed() {
			t.Logf("limiter serve output:\n%s", p.output.String())
		}
	})
	return p
}

// awaitReady polls path on the ops listener every millisecond until it
// answers 200, and returns when it did; it fails the test after within or
// if the process exits.
func (p *launched) awaitReady(t *testing.T, path string, within time.Duration) time.Time {
	t.Helper()
	// One connection, kept alive, once the listener is up: the poll costs
	// no handshake, so the 200 is seen within about a millisecond.
	hc := &http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(within); ; time.Sleep(time.Millisecond) {
		select {
		case <-p.done:
			t.Fatalf("limiter serve exited before %s answered 200\n%s", path, p.output.String())
		default:
		}
		if resp, err := hc.Get(p.ops + path); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Now()
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not 200 within %v\n%s", path, within, p.output.String())
		}
	}
}
