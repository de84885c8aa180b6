package server

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/joishi/limiter/pkg/httpapi"
)

// Bounds of the tokens file.
const (
	maxTokensFileBytes = 1 << 20
	maxTokenNameLength = 64
	// minTokenLength refuses guessable tokens: 16 characters of a random
	// alphabet is already far beyond online guessing.
	minTokenLength = 16
	maxTokenLength = 4096
)

// adminToken is one line of the tokens file. Only the token's SHA-256 is
// kept: comparing fixed-size digests in constant time hides the token's
// length as well as its content.
type adminToken struct {
	name   string
	role   string
	digest [sha256.Size]byte
}

// tokenSet is an immutable set of tokens, swapped whole on reload.
type tokenSet struct {
	tokens []adminToken
}

// lookup returns the token whose value is presented. It compares against
// every token, without stopping at a match, so the time taken says nothing
// about which token (if any) matched.
func (s *tokenSet) lookup(presented string) (adminToken, bool) {
	digest := sha256.Sum256([]byte(presented))
	var found adminToken
	matched := 0
	for _, t := range s.tokens {
		if subtle.ConstantTimeCompare(digest[:], t.digest[:]) == 1 {
			found, matched = t, 1
		}
	}
	return found, matched == 1
}

// parseTokens reads a tokens file: one "name role token" per line,
// whitespace-separated; blank lines and lines starting with '#' are
// skipped. Errors name the line and the field but never echo a field's
// value: with columns swapped, any field could be a token.
func parseTokens(r io.Reader) (*tokenSet, error) {
	sc := bufio.NewScanner(io.LimitReader(r, maxTokensFileBytes+1))
	sc.Buffer(make([]byte, 0, 4096), maxTokensFileBytes+1)
	set := &tokenSet{}
	nameLine := map[string]int{}
	tokenLine := map[[sha256.Size]byte]int{}
	line, size := 0, 0
	for sc.Scan() {
		line++
		size += len(sc.Bytes()) + 1
		if size > maxTokensFileBytes {
			return nil, fmt.Errorf("larger than %d bytes", maxTokensFileBytes)
		}
		text := sc.Text()
		if !utf8.ValidString(text) {
			return nil, fmt.Errorf("line %d: not valid UTF-8", line)
		}
		fields := splitFields(text)
		if len(fields) == 0 || fields[0][0] == '#' {
			continue
		}
		if len(fields) != 3 {
			return nil, fmt.Errorf("line %d: want 3 fields \"name role token\", got %d", line, len(fields))
		}
		name, role, token := fields[0], fields[1], fields[2]
		if !validTokenName(name) {
			return nil, fmt.Errorf("line %d: the name (field 1) must be 1-%d characters of [A-Za-z0-9._@-]", line, maxTokenNameLength)
		}
		if role != httpapi.RoleViewer && role != httpapi.RoleOperator {
			return nil, fmt.Errorf("line %d: the role (field 2) must be %s or %s", line, httpapi.RoleViewer, httpapi.RoleOperator)
		}
		if n := utf8.RuneCountInString(token); n < minTokenLength || n > maxTokenLength {
			return nil, fmt.Errorf("line %d: the token (field 3) is %d characters, want %d to %d", line, n, minTokenLength, maxTokenLength)
		}
		if first, dup := nameLine[name]; dup {
			return nil, fmt.Errorf("line %d: the name (field 1) is already used on line %d", line, first)
		}
		digest := sha256.Sum256([]byte(token))
		if first, dup := tokenLine[digest]; dup {
			return nil, fmt.Errorf("line %d: the token (field 3) is already used on line %d; give each person their own", line, first)
		}
		nameLine[name], tokenLine[digest] = line, line
		set.tokens = append(set.tokens, adminToken{name: name, role: role, digest: digest})
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("line %d: longer than %d bytes", line+1, maxTokensFileBytes)
		}
		return nil, err
	}
	return set, nil
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

