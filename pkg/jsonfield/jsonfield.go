// Package jsonfield reads top-level string fields of a buffered JSON request
// body without decoding the body.
//
// limiter proxy and the Envoy ext_proc server choose a request's pool key
// from a field such as "model" of an OpenAI-style chat request. That field
// often comes after a large "messages" array, and decoding the whole body into
// maps to read one string would cost far more than the rest of the request's
// handling. Strings instead checks that the body is valid JSON, as
// json.Valid would but in a pass 2-3 times as fast (valid.go), without
// allocating, and then, relying on that validity, scans the top-level
// object, skipping every value it was not asked for without looking inside it.
//
// Because the limiter decides on what it reads, Strings is strict where JSON
// parsers disagree: field names are compared after JSON unescaping (so
// "mod\u0065l" is the field model) and in any case, as Go's encoding/json
// matches a member to a field (so "MODEL" is the field model too, which an
// upstream written in Go reads as its model), and a named field that appears
// more than once, however spelt, is an error rather than a guess at which
// copy the upstream will use.
package jsonfield

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

var (
	// ErrNotJSON is wrapped by the error Strings returns for a body that is
	// not valid JSON.
	ErrNotJSON = errors.New("jsonfield: body is not valid JSON")

	// ErrNotObject is returned by Strings for a body that is valid JSON but
	// whose top-level value is not an object.
	ErrNotObject = errors.New("jsonfield: body is not a JSON object")

	// ErrInvalidField matches (with errors.Is) every *FieldError.
	ErrInvalidField = errors.New("jsonfield: invalid field")
)

// FieldError reports a named field that Strings cannot take a value from: it
// appears more than once, or its value is not a string or null.
type FieldError struct {
	Field   string // the field's name, as passed to Strings
	Problem string // what is wrong with it, e.g. "is a number, want a string"
	// Count is how many times the field appears at the top level: above
	// 1, the problem is that it is duplicated.
	Count int
}

// Error returns e.g. `field "model" is a number, want a string`.
func (e *FieldError) Error() string {
	return fmt.Sprintf("field %q %s", e.Field, e.Problem)
}

// Is reports whether target is ErrInvalidField.
func (e *FieldError) Is(target error) bool {
	return target == ErrInvalidField
}

// Strings returns the values of the named top-level fields of the JSON object body.
// A name absent from the object, or whose value is null, is absent from the map.
//
// body must be a single valid JSON value, optionally surrounded by whitespace
// (else the error wraps ErrNotJSON), and that value must be an object (else
// ErrNotObject). Field names are compared after unescaping, under Unicode
// simple case folding (as bytes.EqualFold, and so encoding/json, compares
// them): "MODEL" is the field model. A named field that appears more than
// once at the top level, however spelt, or whose value is not a string or
// null, is a *FieldError
// (for the first such name in names); fields not named, and fields nested
// inside other values, are not looked at.
// Values are returned unescaped, with invalid UTF-8 replaced by U+FFFD as
// encoding/json does.
func Strings(body []byte, names []string) (map[string]string, error) {
	if !valid(body) {
		return nil, notJSON(body)
	}
	i := skipSpace(body, 0)
	if body[i] != '{' {
		return nil, ErrNotObject
	}
	var buf [8]match
	found := buf[:0]
	for _, name := range names {
		found = append(found, match{name: name})
	}
	scanObject(body, i, found)
	return values(found)
}

// notJSON returns the error for a body that is not valid JSON, saying where it
// broke.
func notJSON(body []byte) error {
	var raw json.RawMessage
	var syn *json.SyntaxError
	if err := json.Unmarshal(body, &raw); errors.As(err, &syn) {
		return fmt.Errorf("%w: at byte %d: %w", ErrNotJSON, syn.Offset, syn)
	}
	return ErrNotJSON
}

// match is what a scan found of one named field.
type match struct {
	name  string
	count int    // top-level members with this name
	value []byte // the first such member's value token
}

