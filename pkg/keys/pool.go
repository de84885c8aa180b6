package keys

import (
	"cmp"
	"errors"
	"fmt"
	"strings"
)

// Bounds of a pool's name and keys.
const (
	MaxPoolNameLength = 63
	MaxPoolKeyBytes   = 128
)

var (
	// ErrInvalidPool is returned by ValidatePoolName for a pool name outside
	// [a-z0-9][a-z0-9._-]*, up to 63 characters.
	ErrInvalidPool = errors.New("invalid pool name")
	// ErrInvalidPoolKey is returned by ValidatePoolKey for a key outside
	// 1-128 bytes of [A-Za-z0-9._:/@-].
	ErrInvalidPoolKey = errors.New("invalid pool key")
)

// ValidatePoolName accepts a pool's name: 1-63 characters of
// [a-z0-9._-], starting with a letter or digit. It goes into the pool
// key's hash tag before an '=', so it holds neither '=' nor braces.
func ValidatePoolName(name string) error {
	if !validPoolName(name) {
		return fmt.Errorf("%w: %q must be 1-%d characters of [a-z0-9._-], starting with a letter or digit", ErrInvalidPool, name, MaxPoolNameLength)
	}
	return nil
}

// ValidatePoolKey accepts one key of a pool (a model's name, an
// organisation's id): 1-128 bytes of [A-Za-z0-9._:/@-], so that model
// names such as meta-llama/Llama-3.1-70B-Instruct are keys, and no key
// holds a brace (it would move the hash tag), whitespace or a ';' or ','
// (it would break the stream's record).
func ValidatePoolKey(key string) error {
	if !validPoolKey(key) {
		return fmt.Errorf("%w: %q must be 1-%d bytes of [A-Za-z0-9._:/@-]", ErrInvalidPoolKey, key, MaxPoolKeyBytes)
	}
	return nil
}

// validPoolName reports whether name is 1-MaxPoolNameLength bytes of
// [a-z0-9._-], its first a letter or digit. The checks of a pool's name
// and key run on each pooled acquire, so they look at each byte once
// rather than run a regular expression.
func validPoolName(name string) bool {
	if name == "" || len(name) > MaxPoolNameLength || !lowerOrDigit(name[0]) {
		return false
	}
	for i := 1; i < len(name); i++ {
		if c := name[i]; !lowerOrDigit(c) && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// validPoolKey reports whether key is 1-MaxPoolKeyBytes bytes of
// [A-Za-z0-9._:/@-].
func validPoolKey(key string) bool {
	if key == "" || len(key) > MaxPoolKeyBytes {
		return false
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; !streamIDByte(c) && c != '/' && c != '@' {
			return false
		}
	}
	return true
}

func lowerOrDigit(c byte) bool { return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' }

// PoolKey returns the key of the sorted set holding the slots of one key
// of a pool: <prefix>pool:{<pool>=<key>}. The braces make the pair the
// cluster hash tag, so each pool key is one cluster slot of its own, and
// its records, override and queue (SlotRecords, Override, Queue, ... of
// it) share that slot as a user's do. It never equals a UserKey: a user
// key's tag follows the prefix at once.
func (k Schema) PoolKey(pool, key string) (string, error) {
	if err := ValidatePoolName(pool); err != nil {
		return "", err
	}
	if err := ValidatePoolKey(key); err != nil {
		return "", err
	}
	prefix := k.Prefix
	if prefix == "" {
		prefix = DefaultKeyPrefix
	}
	return prefix + "pool:{" + pool + "=" + key + "}", nil
}

// PoolOf returns the pool of slots, a PoolKey of k, and whether slots is
// one (a UserKey is not).
func (k Schema) PoolOf(slots string) (string, bool) {
	rest, ok := strings.CutPrefix(slots, cmp.Or(k.Prefix, DefaultKeyPrefix)+"pool:{")
	if !ok {
		return "", false
	}
	pool, _, ok := strings.Cut(rest, "=")
	return pool, ok && validPoolName(pool)
}
