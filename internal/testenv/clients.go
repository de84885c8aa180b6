package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// envTypeScriptModules is the node_modules directory hack/test.sh installs
// clients/typescript/package-lock.json (the TypeScript compiler and Node's
// type definitions) into.
const envTypeScriptModules = "LIMITER_TEST_TS_NODE_MODULES"

// Python returns the python3 executable the Python client is tested with,
// after checking it is Python 3.9 or later. Missing: fatal if Required,
// else skip.
func Python(t testing.TB) string {
	t.Helper()
	python, err := exec.LookPath("python3")
	if err != nil {
		missing(t, "python3 is not installed", "installs it")
		return ""
	}
	out, err := exec.Command(python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])").Output()
	if err != nil {
		t.Fatalf("%s: %v", python, err)
	}
	if major, minor, ok := version(strings.TrimSpace(string(out))); !ok || major < 3 || (major == 3 && minor < 9) {
		t.Fatalf("%s is Python %s; the Python client needs 3.9 or later", python, strings.TrimSpace(string(out)))
	}
	return python
}

// Node returns the node executable, after checking it is Node.js
// minMajor or later. Missing: fatal if Required, else skip.
func Node(t testing.TB, minMajor int) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		missing(t, "node is not installed", "installs it")
		return ""
	}
	out, err := exec.Command(node, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", node, err)
	}
	v := strings.TrimPrefix(strings.TrimSpace(string(out)), "v")
	if major, _, ok := version(v); !ok || major < minMajor {
		t.Fatalf("%s is Node.js %s; want %d or later", node, v, minMajor)
	}
	return node
}

// TypeScriptModules returns LIMITER_TEST_TS_NODE_MODULES, after checking
// that the TypeScript compiler is installed there. Missing: fatal if
// Required, else skip.
func TypeScriptModules(t testing.TB) string {
	t.Helper()
	modules := strings.TrimSpace(os.Getenv(envTypeScriptModules))
	const provides = "installs clients/typescript's packages (npm ci)"
	if modules == "" {
		missing(t, envTypeScriptModules+" is not set", provides)
		return ""
	}
	if _, err := os.Stat(filepath.Join(modules, "typescript", "bin", "tsc")); err != nil {
		missing(t, fmt.Sprintf("typescript is not installed in %s", modules), provides)
	}
	return modules
}

// version parses "MAJOR.MINOR[.PATCH]".
func version(v string) (major, minor int, ok bool) {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	return major, minor, err1 == nil && err2 == nil
}
