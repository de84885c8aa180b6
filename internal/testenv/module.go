package testenv

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// moduleDownloadTimeout bounds fetching a module from the module proxy.
const moduleDownloadTimeout = 5 * time.Minute

// ModuleDir returns the directory of module path at version in the Go
// module cache, downloading it (with `go mod download`, outside any
// module, so go.mod is untouched) if it is not there: for the files a
// module ships beside its Go code, such as CRD YAML. When it cannot be
// had: fatal if Required, else skip.
func ModuleDir(t testing.TB, path, version string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		missing(t, "the go command is not on PATH", "runs with it")
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), moduleDownloadTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "mod", "download", "-json", path+"@"+version)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	out, err := cmd.Output()
	var mod struct{ Dir, Error string }
	_ = json.Unmarshal(out, &mod)
	if err != nil || mod.Dir == "" {
		reason := strings.TrimSpace(mod.Error)
		if reason == "" && err != nil {
			reason = err.Error()
		}
		missing(t, "go mod download "+path+"@"+version+": "+reason, "fetches it from the Go module proxy")
		return ""
	}
	return mod.Dir
}
