package server

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const (
	aliceToken = "alice-token-0123456789abcdef"
	bobToken   = "bob-token-0123456789abcdef"
)

func TestParseTokens(t *testing.T) {
	for _, tc := range []struct {
		name    string
		file    string
		want    []string // name/role of each token, in order
		wantErr string
	}{
		{
			name: "lines of name role token, with comments, blank lines, tabs and CRLF",
			file: "# support staff\n\nalice viewer " + aliceToken + "\r\n\tbob\toperator\t" + bobToken + "  \n   # indented comment\n",
			want: []string{"alice/viewer", "bob/operator"},
		},
		{name: "an empty file holds no token", file: "", want: nil},
		{name: "two fields name the line", file: "# c\nalice viewer\n", wantErr: `line 2: want 3 fields "name role token", got 2`},
		{name: "four fields name the line", file: "alice viewer " + aliceToken + " extra\n", wantErr: "line 1: want 3 fields"},
		{name: "an unknown role", file: "alice admin " + aliceToken + "\n", wantErr: "line 1: the role (field 2) must be viewer or operator"},
		{name: "columns swapped: the token is not echoed", file: "alice " + aliceToken + " viewer\n", wantErr: "line 1: the role (field 2) must be viewer or operator"},
		{name: "a bad name", file: "al/ice viewer " + aliceToken + "\n", wantErr: "line 1: the name (field 1) must be 1-64 characters"},
		{name: "a short token", file: "alice viewer short\n", wantErr: "line 1: the token (field 3) is 5 characters, want 16 to 4096"},
		{name: "a duplicate name", file: "alice viewer " + aliceToken + "\nalice operator " + bobToken + "\n", wantErr: "line 2: the name (field 1) is already used on line 1"},
		{name: "a duplicate token", file: "alice viewer " + aliceToken + "\nbob operator " + aliceToken + "\n", wantErr: "line 2: the token (field 3) is already used on line 1"},
		{name: "invalid UTF-8", file: "alice viewer \xff" + aliceToken + "\n", wantErr: "line 1: not valid UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set, err := parseTokens(strings.NewReader(tc.file))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error: got %v, want it to contain %q", err, tc.wantErr)
				}
				for _, secret := range []string{aliceToken, bobToken, "short"} {
					if strings.Contains(err.Error(), secret) {
						t.Errorf("error %q echoes a token", err)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("error: got %v, want none", err)
			}
			var got []string
			for _, tok := range set.tokens {
				got = append(got, tok.name+"/"+tok.role)
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("tokens: got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestTokenLookup(t *testing.T) {
	set, err := parseTokens(strings.NewReader("alice viewer " + aliceToken + "\nbob operator " + bobToken + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		presented string
		want      string
	}{
		{"alice's token is alice, viewer", aliceToken, "alice/viewer"},
		{"bob's token is bob, operator", bobToken, "bob/operator"},
		{"a prefix of a token is unknown", aliceToken[:20], ""},
		{"a token with a suffix is unknown", aliceToken + "x", ""},
		{"an empty token is unknown", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok, ok := set.lookup(tc.presented)
			got := ""
			if ok {
				got = tok.name + "/" + tok.role
			}
			if got != tc.want {
				t.Errorf("lookup: got %q, want %q", got, tc.want)
			}
		})
	}
}

// syncLog hands each log line of the watcher goroutine to the test.
type syncLog struct {
	ch chan string
}

func (s *syncLog) Write(p []byte) (int, error) {
	s.ch <- string(p)
	return len(p), nil
}

// A tokens file rewritten in place with the same size and modification
// time (cp -p of a copy, tar over it) is re-read all the same: a token
// taken out of it is refused, one put in it is known.
func TestATokensFileRewrittenToTheSameSizeAndTimeIsReRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	first := "alice viewer " + aliceToken + "\n"
	second := "carol viewer " + strings.Repeat("c", len(aliceToken)) + "\n"
	if err := os.WriteFile(path, []byte(first), 0o600); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := loadAdminTokens(path, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(second), 0o600); err != nil { // in place: the same file
		t.Fatal(err)
	}
	if err := os.Chtimes(path, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if now, err := os.Stat(path); err != nil || now.Size() != fi.Size() || !now.ModTime().Equal(fi.ModTime()) {
		t.Fatalf("the rewrite: %v, %v; want the same size and time", now, err)
	}
	f.reload()
	f.reload() // a change is acted on once it has stayed for one poll
	if _, ok := f.current().lookup(aliceToken); ok {
		t.Errorf("alice's token, taken out of the file: still known")
	}
	if _, ok := f.current().lookup(strings.Repeat("c", len(aliceToken))); !ok {
		t.Errorf("carol's token, put in the file: unknown")
	}
}

func TestTokenFileReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	versions := 0
	write := func(content string) {
		t.Helper()
		// Replaced whole (as a Secret update or `mv` does), each version
		// with a distinct mtime, as edits seconds apart would have.
		tmp := path + ".new"
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		versions++
		stamp := time.Now().Add(time.Duration(versions) * time.Second)
		if err := os.Chtimes(tmp, stamp, stamp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write("alice viewer " + aliceToken + "\n")
	sink := &syncLog{ch: make(chan string, 16)}
	f, err := loadAdminTokens(path, slog.New(slog.NewJSONHandler(sink, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.watch(ctx, 10*time.Millisecond) }()
	defer func() { cancel(); <-done }()

	nextLog := func(want string) string {
		t.Helper()
		select {
		case line := <-sink.ch:
			if !strings.Contains(line, want) {
				t.Fatalf("log: got %s, want it to contain %q", line, want)
			}
			return line
		case <-time.After(5 * time.Second):
			t.Fatalf("log: got nothing within 5s, want %q", want)
		}
		return ""
	}
	known := func(token string) bool { _, ok := f.current().lookup(token); return ok }

	// A new token is picked up.
	write("alice viewer " + aliceToken + "\nbob operator " + bobToken + "\n")
	nextLog("admin tokens reloaded")
	if !known(bobToken) || !known(aliceToken) {
		t.Fatalf("after adding bob: got alice %v, bob %v, want both known", known(aliceToken), known(bobToken))
	}

	// A bad edit keeps the tokens in force, logs the line once, and never the token.
	write("alice viewer " + aliceToken + "\nbob " + bobToken + "\n")
	line := nextLog(`line 2: want 3 fields`)
	if strings.Contains(line, bobToken) || !strings.Contains(line, "keeping the tokens read before") {
		t.Errorf("log of a bad edit: got %s, want the kept-tokens message without the token", line)
	}
	if !known(bobToken) {
		t.Errorf("after a bad edit: bob's token is unknown, want the last good set kept")
	}
	select {
	case again := <-sink.ch:
		t.Errorf("log: got %s, want the bad edit reported once", again)
	case <-time.After(100 * time.Millisecond):
	}

	// A removed token is refused after the next good edit.
	write("alice operator " + aliceToken + "\n")
	nextLog("admin tokens reloaded")
	if known(bobToken) {
		t.Errorf("after removing bob: bob's token is still known")
	}
	if tok, _ := f.current().lookup(aliceToken); tok.role != "operator" {
		t.Errorf("alice's role: got %q, want operator", tok.role)
	}

	// A deleted file (a removed Secret) revokes every token, logged once.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	line = nextLog("admin tokens file removed")
	if !strings.Contains(line, `"level":"WARN"`) {
		t.Errorf("log of a removed file: got %s, want a WARN", line)
	}
	if known(aliceToken) {
		t.Errorf("after deleting the file: alice's token is known, want every token revoked")
	}
	select {
	case again := <-sink.ch:
		t.Errorf("log: got %s, want the removal reported once", again)
	case <-time.After(100 * time.Millisecond):
	}

	// The file back brings its tokens back.
	write("alice viewer " + aliceToken + "\n")
	nextLog("admin tokens reloaded")
	if !known(aliceToken) {
		t.Errorf("after restoring the file: alice's token is unknown")
	}
}

// Other users able to read the tokens file is worth a word of advice, once,
// judged on the file a symlink resolves to (a Kubernetes Secret volume's
// links are 0777); it never stops the tokens from loading. Group bits draw
// none: the chart mounts its Secrets 0440 for the pod's fsGroup, which the
// kubelet would restore over any advice to drop them.
func TestTokenFileModeAdvice(t *testing.T) {
	const advice = "readable by other users"
	for _, tc := range []struct {
		name    string
		mode    os.FileMode
		symlink bool
		want    int // advice lines after the load and two polls
	}{
		{name: "a 0600 file gets no advice", mode: 0o600},
		{name: "a 0644 file gets advice once", mode: 0o644, want: 1},
		{name: "a 0640 file gets no advice", mode: 0o640},
		{name: "a 0440 file (the chart's Secret mounts) gets no advice", mode: 0o440},
		{name: "a 0604 file gets advice once", mode: 0o604, want: 1},
		{name: "a 0440 file behind a symlink gets no advice", mode: 0o440, symlink: true},
		{name: "a 0600 file behind a symlink gets no advice", mode: 0o600, symlink: true},
		{name: "a 0644 file behind a symlink gets advice once", mode: 0o644, symlink: true, want: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "tokens")
			target := path
			if tc.symlink {
				target = filepath.Join(dir, "..data")
				if err := os.Symlink(target, path); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(target, []byte("alice viewer "+aliceToken+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(target, tc.mode); err != nil { // not subject to the umask
				t.Fatal(err)
			}
			var log strings.Builder
			f, err := loadAdminTokens(path, slog.New(slog.NewJSONHandler(&log, nil)))
			if err != nil {
				t.Fatalf("load: got %v, want the tokens loaded whatever the mode", err)
			}
			f.reload()
			f.reload()
			if got := strings.Count(log.String(), advice); got != tc.want {
				t.Errorf("advice lines: got %d, want %d; log:\n%s", got, tc.want, log.String())
			}
			if tc.want > 0 && !strings.Contains(log.String(), `"level":"WARN"`) {
				t.Errorf("advice: got %s, want a WARN", log.String())
			}
			if _, ok := f.current().lookup(aliceToken); !ok {
				t.Errorf("alice's token: unknown, want it in force whatever the mode")
			}
		})
	}

	t.Run("advice comes again after the mode was fixed then loosened", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "tokens")
		if err := os.WriteFile(path, []byte("alice viewer "+aliceToken+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		var log strings.Builder
		f, err := loadAdminTokens(path, slog.New(slog.NewJSONHandler(&log, nil)))
		if err != nil {
			t.Fatal(err)
		}
		for _, mode := range []os.FileMode{0o644, 0o644, 0o600, 0o604} {
			if err := os.Chmod(path, mode); err != nil {
				t.Fatal(err)
			}
			f.reload()
		}
		if got := strings.Count(log.String(), advice); got != 2 {
			t.Errorf("advice lines: got %d, want 2 (0644, then 0604); log:\n%s", got, log.String())
		}
	})
}

func TestClean(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
		max            int
	}{
		{"plain text is kept", "user-42 é 中", "user-42 é 中", 100},
		{"a newline and a carriage return are replaced", "a\nb\rc", "a\uFFFDb\uFFFDc", 100},
		{"an escape sequence is defused", "a\x1b[31mb", "a\uFFFD[31mb", 100},
		{"a bidi override and a zero-width space are replaced", "a\u202Eb\u200Bc", "a\uFFFDb\uFFFDc", 100},
		{"line and paragraph separators are replaced", "a\u2028b\u2029c", "a\uFFFDb\uFFFDc", 100},
		{"invalid UTF-8 is replaced", "a\xffb", "a\uFFFDb", 100},
		{"a long string is cut and marked", strings.Repeat("x", 10), "xxxx…", 4},
		{"an emoji's variation selector is kept", "ok ❤️", "ok ❤️", 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Clean(tc.in, tc.max); got != tc.want {
				t.Errorf("Clean(%q): got %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestCleanIDMarksEveryInvisibleCharacter(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"alice", "alice"},
		{"user-42 é 中", "user-42 é 中"},
		{"alice\n", "alice\uFFFD"},
		{"alice\u200B", "alice\uFFFD"},
		{"alice\u3164", "alice\uFFFD"}, // a Hangul filler
		{"alice\u034F", "alice\uFFFD"}, // the combining grapheme joiner
		{"alice\uFE0F", "alice\uFFFD"}, // a variation selector
		{"alice\U000E0100", "alice\uFFFD"},
		{"alice\u2800", "alice\uFFFD"}, // the braille blank
	} {
		if got := CleanID(tc.in, 100); got != tc.want {
			t.Errorf("CleanID(%q): got %q, want %q", tc.in, got, tc.want)
		}
	}
}