func validTokenName(name string) bool {
	if name == "" || len(name) > maxTokenNameLength {
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

// tokenFile is the tokens file and the last set read from it without error.
type tokenFile struct {
	path string
	log  *slog.Logger
	set  atomic.Pointer[tokenSet]

	// Touched by load and watch only (one goroutine after the first load).
	stamp       fileStamp // of the version in force (or last reported bad)
	pending     fileStamp // of a change seen once, read when seen again unchanged
	lastErr     string
	warnedLoose bool // the file is readable by others and that was logged
}

// fileStamp tells whether a file changed since it was read.
type fileStamp struct {
	modTime time.Time
	size    int64
}

// removed is the stamp of a file that is gone.
var removed = fileStamp{size: -1}

// loadTokenFile reads path; an error names the path and the line.
func loadTokenFile(path string, log *slog.Logger) (*tokenFile, error) {
	f := &tokenFile{path: path, log: log}
	set, fi, err := readTokenFile(path)
	if err != nil {
		return nil, err
	}
	f.set.Store(set)
	f.stamp = stampOf(fi)
	f.checkMode(fi)
	return f, nil
}

// readTokenFile parses path and returns it with the file it read (the
// symlink's target, as a Kubernetes Secret volume mounts it).
func readTokenFile(path string) (*tokenSet, os.FileInfo, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		return nil, nil, err
	}
	set, err := parseTokens(file)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return set, fi, nil
}

func stampOf(fi os.FileInfo) fileStamp { return fileStamp{modTime: fi.ModTime(), size: fi.Size()} }

// current returns the tokens in force.
func (f *tokenFile) current() *tokenSet { return f.set.Load() }

// watch re-reads the file when its modification time or size changes
// (within two intervals), checking every interval until ctx ends. A removed
// file revokes every token: removing it (or the Secret) is how to shut the
// admin API to everyone. A file that cannot be read or parsed keeps the
// tokens in force, so a bad edit locks nobody out: the error is logged
// once per change. Polling (rather than inotify) also sees a Kubernetes
// Secret update, which swaps a symlink rather than writing the file.
func (f *tokenFile) watch(ctx context.Context, interval time.Duration) {
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

func (f *tokenFile) reload() {
	seen := removed
	fi, err := os.Stat(f.path) // follows symlinks: a dangling one is a removed file
	switch {
	case err == nil:
		seen = stampOf(fi)
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
		f.set.Store(&tokenSet{})
		f.stamp, f.lastErr = removed, ""
		f.log.Warn("admin tokens file removed: every admin token is revoked until it is back", "file", f.path)
		return
	}
	set, fi, err := readTokenFile(f.path)
	if err != nil {
		// Remember the bad version, so it is reported once, not every poll.
		f.stamp = seen
		f.lastErr = "" // a new version: report it even if its error reads the same
		f.failed(err)
		return
	}
	f.set.Store(set)
	f.stamp, f.lastErr = stampOf(fi), ""
	f.log.Info("admin tokens reloaded", "file", f.path, "tokens", len(set.tokens))
}

func (f *tokenFile) failed(err error) {
	if err.Error() == f.lastErr {
		return
	}
	f.lastErr = err.Error()
	f.log.Error("admin tokens file unusable; keeping the tokens read before", "file", f.path, "tokens", len(f.current().tokens), "err", err)
}

// checkMode advises, once until it is fixed, when other users may read
// the file. fi is the resolved file: a Kubernetes Secret volume's symlinks
// are always 0777, its files 0644 unless the volume's defaultMode says
// otherwise. Advice only: whether others can reach the file is the
// deployment's call.
func (f *tokenFile) checkMode(fi os.FileInfo) {
	loose := fi.Mode().Perm()&0o077 != 0
	if loose && !f.warnedLoose {
		f.log.Warn("admin tokens file is readable by other users; consider chmod 600, or defaultMode: 0400 on its Secret volume",
			"file", f.path, "mode", fmt.Sprintf("%04o", fi.Mode().Perm()))
	}
	f.warnedLoose = loose
}
