// Package keys is the limiter's key schema: every Redis key name is built
// here, and the user and stream ids that go into keys and members are
// validated here.
package keys

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// DefaultKeyPrefix is the prefix of every slot key unless configured.
const DefaultKeyPrefix = "joishi:streams:"

// Bounds of the identifiers that go into keys and members.
const (
	MaxUserIDBytes      = 256
	MaxStreamIDLength   = 128
	MaxKeyPrefixLength  = 128
	MaxLabelBytes       = 128
	generatedStreamSize = 16 // bytes of randomness in a generated stream id (128 bits)
)

var (
	// ErrInvalidUserID is returned by ValidateUserID (and so by every limiter
	// operation) for a user id that cannot safely become a key.
	ErrInvalidUserID = errors.New("invalid user id")
	// ErrInvalidStreamID is returned by ValidateStreamID for a stream id
	// outside 1-128 characters of [A-Za-z0-9._:-].
	ErrInvalidStreamID = errors.New("invalid stream id")
	// ErrInvalidLabel is returned by ValidateLabel for a slot label that
	// is too long or holds whitespace, control or invisible characters or
	// bad UTF-8.
	ErrInvalidLabel = errors.New("invalid label")
)

// ValidateUserID accepts 1-256 bytes of valid UTF-8 with no whitespace,
// control or invisible characters and no braces. Invisible characters (see
// Invisible: U+200B, a bidirectional override, a Hangul filler) show as
// nothing or reorder what follows, so an id holding one would read as
// another user's on the admin page and in logs. Braces are refused, not
// escaped: the user id is the key's hash tag, and a '}' inside it would end
// the tag early ("a}b" would hash like "a", sharing a cluster slot and a
// bucket boundary with another user's id).
func ValidateUserID(id string) error { return validateUserID(id, false) }

// ValidateHeldUserID accepts the user ids whose slots may be held already:
// those ValidateUserID accepts, and those holding invisible characters,
// which the releases before this one granted slots to. A stream taken under
// such an id during a rolling update (by a replica of the release before)
// is heartbeaten, released and listed by every replica until it ends; no
// acquire or override takes a new one.
func ValidateHeldUserID(id string) error { return validateUserID(id, true) }

func validateUserID(id string, held bool) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: must not be empty", ErrInvalidUserID)
	case len(id) > MaxUserIDBytes:
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrInvalidUserID, len(id), MaxUserIDBytes)
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidUserID)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if c >= utf8.RuneSelf {
			for _, r := range id[i:] {
				if err := checkUserIDRune(r, held); err != nil {
					return err
				}
			}
			return nil
		}
		if !userIDASCII[c] {
			return checkUserIDRune(rune(c), held)
		}
	}
	return nil
}

// checkUserIDRune refuses a rune no user id may hold; an invisible one
// too, unless held is set (see ValidateHeldUserID).
func checkUserIDRune(r rune, held bool) error {
	switch {
	case r == '{' || r == '}':
		return fmt.Errorf("%w: must not contain '{' or '}'", ErrInvalidUserID)
	case unicode.IsSpace(r) || unicode.IsControl(r) || (!held && Invisible(r)) || r == utf8.RuneError:
		return fmt.Errorf("%w: must not contain whitespace, control, format or other invisible characters (found %U)", ErrInvalidUserID, r)
	}
	return nil
}

// Invisible reports whether r shows as nothing, or changes how the
// characters around it show, rather than as a character of its own: a
// format character (Cf: U+200B, a bidirectional override, a tag
// character), any other of Unicode's default-ignorable code points (the
// Hangul fillers U+115F, U+1160, U+3164 and U+FFA0, the combining grapheme
// joiner U+034F, the variation selectors U+FE00-FE0F and U+E0100-E01EF),
// or the braille blank U+2800, a blank that is not whitespace.
func Invisible(r rune) bool {
	return unicode.Is(unicode.Cf, r) ||
		unicode.Is(unicode.Other_Default_Ignorable_Code_Point, r) ||
		unicode.Is(unicode.Variation_Selector, r) || r == '\u2800'
}

// userIDASCII holds checkUserIDRune's answer for each ASCII byte, so that
// ids in ASCII, as most are, are checked a byte at a time.
var userIDASCII = func() (ok [utf8.RuneSelf]bool) {
	for c := range ok {
		ok[c] = checkUserIDRune(rune(c), false) == nil // ASCII holds no invisible character
	}
	return ok
}()

// ValidateStreamID accepts 1-128 characters of [A-Za-z0-9._:-].
func ValidateStreamID(id string) error {
	if id == "" || len(id) > MaxStreamIDLength {
		return fmt.Errorf("%w: must be 1-%d characters, got %d", ErrInvalidStreamID, MaxStreamIDLength, len(id))
	}
	for i := 0; i < len(id); i++ {
		if !streamIDByte(id[i]) {
			return fmt.Errorf("%w: character %q at %d is not one of [A-Za-z0-9._:-]", ErrInvalidStreamID, id[i], i)
		}
	}
	return nil
}