// scanObject walks the members of the valid JSON object starting at body[i]
// ('{'), recording in found each member whose name is there.
func scanObject(body []byte, i int, found []match) {
	var name, scratch []byte
	i = skipSpace(body, i+1)
	if body[i] == '}' {
		return
	}
	for {
		end := endOfString(body, i)
		if len(found) > 0 {
			name, scratch = memberName(body[i:end], scratch)
		}
		i = skipSpace(body, end)      // at ':'
		start := skipSpace(body, i+1) // at the value
		i = skipValue(body, start)    // just after it
		record(found, name, body[start:i])
		i = skipSpace(body, i) // at ',' or '}'
		if body[i] == '}' {
			return
		}
		i = skipSpace(body, i+1) // at the next name
	}
}

// memberName returns the name the valid JSON string token key spells: the
// bytes between its quotes or, if unescaping would change them, key unescaped
// into scratch (which it returns, perhaps grown, for reuse).
func memberName(key, scratch []byte) (name, scratchOut []byte) {
	if needsUnquote(key) {
		scratch = appendUnquoted(scratch[:0], key)
		return scratch, scratch
	}
	return key[1 : len(key)-1], scratch
}

// record counts the member with name name and value token value against
// each entry of found with that name in any case.
func record(found []match, name, value []byte) {
	for j := range found {
		if m := &found[j]; equalFold(name, m.name) {
			if m.count == 0 {
				m.value = value
			}
			m.count++
		}
	}
}

// values turns what the scan found into Strings' result, or the first named
// field's problem.
func values(found []match) (map[string]string, error) {
	out := make(map[string]string, len(found))
	for _, m := range found {
		if m.count > 1 {
			return nil, &FieldError{Field: m.name, Count: m.count, Problem: fmt.Sprintf(
				"appears %d times in the body, spellings in other cases included; JSON parsers disagree on which one counts "+
					"(Go and Python take the last, others the first), so the limiter takes neither",
				m.count)}
		}
		if m.count == 0 {
			continue
		}
		switch kind := kindOf(m.value); kind {
		case "string":
			s, err := unquote(m.value)
			if err != nil {
				return nil, err
			}
			out[m.name] = s
		case "null":
		default:
			return nil, &FieldError{Field: m.name, Problem: "is " + kind + ", want a string"}
		}
	}
	return out, nil
}

// kindOf names the type of the valid JSON value token v, with an article
// where Problem wants one.
func kindOf(v []byte) string {
	switch v[0] {
	case '"':
		return "string"
	case 'n':
		return "null"
	case 't', 'f':
		return "a boolean"
	case '{':
		return "an object"
	case '[':
		return "an array"
	default:
		return "a number"
	}
}

// equalFold reports whether the name b and s are equal under Unicode simple
// case folding, as bytes.EqualFold has it, without converting either.
func equalFold(b []byte, s string) bool {
	for len(b) > 0 && len(s) > 0 {
		var r, q rune
		if c, d := b[0], s[0]; c < utf8.RuneSelf && d < utf8.RuneSelf {
			b, s = b[1:], s[1:]
			if c == d {
				continue
			}
			r, q = rune(c), rune(d)
		} else {
			var n, m int
			r, n = utf8.DecodeRune(b)
			q, m = utf8.DecodeRuneInString(s)
			b, s = b[n:], s[m:]
			if r == q {
				continue
			}
		}
		if q < r {
			r, q = q, r
		}
		// unicode.SimpleFold walks the runes that fold to r upwards, then
		// wraps round to the least of them.
		f := unicode.SimpleFold(r)
		for f != r && f < q {
			f = unicode.SimpleFold(f)
		}
		if f != q {
			return false
		}
	}
	return len(b) == 0 && len(s) == 0
}

// needsUnquote reports whether the value of the valid JSON string token tok
// differs from the bytes between its quotes: it has an escape, or invalid
// UTF-8 that decoding replaces with U+FFFD.
func needsUnquote(tok []byte) bool {
	return bytes.IndexByte(tok, '\\') >= 0 || !utf8.Valid(tok)
}

