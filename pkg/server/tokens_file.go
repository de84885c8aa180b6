package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// Bounds of a tokens file (the admin one and the API one).
const (
	maxTokensFileBytes = 1 << 20
	// minTokenLength refuses guessable tokens: 16 characters of a random
	// alphabet is already far beyond online guessing.
	minTokenLength = 16
	maxTokenLength = 4096
	// byteOrderMark is UTF-8's, skipped where it opens a file.
	byteOrderMark = "\ufeff"
)

// tokensFile is a file of tokens, re-read when it changes, and the last
// set S read from it without error. The admin tokens file and the API
// tokens file are both one: they differ only in how a line is parsed.
type tokensFile[S any] struct {
	path  string
	what  string // names the file in log lines: "admin tokens", "API tokens"
	parse func(io.Reader) (*S, error)
	count func(*S) int
	log   *slog.Logger
	gen   atomic.Pointer[generation[S]]

	// Touched by load and watch only (one goroutine after the first load).
	stamp       fileStamp // of the version in force (or last reported bad)
	pending     fileStamp // of a change seen once, read when seen again unchanged
	lastErr     string
	warnedLoose bool // the file is readable by others (not just its group) and that was logged
}

// generation is a set in force, and when it stops being: replaced ends
// when a reload stores the next set, so that what was granted under it
// (a waiting acquire's caller) can be looked at again without polling.
type generation[S any] struct {
	set      *S
	replaced context.Context
	end      context.CancelFunc
}

// fileStamp tells whether a file changed since it was read: its time and
// size and, for a tokens file, a digest of what it holds, so that a
// rewrite that keeps both (cp -p, tar over it) is seen too: a token
// taken out of it must not stay valid.
type fileStamp struct {
	modTime time.Time
	size    int64
	sum     [sha256.Size]byte
}

// removed is the stamp of a file that is gone.
var removed = fileStamp{size: -1}

// loadTokensFile reads path with parse; an error names the path and the
// line. count says how many tokens a set holds, for the log.
func loadTokensFile[S any](path, what string, parse func(io.Reader) (*S, error), count func(*S) int, log *slog.Logger) (*tokensFile[S], error) {
	f := &tokensFile[S]{path: path, what: what, parse: parse, count: count, log: log}
	set, fi, stamp, err := f.read()
	if err != nil {
		return nil, err
	}
	f.store(set)
	f.stamp = stamp
	f.checkMode(fi)
	return f, nil
}

// read parses the file and returns it with the file it read (the
// symlink's target, as a Kubernetes Secret volume mounts it) and its
// stamp.
func (f *tokensFile[S]) read() (*S, os.FileInfo, fileStamp, error) {
	data, fi, stamp, err := readStamped(f.path)
	if err != nil {
		return nil, nil, fileStamp{}, err
	}
	set, err := f.parse(bytes.NewReader(data))
	if err != nil {
		return nil, nil, fileStamp{}, fmt.Errorf("%s: %w", f.path, err)
	}
	return set, fi, stamp, nil
}

// readStamped reads a tokens file (one byte past the most a parse
// accepts, which refuses it) with the file it read and its stamp.
func readStamped(path string) ([]byte, os.FileInfo, fileStamp, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, nil, fileStamp{}, err
	}
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		return nil, nil, fileStamp{}, err
	}
	data, err := io.ReadAll(io.LimitReader(file, maxTokensFileBytes+1))
	if err != nil {
		return nil, nil, fileStamp{}, err
	}
	stamp := stampOf(fi)
	stamp.sum = sha256.Sum256(data)
	return data, fi, stamp, nil
}

func stampOf(fi os.FileInfo) fileStamp { return fileStamp{modTime: fi.ModTime(), size: fi.Size()} }

// current returns the tokens in force.
func (f *tokensFile[S]) current() *S { return f.gen.Load().set }

// generation returns the tokens in force and when they stop being.
func (f *tokensFile[S]) generation() *generation[S] { return f.gen.Load() }

// store puts set in force and ends the generation it replaces.
func (f *tokensFile[S]) store(set *S) {
	replaced, end := context.WithCancel(context.Background())
	if old := f.gen.Swap(&generation[S]{set: set, replaced: replaced, end: end}); old != nil {
		old.end()
	}
}

// watch re-reads the file when its modification time, size or content
// changes (within two intervals), checking every interval until ctx ends. A removed
// file revokes every token: removing it (or the Secret) is how to shut the
// door to everyone; both it and a rewrite that leaves no token are logged
// at WARN. A file that cannot be read or parsed keeps the tokens
// in force, so a bad edit locks nobody out: the error is logged once per
// change. Polling (rather than inotify) also sees a Kubernetes Secret
// update, which swaps a symlink rather than writing the file.
func (f *tokensFile[S]) watch(ctx context.Context, interval time.Duration) {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			f.reload()
		}
	}
}

