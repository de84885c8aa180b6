// Package e2e tests the limiter as it runs in production: `limiter serve`
// processes on real Redis, driven over HTTP, killed with real signals.
package e2e

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/pkg/client"
	"github.com/redis/rueidis"
)

// The test binary doubles as the application processes the incident kills:
// started with E2E_CHILD set, it runs that role instead of the tests.
func TestMain(m *testing.M) {
	if role := os.Getenv("E2E_CHILD"); role != "" {
		if err := runChild(role); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	flag.Parse()
	setParallel(2)
	code := m.Run()
	servetest.RemoveBinaries()
	os.Exit(code)
}

// setParallel runs up to n tests of this package at once unless the
// command line says how many (-parallel). Its parallel tests mostly wait:
// on slot TTLs, a compressed clock, a browser, node and Python suites,
// envtest's API servers. Tests that time calls or count a shared Redis's
// commands stay sequential: they run before the parallel ones start.
func setParallel(n int) {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(n))
	}
}

// planOf gives the incident's users alternating plans: even users free (1
// stream), odd users paid (3 streams).
func planOf(i int) (string, int) {
	if i%2 == 0 {
		return "free", 1
	}
	return "paid", 3
}

func runChild(role string) error {
	users := envInt("E2E_USERS")
	prefix := os.Getenv("E2E_USER_PREFIX")
	ctx := context.Background()
	streams := 0
	switch role {
	case "holders":
		return runHolders(ctx)
	case "drill":
		return runDrillApp(ctx)
	case "leases":
		// Streams of one user go through different servers, as behind a
		// load balancer.
		var clients []*client.Client
		for _, url := range strings.Split(os.Getenv("E2E_SERVERS"), ",") {
			c, err := client.New(url)
			if err != nil {
				return err
			}
			clients = append(clients, c)
		}
		for i := range users {
			plan, limit := planOf(i)
			for k := range limit {
				c := clients[(i+k)%len(clients)]
				if _, err := c.Acquire(ctx, fmt.Sprintf("%s%d", prefix, i), plan); err != nil {
					return fmt.Errorf("acquire user %d stream %d: %w", i, k, err)
				}
				streams++
			}
		}
	case "counter":
		// The design this project replaces: INCR before a stream, DECR in a
		// finally that a SIGKILL never runs.
		rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: strings.Split(os.Getenv("E2E_REDIS"), ","), DisableCache: true})
		if err != nil {
			return err
		}
		for i := range users {
			_, limit := planOf(i)
			for range limit {
				if ok, err := counterAcquire(ctx, rc, fmt.Sprintf("%s%d", prefix, i), limit); err != nil || !ok {
					return fmt.Errorf("counter acquire user %d: %v, %v", i, ok, err)
				}
				streams++
			}
		}
	default:
		return fmt.Errorf("unknown role %q", role)
	}
	fmt.Printf("READY %d\n", streams)
	select {} // stream forever; heartbeats run in the background
}

// counterKey is the baseline's per-user counter.
func counterKey(user string) string { return "e2e:counter:{" + user + "}" }

// counterAcquire is the baseline limiter: INCR, and DECR back when over.
func counterAcquire(ctx context.Context, rc rueidis.Client, user string, limit int) (bool, error) {
	n, err := rc.Do(ctx, rc.B().Incr().Key(counterKey(user)).Build()).AsInt64()
	if err != nil {
		return false, err
	}
	if n > int64(limit) {
		return false, rc.Do(ctx, rc.B().Decr().Key(counterKey(user)).Build()).Error()
	}
	return true, nil
}

func envInt(name string) int {
	var n int
	fmt.Sscan(os.Getenv(name), &n)
	return n
}

// child is a running application process of the incident.
type child struct {
	cmd *exec.Cmd
	// lines receives what the child prints after READY (buffered; lines
	// beyond its capacity are dropped).
	lines chan string
}

// startChild runs this test binary in role and waits for it to report its
// streams open.
func startChild(t *testing.T, role string, env ...string) (*child, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), "E2E_CHILD="+role), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, lines: make(chan string, 1024)}
	t.Cleanup(c.kill)
	ready := make(chan int, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var n int
			if _, err := fmt.Sscanf(sc.Text(), "READY %d", &n); err == nil {
				ready <- n
				continue
			}
			select {
			case c.lines <- sc.Text():
			default:
			}
		}
		close(ready)
	}()
	select {
	case n, ok := <-ready:
		if !ok {
			_ = cmd.Wait()
			t.Fatalf("child %s exited before it was ready: %s", role, stderr.String())
		}
		return c, n
	case <-time.After(30 * time.Second):
		t.Fatalf("child %s not ready within 30s: %s", role, stderr.String())
	}
	return nil, 0
}

// kill SIGKILLs the child: no finally, no release, no DECR.
func (c *child) kill() {
	if c.cmd.ProcessState == nil {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
	}
}