// unquote returns the value of the valid JSON string token tok, decoded by
// encoding/json unless it is the bytes between the quotes.
func unquote(tok []byte) (string, error) {
	if !needsUnquote(tok) {
		return string(tok[1 : len(tok)-1]), nil
	}
	var s string
	if err := json.Unmarshal(tok, &s); err != nil {
		// Cannot happen: tok is a string token of a valid body.
		return "", fmt.Errorf("%w: string %.40q: %w", ErrNotJSON, tok, err)
	}
	return s, nil
}

// appendUnquoted appends the value of the valid JSON string token tok to dst,
// decoding it as encoding/json does (invalid UTF-8 and unpaired surrogates
// become U+FFFD) but without allocating for every member name a hostile body
// escapes.
func appendUnquoted(dst, tok []byte) []byte {
	s := tok[1 : len(tok)-1]
	for i := 0; i < len(s); {
		var r rune
		switch c := s[i]; {
		case c == '\\':
			r, i = unescape(s, i)
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			i++
			continue
		default:
			var size int
			r, size = utf8.DecodeRune(s[i:])
			i += size
		}
		dst = utf8.AppendRune(dst, r)
	}
	return dst
}

// unescape decodes the escape sequence at s[i] ('\\') of the contents s of a
// valid JSON string, returning its rune and the index just after it.
func unescape(s []byte, i int) (rune, int) {
	switch c := s[i+1]; c {
	case 'b':
		return '\b', i + 2
	case 'f':
		return '\f', i + 2
	case 'n':
		return '\n', i + 2
	case 'r':
		return '\r', i + 2
	case 't':
		return '\t', i + 2
	case 'u':
		r := hex4(s[i+2 : i+6])
		if !utf16.IsSurrogate(r) {
			return r, i + 6
		}
		if i+12 <= len(s) && s[i+6] == '\\' && s[i+7] == 'u' {
			if pair := utf16.DecodeRune(r, hex4(s[i+8:i+12])); pair != utf8.RuneError {
				return pair, i + 12
			}
		}
		return utf8.RuneError, i + 6
	default: // '"', '\\' or '/'
		return rune(c), i + 2
	}
}

// hex4 returns the value of the four hex digits h.
func hex4(h []byte) rune {
	var r rune
	for _, c := range h {
		switch {
		case c <= '9':
			c -= '0'
		case c <= 'F':
			c -= 'A' - 10
		default:
			c -= 'a' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// skipSpace returns the index of the first non-whitespace byte of body at or
// after i, or len(body).
func skipSpace(body []byte, i int) int {
	for i < len(body) {
		switch body[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// skipValue returns the index just after the valid JSON value starting at
// body[i].
func skipValue(body []byte, i int) int {
	switch body[i] {
	case '"':
		return endOfString(body, i)
	case '{', '[':
		return endOfContainer(body, i)
	default:
		return endOfScalar(body, i)
	}
}

// endOfString returns the index just after the valid JSON string starting at
// body[i] ('"').
func endOfString(body []byte, i int) int {
	i++
	for {
		q := bytes.IndexByte(body[i:], '"')
		i += q
		if !escaped(body, i) {
			return i + 1
		}
		i++
	}
}

// escaped reports whether the quote at body[i], inside a valid JSON string,
// is escaped: preceded by an odd run of backslashes.
func escaped(body []byte, i int) bool {
	n := 0
	for body[i-1-n] == '\\' {
		n++
	}
	return n%2 == 1
}

// endOfContainer returns the index just after the valid JSON object or array
// starting at body[i]. It counts brackets rather than recursing, so nesting
// depth costs no stack.
func endOfContainer(body []byte, i int) int {
	depth := 0
	for {
		switch body[i] {
		case '"':
			i = endOfString(body, i)
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
		i++
	}
}

// endOfScalar returns the index just after the number, true, false or null
// starting at body[i].
func endOfScalar(body []byte, i int) int {
	for i < len(body) {
		switch body[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}
