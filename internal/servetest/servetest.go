// Package servetest builds the limiter binary and runs `limiter serve`
// processes for end-to-end tests: real processes, real listeners, killed
// with real signals.
package servetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error

	faultOnce sync.Once
	faultPath string
	faultErr  error
)

// Binary builds ./cmd/limiter once per test binary and returns its path.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "limiter-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "limiter")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/limiter")
		cmd.Dir = repoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/limiter: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// FaultBinary builds ./cmd/limiter with the faultpoints tag once per test
// binary and returns its path: a serve process of it stops for good at the
// fault point its LIMITER_FAULT_POINT names (see pkg/limiter's atFault),
// for a crash test to SIGKILL it there. Start runs it with
// Options.FaultPoint.
func FaultBinary(t testing.TB) string {
	t.Helper()
	faultOnce.Do(func() {
		dir, err := os.MkdirTemp("", "limiter-fault-bin-")
		if err != nil {
			faultErr = err
			return
		}
		faultPath = filepath.Join(dir, "limiter")
		cmd := exec.Command("go", "build", "-tags", "faultpoints", "-o", faultPath, "./cmd/limiter")
		cmd.Dir = repoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			faultErr = fmt.Errorf("go build -tags faultpoints ./cmd/limiter: %v\n%s", err, out)
		}
	})
	if faultErr != nil {
		t.Fatal(faultErr)
	}
	return faultPath
}

// RemoveBinaries removes what Binary and FaultBinary built: a TestMain
// calls it once its tests have run. (Under make test they are built in
// its temporary folder, removed anyway; run bare, each run would leave
// about 90 MB behind in the system's.)
func RemoveBinaries() {
	for _, path := range []string{binPath, faultPath} {
		if path != "" {
			_ = os.RemoveAll(filepath.Dir(path))
		}
	}
}

func repoRoot() string {
	dir, _ := os.Getwd()
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "."
		}
		dir = parent
	}
}

// Options describe one serve (or proxy) process.
type Options struct {
	// Command is "serve" (the default) or "proxy". A proxy listens on
	// --listen, and Process.API is its URL.
	Command string
	// Config is the YAML config file's content. The listen addresses
	// (API, ops and, for serve, admin) are given as flags and need not be
	// in it.
	Config string
	// Env is added to the process environment.
	Env []string
	// Args are extra flags after `serve`.
	Args []string
	// NoWaitReady returns once /healthz answers instead of /readyz.
	NoWaitReady bool
	// AwaitRedis also waits until serve has connected to Redis. Readiness
	// does not wait for Redis, by design, so without it a test's first
	// acquires may be granted degraded and not counted. Default false.
	AwaitRedis bool
	// ExtProc serves the ext_proc server too, on a free port given as
	// --extproc-addr (Process.ExtProc). Default false.
	ExtProc bool
	// FaultPoint, when set, runs the FaultBinary with LIMITER_FAULT_POINT
	// set to it: the process stops for good there. Default "": the
	// release build.
	FaultPoint string
}

// redisConnected is the end of serve's log message once it reaches Redis,
// with the closing quote of both the JSON and the text format.
const redisConnected = `connected to redis"`

// Process is a running `limiter serve`.
type Process struct {
	API   string // base URL of the API listener, http://127.0.0.1:PORT
	Ops   string // base URL of the ops listener
	Admin string // base URL of the admin listener (listening with admin.tokensFile)
	// ExtProc is the ext_proc server's host:port (with Options.ExtProc).
	ExtProc string

	t      testing.TB
	cmd    *exec.Cmd
	output *testenv.Buffer
	done   chan struct{}
	err    error
}

// Start runs `limiter serve` (or proxy) and waits until it is ready (or healthy with
// NoWaitReady, and connected to Redis with AwaitRedis). The process is
// killed at the test's cleanup.
func Start(t testing.TB, opts Options) *Process {
	t.Helper()
	bin := Binary(t)
	if opts.FaultPoint != "" {
		bin = FaultBinary(t)
		opts.Env = append(opts.Env, "LIMITER_FAULT_POINT="+opts.FaultPoint)
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "limiter.yaml")
	if err := os.WriteFile(cfg, []byte(opts.Config), 0o600); err != nil {
		t.Fatal(err)
	}
	api, ops, admin := testenv.FreeAddr(t), testenv.FreeAddr(t), testenv.FreeAddr(t)
	args := []string{"serve", "--config", cfg, "--http-addr", api, "--ops-addr", ops, "--admin-addr", admin}
	if opts.Command == "proxy" {
		args, admin = []string{"proxy", "--config", cfg, "--listen", api, "--ops-addr", ops}, ""
	}
	p := &Process{API: "http://" + api, Ops: "http://" + ops, t: t, output: &testenv.Buffer{}, done: make(chan struct{})}
	if admin != "" {
		p.Admin = "http://" + admin
	}
	if opts.ExtProc {
		p.ExtProc = testenv.FreeAddr(t)
		args = append(args, "--extproc-addr", p.ExtProc)
	}
	args = append(args, opts.Args...)
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), opts.Env...)
	p.cmd.Stdout, p.cmd.Stderr = p.output, p.output
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting limiter serve: %v", err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("limiter serve %s output:\n%s", api, p.Output())
		}
	})
	path := "/readyz"
	if opts.NoWaitReady {
		path = "/healthz"
	}
	p.await(path, 20*time.Second)
	if opts.AwaitRedis {
		p.AwaitLog(redisConnected, 20*time.Second)
	}
	return p
}

// AwaitLog waits up to within until the process's output contains substr,
// and fails the test if it does not or if the process exits first.
func (p *Process) AwaitLog(substr string, within time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(within)
	for !strings.Contains(p.Output(), substr) {
		select {
		case <-p.done:
			p.t.Fatalf("limiter serve exited before logging %q: %v\n%s", substr, p.err, p.Output())
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("limiter serve: %q not logged within %v\n%s", substr, within, p.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *Process) await(path string, within time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(within)
	for {
		select {
		case <-p.done:
			p.t.Fatalf("limiter serve exited before %s answered: %v\n%s", path, p.err, p.Output())
		default:
		}
		if status, _ := Get(p.Ops + path); status == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("limiter serve: %s not OK within %v\n%s", path, within, p.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill sends SIGKILL and waits for the process to die.
func (p *Process) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Signal sends sig to the process.
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Wait waits up to within for the process to exit and returns its exit code.
func (p *Process) Wait(within time.Duration) (int, error) {
	select {
	case <-p.done:
	case <-time.After(within):
		return -1, fmt.Errorf("process still running after %v", within)
	}
	var exit *exec.ExitError
	if errors.As(p.err, &exit) {
		return exit.ExitCode(), nil
	}
	return 0, p.err
}

// Output is what the process has written to stdout and stderr so far.
func (p *Process) Output() string { return p.output.String() }

// Get fetches url and returns the status and body; status 0 on a transport
// error.
func Get(url string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	return resp.StatusCode, buf.String()
}
