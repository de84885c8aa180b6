package keys

import (
	"errors"
	"fmt"
	"regexp"
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

var (
	poolNamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)
	poolKeyPattern  = regexp.MustCompile(`^[A-Za-z0-9._:/@-]+$`)
)

// ValidatePoolName accepts a pool's name: 1-63 characters of
// [a-z0-9._-], starting with a letter or digit. It goes into the pool
// key's hash tag before an '=', so it holds neither '=' nor braces.
func ValidatePoolName(name string) error {
	if len(name) > MaxPoolNameLength || !poolNamePattern.MatchString(name) {
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
	if len(key) > MaxPoolKeyBytes || !poolKeyPattern.MatchString(key) {
		return fmt.Errorf("%w: %q must be 1-%d bytes of [A-Za-z0-9._:/@-]", ErrInvalidPoolKey, key, MaxPoolKeyBytes)
	}
	return nil
}

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