func (f *tokensFile[S]) reload() {
	seen := removed
	_, fi, stamp, err := readStamped(f.path) // follows symlinks: a dangling one is a removed file
	switch {
	case err == nil:
		seen = stamp
		f.checkMode(fi)
	case !errors.Is(err, fs.ErrNotExist):
		f.failed(err)
		return
	}
	if seen == f.stamp {
		f.pending = fileStamp{}
		return
	}
	// Act on a change only once it has stayed for one poll: an editor that
	// truncates then writes, or renames the old file away before writing
	// the new one, must not be caught half-way (an empty or missing file
	// would revoke every token until the next poll).
	if seen != f.pending {
		f.pending = seen
		return
	}
	f.pending = fileStamp{}
	if seen == removed {
		f.store(new(S))
		f.stamp, f.lastErr = removed, ""
		f.log.Warn(f.what+" file removed: every one of its tokens is revoked until it is back", "file", f.path)
		return
	}
	set, _, stamp, err := f.read()
	if err != nil {
		// Remember the bad version, so it is reported once, not every poll.
		f.stamp = seen
		f.lastErr = "" // a new version: report it even if its error reads the same
		f.failed(err)
		return
	}
	f.store(set)
	f.stamp, f.lastErr = stamp, ""
	if f.count(set) == 0 {
		// As loud as a removed file or an empty one at start: every token
		// is revoked, and an operator alerting on WARN must hear it.
		f.log.Warn(f.what+" file reloaded holding no token: every call it authenticates is refused until one is added", "file", f.path, "tokens", 0)
		return
	}
	f.log.Info(f.what+" reloaded", "file", f.path, "tokens", f.count(set))
}

func (f *tokensFile[S]) failed(err error) {
	if err.Error() == f.lastErr {
		return
	}
	f.lastErr = err.Error()
	f.log.Error(f.what+" file unusable; keeping the tokens read before", "file", f.path, "tokens", f.count(f.current()), "err", err)
}

// checkMode advises, once until it is fixed, when other users may read
// the file. fi is the resolved file: a Kubernetes Secret volume's symlinks
// are always 0777, its files 0644 unless the volume's defaultMode says
// otherwise. Only the bits for others count: the file's group is the
// pod's fsGroup, which must read it when the file is root's (the chart
// mounts its Secrets 0440, and the kubelet adds group read under fsGroup
// to any mode it is given). Advice only: whether others can reach the file
// is the deployment's call.
func (f *tokensFile[S]) checkMode(fi os.FileInfo) {
	loose := fi.Mode().Perm()&0o007 != 0
	if loose && !f.warnedLoose {
		f.log.Warn(f.what+" file is readable by other users; consider chmod 640 (or 600), or defaultMode: 0440 on its Secret volume",
			"file", f.path, "mode", fmt.Sprintf("%04o", fi.Mode().Perm()))
	}
	f.warnedLoose = loose
}

// scanTokenLines calls line with the whitespace-separated fields of each
// line of a tokens file that is not blank or a '#' comment, and the line's
// number. It refuses a file over maxTokensFileBytes and lines that are not
// UTF-8. A UTF-8 byte order mark opening the file (Notepad, PowerShell's
// Out-File write one) is skipped: it is not part of line 1's first field.
// Errors name the line, never a field's value: with columns swapped, any
// field could be a token.
func scanTokenLines(r io.Reader, line func(n int, fields []string) error) error {
	sc := bufio.NewScanner(io.LimitReader(r, maxTokensFileBytes+1))
	sc.Buffer(make([]byte, 0, 4096), maxTokensFileBytes+1)
	n, size := 0, 0
	for sc.Scan() {
		n++
		size += len(sc.Bytes()) + 1
		if size > maxTokensFileBytes {
			return fmt.Errorf("larger than %d bytes", maxTokensFileBytes)
		}
		text := sc.Text()
		if n == 1 {
			text = strings.TrimPrefix(text, byteOrderMark)
		}
		if !utf8.ValidString(text) {
			return fmt.Errorf("line %d: not valid UTF-8", n)
		}
		fields := splitFields(text)
		if len(fields) == 0 || fields[0][0] == '#' {
			continue
		}
		if err := line(n, fields); err != nil {
			return fmt.Errorf("line %d: %w", n, err)
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return fmt.Errorf("line %d: longer than %d bytes", n+1, maxTokensFileBytes)
		}
		return err
	}
	return nil
}

// splitFields splits on ASCII spaces and tabs (and drops a trailing \r).
func splitFields(s string) []string {
	var out []string
	start := -1
	for i := 0; i <= len(s); i++ {
		blank := i == len(s) || s[i] == ' ' || s[i] == '\t' || s[i] == '\r'
		switch {
		case blank && start >= 0:
			out = append(out, s[start:i])
			start = -1
		case !blank && start < 0:
			start = i
		}
	}
	return out
}

// validName reports whether name is 1 to max characters of [A-Za-z0-9._@-].
func validName(name string, max int) bool {
	if name == "" || len(name) > max {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '@' || c == '-') {
			return false
		}
	}
	return true
}

// checkToken refuses a token too short to be unguessable or too long;
// field is its column, for the message.
func checkToken(token string, field int) error {
	if n := utf8.RuneCountInString(token); n < minTokenLength || n > maxTokenLength {
		return fmt.Errorf("the token (field %d) is %d characters, want %d to %d", field, n, minTokenLength, maxTokenLength)
	}
	return nil
}
