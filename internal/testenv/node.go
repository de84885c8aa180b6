package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// envNodeModules is the node_modules directory hack/test.sh installs
// e2e/openai/package-lock.json into.
const envNodeModules = "LIMITER_TEST_NODE_MODULES"

// NodeModules returns the node executable and the node_modules directory
// holding the e2e Node packages (LIMITER_TEST_NODE_MODULES), after checking
// that pkg is installed there. Missing: fatal if Required, else skip.
func NodeModules(t testing.TB, pkg string) (node, modules string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		missing(t, "node is not installed", "installs it with npm's packages")
	}
	modules = strings.TrimSpace(os.Getenv(envNodeModules))
	if modules == "" {
		missing(t, envNodeModules+" is not set", "installs e2e/openai's packages (npm ci)")
	}
	if _, err := os.Stat(filepath.Join(modules, pkg, "package.json")); err != nil {
		missing(t, pkg+" is not installed in "+modules, "installs e2e/openai's packages (npm ci)")
	}
	return node, modules
}
