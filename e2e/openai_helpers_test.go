package e2e

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
)

// nodeScript is a script of e2e/openai run on the official OpenAI Node
// SDK: copied into a directory of its own beside a link to the installed
// node_modules (an ES module resolves its imports from the node_modules
// beside it; NODE_PATH does not apply).
type nodeScript struct {
	node, dir, name string
}

func newNodeScript(t *testing.T, name string) *nodeScript {
	t.Helper()
	node, modules := testenv.NodeModules(t, "openai")
	dir := t.TempDir()
	script, err := os.ReadFile(filepath.Join("openai", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), script, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(modules, filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	return &nodeScript{node: node, dir: dir, name: name}
}

// runScript starts s against the proxy at base, with env added to the
// environment, and returns the JSON lines it prints, decoded as E, as
// they come; the process is killed at cleanup, and its stderr shown when
// the test failed.
func runScript[E any](t *testing.T, s *nodeScript, base string, env ...string) <-chan E {
	t.Helper()
	cmd := exec.Command(s.node, s.name)
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), append([]string{"BASE_URL=" + base + "/v1"}, env...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	events := make(chan E, 64)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var ev E
			if err := json.Unmarshal(sc.Bytes(), &ev); err == nil {
				events <- ev
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("node %s %v stderr:\n%s", s.name, env, stderr.String())
		}
	})
	return events
}

// nextEvent returns the next event, failing the test when none comes
// within d.
func nextEvent[E any](t *testing.T, events <-chan E, d time.Duration, what string) E {
	t.Helper()
	select {
	case ev, ok := <-events:
		if !ok {
			t.Fatalf("the SDK process ended before %s", what)
		}
		return ev
	case <-time.After(d):
		t.Fatalf("no event from the SDK within %v: %s", d, what)
	}
	var zero E
	return zero
}
