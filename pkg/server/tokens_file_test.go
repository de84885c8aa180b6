package server

import (
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A tokens file rewritten to hold no token (truncated by `>`, an empty
// Secret key, a template that rendered nothing) revokes every caller: that
// is said at WARN, as a removed file and an empty file at start are, so an
// operator alerting on WARN hears that every call is now refused. A
// rewrite that keeps a token is an INFO line.
func TestATokensFileReloadedEmptyIsAWarning(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first string // the file at start: one token
		again string // the file after: another token
		load  func(path string, log *slog.Logger) (count func() int, reload func(), err error)
	}{
		{
			name:  "the admin tokens file",
			first: "alice viewer " + aliceToken + "\n",
			again: "bob operator " + bobToken + "\n",
			load: func(path string, log *slog.Logger) (func() int, func(), error) {
				f, err := loadAdminTokens(path, log)
				if err != nil {
					return nil, nil, err
				}
				return func() int { return f.current().len() }, f.reload, nil
			},
		},
		{
			name:  "the API tokens file",
			first: "carol " + carolToken + " free\n",
			again: "dave " + daveToken + " *\n",
			load: func(path string, log *slog.Logger) (func() int, func(), error) {
				c, err := LoadCallers(CallersOptions{TokensFile: path, Logger: log})
				if err != nil {
					return nil, nil, err
				}
				return c.Len, c.file.reload, nil
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "tokens")
			versions := 0
			write := func(content string) {
				t.Helper()
				versions++
				stamp := time.Now().Add(time.Duration(versions) * time.Second)
				if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.Chtimes(path, stamp, stamp); err != nil {
					t.Fatal(err)
				}
			}
			write(tc.first)
			var log strings.Builder
			count, reload, err := tc.load(path, slog.New(slog.NewJSONHandler(&log, nil)))
			if err != nil {
				t.Fatal(err)
			}
			if got := count(); got != 1 {
				t.Fatalf("tokens at start: got %d, want 1", got)
			}
			// settle reloads twice (a change is acted on once it has stayed
			// for one poll) and returns the log lines written meanwhile.
			settle := func() []map[string]any {
				t.Helper()
				log.Reset()
				reload()
				reload()
				var lines []map[string]any
				for _, l := range strings.Split(strings.TrimSpace(log.String()), "\n") {
					if l == "" {
						continue
					}
					var line map[string]any
					if err := json.Unmarshal([]byte(l), &line); err != nil {
						t.Fatalf("log line %q: %v", l, err)
					}
					lines = append(lines, line)
				}
				return lines
			}

			write("")
			lines := settle()
			if got := count(); got != 0 {
				t.Fatalf("tokens after the file was emptied: got %d, want 0", got)
			}
			if len(lines) != 1 {
				t.Fatalf("log after the file was emptied: got %d lines %v, want 1", len(lines), lines)
			}
			if lines[0]["level"] != "WARN" || !strings.Contains(lines[0]["msg"].(string), "every call it authenticates is refused") {
				t.Errorf("log after the file was emptied: got %v, want a WARN saying every call is refused", lines[0])
			}
			if lines[0]["file"] != path {
				t.Errorf("log after the file was emptied: got file %v, want %q", lines[0]["file"], path)
			}

			write(tc.again)
			lines = settle()
			if got := count(); got != 1 {
				t.Fatalf("tokens after one was added back: got %d, want 1", got)
			}
			if len(lines) != 1 || lines[0]["level"] != "INFO" || !strings.HasSuffix(lines[0]["msg"].(string), "tokens reloaded") {
				t.Errorf("log after a token was added back: got %v, want one INFO reload line", lines)
			}
		})
	}
}

// A tokens file saved with a UTF-8 byte order mark (Windows Notepad,
// PowerShell's Out-File) reads as the same file without it: the mark is
// not part of line 1's name, nor does it turn a comment into a data line.
// Only a mark that opens the file is skipped.
func TestATokensFileWithAByteOrderMarkReadsAsWithout(t *testing.T) {
	const bom = "\ufeff"
	discard := slog.New(slog.NewJSONHandler(io.Discard, nil))
	for _, tc := range []struct {
		name    string
		admin   bool // the admin tokens file, else the API one
		file    string
		want    int
		wantErr string
	}{
		{admin: true, name: "admin: before a token's line", file: bom + "alice viewer " + aliceToken + "\n", want: 1},
		{admin: true, name: "admin: before a comment", file: bom + "# support staff\nalice viewer " + aliceToken + "\n", want: 1},
		{admin: true, name: "admin: alone", file: bom, want: 0},
		{admin: true, name: "admin: on line 2 it is not skipped", file: "alice viewer " + aliceToken + "\n" + bom + "bob operator " + bobToken + "\n", wantErr: "line 2: the name (field 1)"},
		{name: "API: before a caller's line", file: bom + "carol " + carolToken + " free\n", want: 1},
		{name: "API: before a comment", file: bom + "# callers\ncarol " + carolToken + " free\n", want: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "tokens")
			if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
				t.Fatal(err)
			}
			var got int
			var err error
			if tc.admin {
				var f *tokensFile[tokenSet]
				if f, err = loadAdminTokens(path, discard); err == nil {
					got = f.current().len()
				}
			} else {
				var c *Callers
				if c, err = LoadCallers(CallersOptions{TokensFile: path, Logger: discard}); err == nil {
					got = c.Len()
				}
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error: got %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("error: got %v, want none", err)
			}
			if got != tc.want {
				t.Errorf("tokens: got %d, want %d", got, tc.want)
			}
		})
	}
}