// ValidateLabel accepts a slot's label, what its caller says the stream is
// (a pod, a model, a request id): empty (no label), or up to 128 bytes of
// valid UTF-8 with no whitespace, control or invisible characters, so that it
// reads the same in a table, a terminal and a log line. It is checked like
// a user id, braces allowed: a label goes into a slot's record, never into
// a key.
func ValidateLabel(label string) error {
	switch {
	case len(label) > MaxLabelBytes:
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrInvalidLabel, len(label), MaxLabelBytes)
	case !utf8.ValidString(label):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidLabel)
	}
	for _, r := range label {
		if unicode.IsSpace(r) || unicode.IsControl(r) || Invisible(r) || r == utf8.RuneError {
			return fmt.Errorf("%w: must not contain whitespace, control, format or other invisible characters (found %U)", ErrInvalidLabel, r)
		}
	}
	return nil
}

func streamIDByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '.' || c == '_' || c == ':' || c == '-'
}

// NewStreamID returns a random 128-bit stream id in hex.
func NewStreamID() string {
	var b [generatedStreamSize]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}

// ValidateKeyPrefix refuses prefixes that would break the hash tag.
func ValidateKeyPrefix(prefix string) error {
	if len(prefix) > MaxKeyPrefixLength {
		return fmt.Errorf("key prefix is %d bytes, the limit is %d", len(prefix), MaxKeyPrefixLength)
	}
	if strings.ContainsAny(prefix, "{}") {
		return fmt.Errorf("key prefix %q must not contain '{' or '}': it would change the key's cluster hash tag", prefix)
	}
	return nil
}

// Schema builds the Redis keys of the limiter. Every key name is built here.
type Schema struct {
	// Prefix of every key. Default DefaultKeyPrefix.
	Prefix string
}

// UserKey returns the key of the sorted set holding userID's slots:
// <prefix>{<userID>}. The braces make the user id the cluster hash tag, so
// all of one user's operations land in one cluster slot.
func (k Schema) UserKey(userID string) (string, error) {
	if err := ValidateUserID(userID); err != nil {
		return "", err
	}
	return k.userKey(userID), nil
}

// HeldUserKey is UserKey for the operations on slots that may be held
// already (heartbeat, release, the admin's listing and removals): it
// takes the ids ValidateHeldUserID accepts.
func (k Schema) HeldUserKey(userID string) (string, error) {
	if err := ValidateHeldUserID(userID); err != nil {
		return "", err
	}
	return k.userKey(userID), nil
}

func (k Schema) userKey(userID string) string {
	prefix := k.Prefix
	if prefix == "" {
		prefix = DefaultKeyPrefix
	}
	return prefix + "{" + userID + "}"
}

// slotRecordsSuffix follows a user key to name its slot records.
const slotRecordsSuffix = ":meta"

// SlotRecords returns the key of the hash holding the record of each slot
// of userKey (a key UserKey returned): <prefix>{<userID>}:meta, under the
// same hash tag, so one script reaches both in one cluster slot. Field:
// the stream id. Value: the slot's record, which starts with the slot's
// TTL in ms in decimal digits; any later fields follow a ';', and readers
// that need only the TTL parse the leading digits. The scripts write a
// record with its slot, remove it with its slot, and give the hash the
// sorted set's expiry, so no record outlives its slot past that.
func SlotRecords(userKey string) string { return userKey + slotRecordsSuffix }

// Suffixes of a user key that name its wait queue and its wake channel.
const (
	queueSuffix        = ":q"
	queueExpirySuffix  = ":q:expiry"
	queueRecordsSuffix = ":q:rec"
	wakeSuffix         = ":wake"
)

// Queue returns the key of the sorted set of userKey's waiting acquires
// (a key UserKey returned): <prefix>{<userID>}:q, under the user's hash
// tag. Member: a waiting acquire's stream id (its ticket). Score: its
// place in arrival order, the Redis-server time in microseconds when it
// was queued, raised past the last ticket's when the clock did not move.
func Queue(userKey string) string { return userKey + queueSuffix }

// QueueExpiry returns the key of the sorted set of the expiries of
// userKey's tickets: <prefix>{<userID>}:q:expiry. Member: the stream id,
// as in Queue. Score: the Redis-server millisecond at which the ticket
// stops counting unless its server refreshes it, so that the waiter of a
// server that died is skipped.
func QueueExpiry(userKey string) string { return userKey + queueExpirySuffix }

// QueueRecords returns the key of the hash of userKey's tickets' records:
// <prefix>{<userID>}:q:rec. Field: the stream id, as in Queue. Value: the
// limit of the ticket's plan in decimal digits (the most slots its acquire
// may be granted beside the user's others), then ';caller=<name>' when the
// ticket's caller is known: a ticket whose limit is reached blocks no
// acquire under a larger one, and a ticket is its caller's alone.
func QueueRecords(userKey string) string { return userKey + queueRecordsSuffix }

