package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/joishi/limiter/pkg/httpapi"
)

// AdminTokens are the tokens of the admin tokens file (admin.tokensFile):
// one "name role token" per line, role viewer or operator. pkg/admin
// authorizes every admin call by them. The file is read by the reader of
// the API tokens file (tokensFile), re-read when it changes (Watch).
type AdminTokens struct{ file *tokensFile[tokenSet] }

// AdminToken is one token of the file: its name, which the audit records
// as the actor, and its role.
type AdminToken struct{ Name, Role string }

// LoadAdminTokens reads the admin tokens file at path; an error names the
// file and the line, never a token. log receives reloads and unusable
// versions of the file.
func LoadAdminTokens(path string, log *slog.Logger) (*AdminTokens, error) {
	file, err := loadAdminTokens(path, log)
	if err != nil {
		return nil, err
	}
	return &AdminTokens{file: file}, nil
}

// Lookup returns the token whose value is presented, in constant time
// (tokenSet.lookup).
func (t *AdminTokens) Lookup(presented string) (AdminToken, bool) {
	token, ok := t.file.current().lookup(presented)
	return AdminToken{Name: token.name, Role: token.role}, ok
}

// Len returns how many tokens are in force.
func (t *AdminTokens) Len() int { return t.file.current().len() }

// Watch re-reads the file when it changes, every interval, until ctx
// ends. A removed file, or one rewritten to hold no token, revokes every
// token and is logged at WARN; a file that cannot be read or parsed is
// logged and the tokens read before stay in force.
func (t *AdminTokens) Watch(ctx context.Context, interval time.Duration) { t.file.watch(ctx, interval) }

// maxTokenNameLength bounds the name of an admin token.
const maxTokenNameLength = 64

// adminToken is one line of the admin tokens file. Only the token's
// SHA-256 is kept: comparing fixed-size digests in constant time hides the
// token's length as well as its content.
type adminToken struct {
	name   string
	role   string
	digest [sha256.Size]byte
}

// tokenSet is an immutable set of admin tokens, swapped whole on reload.
type tokenSet struct {
	tokens []adminToken
}

func (s *tokenSet) len() int { return len(s.tokens) }

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

// loadAdminTokens reads the admin tokens file; an error names the file and
// the line.
func loadAdminTokens(path string, log *slog.Logger) (*tokensFile[tokenSet], error) {
	return loadTokensFile(path, "admin tokens", parseTokens, (*tokenSet).len, log)
}

// parseTokens reads an admin tokens file: one "name role token" per line,
// whitespace-separated; blank lines and lines starting with '#' are
// skipped. Errors name the line and the field but never echo a field's
// value: with columns swapped, any field could be a token.
func parseTokens(r io.Reader) (*tokenSet, error) {
	set := &tokenSet{}
	nameLine := map[string]int{}
	tokenLine := map[[sha256.Size]byte]int{}
	err := scanTokenLines(r, func(line int, fields []string) error {
		if len(fields) != 3 {
			return fmt.Errorf("want 3 fields \"name role token\", got %d", len(fields))
		}
		name, role, token := fields[0], fields[1], fields[2]
		if !validName(name, maxTokenNameLength) {
			return fmt.Errorf("the name (field 1) must be 1-%d characters of [A-Za-z0-9._@-]", maxTokenNameLength)
		}
		if role != httpapi.RoleViewer && role != httpapi.RoleOperator {
			return fmt.Errorf("the role (field 2) must be %s or %s", httpapi.RoleViewer, httpapi.RoleOperator)
		}
		if err := checkToken(token, 3); err != nil {
			return err
		}
		if first, dup := nameLine[name]; dup {
			return fmt.Errorf("the name (field 1) is already used on line %d", first)
		}
		digest := sha256.Sum256([]byte(token))
		if first, dup := tokenLine[digest]; dup {
			return fmt.Errorf("the token (field 3) is already used on line %d; give each person their own", first)
		}
		nameLine[name], tokenLine[digest] = line, line
		set.tokens = append(set.tokens, adminToken{name: name, role: role, digest: digest})
		return nil
	})
	if err != nil {
		return nil, err
	}
	return set, nil
}
