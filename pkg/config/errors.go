package config

import (
	"cmp"
	"errors"
	"strings"
)

// ErrInvalid is wrapped by every error of Load, Validate and ClusterOptions
// that only a configuration change can fix; the command exits 2 on it.
var ErrInvalid = errors.New("invalid configuration")

// KeyError is a problem with one key's value. Its message names the key,
// every place the key can be set (or, with Source, the place it was set),
// and what is allowed:
//
//	redis.timeout: must be > 0 (env LIMITER_REDIS_TIMEOUT, flag --redis-timeout), got -1s
//	tiers.static[1].maxConcurrentStreams: must be <= 1000 (env LIMITER_TIERS_STATIC), got 5000
//	tiers.static[0]: unknown field "maxConcurentStreams" (limiter.yaml line 12); did you mean "maxConcurrentStreams"?
type KeyError struct {
	// Key is the dotted key, e.g. "redis.timeout".
	Key string
	// Field, for a key holding a list, names the part of the value at
	// fault, e.g. "[1].maxConcurrentStreams"; empty when the whole value is.
	Field string
	// Problem says what is allowed, or what went wrong.
	Problem string
	// Got is the offending value, already formatted; empty to leave it out.
	Got string
	// Source, when set, is where the value at fault was written
	// ("limiter.yaml line 12", "env LIMITER_TIERS_STATIC"), named instead
	// of every place the key can be set.
	Source string
	// Hint, when set, follows the message: what was likely meant.
	Hint string
	// Err is the underlying error, if any.
	Err error
}

func (e *KeyError) Error() string {
	var b strings.Builder
	b.WriteString(e.Key)
	b.WriteString(e.Field)
	b.WriteString(": ")
	b.WriteString(e.Problem)
	b.WriteString(" (")
	b.WriteString(cmp.Or(e.Source, Sources(e.Key)))
	b.WriteString(")")
	if e.Got != "" {
		b.WriteString(", got ")
		b.WriteString(e.Got)
	}
	if e.Hint != "" {
		b.WriteString("; ")
		b.WriteString(e.Hint)
	}
	return b.String()
}

// Unwrap makes errors.Is(err, ErrInvalid) hold, and reaches Err.
func (e *KeyError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrInvalid}
	}
	return []error{ErrInvalid, e.Err}
}

// Sources names where key can be set besides the file: its environment
// variable and, if it has one, its flag ("env LIMITER_OPS_ADDR, flag
// --ops-addr").
func Sources(key string) string {
	s := "env " + EnvVar(key)
	if f, ok := flagOf(key); ok {
		s += ", flag --" + f.name
	}
	return s
}