// WakeChannel returns the sharded pub/sub channel (SPUBLISH, SSUBSCRIBE)
// on which the servers waiting for userKey's slots are woken:
// <prefix>{<userID>}:wake. It hashes like the user's keys, so a wake-up
// goes through the shard that holds them.
func WakeChannel(userKey string) string { return userKey + wakeSuffix }

// IsQueue reports whether key is a name Queue, QueueExpiry or
// QueueRecords builds.
func IsQueue(key string) bool {
	_, ok := QueueOf(key)
	return ok
}

// QueueOf returns the user key (or pool key) whose Queue, QueueExpiry or
// QueueRecords key is, and whether key is one of those. The first '}'
// ends the user's hash tag: neither user ids nor the prefix may hold one.
func QueueOf(key string) (string, bool) {
	_, rest, ok := strings.Cut(key, "}")
	if !ok || (rest != queueSuffix && rest != queueExpirySuffix && rest != queueRecordsSuffix) {
		return "", false
	}
	return key[:len(key)-len(rest)], true
}

// overrideSuffix follows a user key to name its support override.
const overrideSuffix = ":override"

// Override returns the key of the hash holding userKey's support override
// (a key UserKey returned): <prefix>{<userID>}:override, under the same
// hash tag, so the acquire script reads it in the call that counts the
// slots. Fields: limit, expires_at (Redis ms), set_at (Redis ms), actor,
// reason. The key expires with the override; the scripts also compare
// expires_at with Redis time, so an override the store keeps past its
// expiry is not applied.
func Override(userKey string) string { return userKey + overrideSuffix }

// Companions are the keys a user key's (or a pool key's) scripts read
// beside it: SlotRecords, Override, Queue, QueueExpiry and QueueRecords
// of userKey, as those build them.
type Companions struct {
	SlotRecords, Override, Queue, QueueExpiry, QueueRecords string
}

// CompanionsOf returns userKey's companion keys, made in one allocation:
// every script call names them.
func CompanionsOf(userKey string) Companions {
	suffixes := [...]string{slotRecordsSuffix, overrideSuffix, queueSuffix, queueExpirySuffix, queueRecordsSuffix}
	var b strings.Builder
	b.Grow(len(suffixes)*len(userKey) + len(slotRecordsSuffix) + len(overrideSuffix) +
		len(queueSuffix) + len(queueExpirySuffix) + len(queueRecordsSuffix))
	for _, s := range suffixes {
		b.WriteString(userKey)
		b.WriteString(s)
	}
	all := b.String()
	var out [len(suffixes)]string
	for i, s := range suffixes {
		n := len(userKey) + len(s)
		out[i], all = all[:n], all[n:]
	}
	return Companions{SlotRecords: out[0], Override: out[1], Queue: out[2], QueueExpiry: out[3], QueueRecords: out[4]}
}

// IsOverride reports whether key is a name Override builds (the first '}'
// ends the user's hash tag, as in IsReleasedAnswer).
func IsOverride(key string) bool {
	_, rest, ok := strings.Cut(key, "}")
	return ok && rest == overrideSuffix
}

// releasedAnswerInfix follows a user key, then a call id, to name the
// answer release_all keeps for that call.
const releasedAnswerInfix = ":released:"

// ReleasedAnswer returns the key under which release_all keeps, for a
// short while, the answer of the call callID (the admin audit id) on
// userKey (a key UserKey returned): <prefix>{<userID>}:released:<callID>,
// under the user's hash tag. A Redis client that retries the call after
// losing its reply then gets the same answer instead of "nothing left".
// callID must be 1-128 characters of [A-Za-z0-9._:-].
func ReleasedAnswer(userKey, callID string) (string, error) {
	ok := callID != "" && len(callID) <= MaxStreamIDLength
	for i := 0; ok && i < len(callID); i++ {
		ok = streamIDByte(callID[i])
	}
	if !ok {
		return "", fmt.Errorf("call id %q: must be 1-%d characters of [A-Za-z0-9._:-]", callID, MaxStreamIDLength)
	}
	return userKey + releasedAnswerInfix + callID, nil
}

// IsReleasedAnswer reports whether key is a name ReleasedAnswer builds. The
// first '}' ends the user's hash tag: neither user ids nor the prefix may
// hold one.
func IsReleasedAnswer(key string) bool {
	_, rest, ok := strings.Cut(key, "}")
	return ok && strings.HasPrefix(rest, releasedAnswerInfix)
}

// Audit returns the key of the capped stream of admin audit records.
func (k Schema) Audit() string {
	prefix := k.Prefix
	if prefix == "" {
		prefix = DefaultKeyPrefix
	}
	return prefix + "audit"
}

// Overrides returns the key of the sorted set that counts the support
// overrides in force, for the metric: member = user id, score = the
// override's expiry (Redis ms). It is an index, not the override: the
// acquire script reads only the user's own Override key.
func (k Schema) Overrides() string {
	prefix := k.Prefix
	if prefix == "" {
		prefix = DefaultKeyPrefix
	}
	return prefix + "overrides"
}
