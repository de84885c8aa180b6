package apitest_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/joishi/limiter/internal/apitest"
	"github.com/joishi/limiter/internal/testenv"
)

// lintReport is what `redocly lint --format=json` prints.
type lintReport struct {
	Totals struct {
		Errors   int `json:"errors"`
		Warnings int `json:"warnings"`
		Ignored  int `json:"ignored"`
	} `json:"totals"`
	Problems []struct {
		RuleID   string `json:"ruleId"`
		Severity string `json:"severity"`
		Message  string `json:"message"`
		Location []struct {
			Pointer string `json:"pointer"`
		} `json:"location"`
	} `json:"problems"`
}

// The contract passes a real OpenAPI linter: Redocly CLI with the
// repository's redocly.yaml (the recommended rules, all errors) and its
// reasoned exceptions (.redocly.lint-ignore.yaml). Any problem fails.
func TestSpecPassesRedoclyLint(t *testing.T) {
	redocly := testenv.Redocly(t)
	root, err := apitest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(redocly, "lint", "--config", filepath.Join(root, "redocly.yaml"), "--format=json", apitest.SpecPath)
	cmd.Dir = root
	// No usage telemetry and no update check: the tests run offline.
	cmd.Env = append(os.Environ(), "REDOCLY_TELEMETRY=off", "REDOCLY_SUPPRESS_UPDATE_NOTICE=true")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()

	var report lintReport
	if err := json.Unmarshal(stdout.Bytes(), &report); err != nil {
		t.Fatalf("redocly lint (%v) printed no JSON report: %v\nstdout:\n%s\nstderr:\n%s", runErr, err, stdout.String(), stderr.String())
	}
	var problems []string
	for _, p := range report.Problems {
		where := ""
		if len(p.Location) > 0 {
			where = p.Location[0].Pointer
		}
		problems = append(problems, fmt.Sprintf("%s %s at %s: %s", p.Severity, p.RuleID, where, p.Message))
	}
	if report.Totals.Errors+report.Totals.Warnings > 0 || len(problems) > 0 {
		t.Errorf("redocly lint %s: got %d errors and %d warnings, want none:\n  %s",
			apitest.SpecPath, report.Totals.Errors, report.Totals.Warnings, strings.Join(problems, "\n  "))
	}
	if runErr != nil && !t.Failed() {
		t.Errorf("redocly lint reported no problem but failed: %v\n%s", runErr, stderr.String())
	}
}
