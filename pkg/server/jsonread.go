package server

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// jsonReader reads the request bodies of the API in one pass, strictly.
// Every body is an object whose fields are strings (or null), or, for a
// batch, an array of such objects, so it knows just that much JSON. It
// refuses what encoding/json refuses with DisallowUnknownFields, and what
// encoding/json lets through silently: a field name that matches only
// case-insensitively ("USER_ID") and a field given twice (the last would
// win). Either would let two different bodies mean the same request.
//
// Strings come back as substrings of s (no copy) unless they hold
// escapes; unescaping follows encoding/json, a lone surrogate included
// (it becomes U+FFFD).
type jsonReader struct {
	s   string // the whole body, valid UTF-8
	pos int    // the next byte to read
}

// stringFields names the string fields of one object type, in the order
// its destinations are given. At most 64.
type stringFields []string

// index returns the field named exactly name, or -1.
func (f stringFields) index(name string) int {
	for i, n := range f {
		if n == name {
			return i
		}
	}
	return -1
}

// fieldPath names a field in messages: name at the top level (at < 0),
// "slots[3].name" in the at'th object of the slots array.
func fieldPath(at int, name string) string {
	if at < 0 {
		return name
	}
	return "slots[" + strconv.Itoa(at) + "]." + name
}

func (d *jsonReader) skipSpace() {
	for d.pos < len(d.s) {
		switch d.s[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

// peek returns the next byte, 0 at the end.
func (d *jsonReader) peek() byte {
	if d.pos < len(d.s) {
		return d.s[d.pos]
	}
	return 0
}

// syntaxError describes the byte at pos, found where context says.
func (d *jsonReader) syntaxError(context string) error {
	if d.pos >= len(d.s) {
		return badRequest("request body is truncated JSON")
	}
	r, _ := utf8.DecodeRuneInString(d.s[d.pos:])
	return badRequest("request body is not valid JSON at byte %d: invalid character %s %s", d.pos+1, quoteChar(r), context)
}

// quoteChar formats a character as encoding/json's syntax errors do.
func quoteChar(r rune) string {
	switch r {
	case '\'':
		return `'\''`
	case '"':
		return `'"'`
	}
	s := strconv.Quote(string(r))
	return "'" + s[1:len(s)-1] + "'"
}

// expect consumes c (after optional whitespace), or fails naming context.
func (d *jsonReader) expect(c byte, context string) error {
	d.skipSpace()
	if d.peek() != c {
		return d.syntaxError(context)
	}
	d.pos++
	return nil
}

// typeError refuses the value at pos, given for path where want was due;
// null is never refused.
func (d *jsonReader) typeError(path, want string) error {
	got := ""
	rest := d.s[d.pos:]
	switch c := d.peek(); {
	case c == '"':
		got = "string"
	case c == '{':
		got = "object"
	case c == '[':
		got = "array"
	case strings.HasPrefix(rest, "true"), strings.HasPrefix(rest, "false"):
		got = "bool"
	case c == '-' || (c >= '0' && c <= '9'):
		got = "number"
	case strings.HasPrefix(rest, "null"):
		got = "null"
	default:
		return d.syntaxError("looking for beginning of value")
	}
	return badRequest("field %q must be %s, got %s", path, want, got)
}

// null consumes the literal null, if that is what comes next.
func (d *jsonReader) null() (bool, error) {
	if d.peek() != 'n' {
		return false, nil
	}
	if !strings.HasPrefix(d.s[d.pos:], "null") {
		for i := 1; i < 4; i++ {
			if d.pos+i >= len(d.s) {
				d.pos = len(d.s)
				return false, d.syntaxError("")
			}
			if d.s[d.pos+i] != "null"[i] {
				d.pos += i
				return false, d.syntaxError(fmt.Sprintf("in literal null (expecting %s)", quoteChar(rune("null"[i]))))
			}
		}
	}
	d.pos += 4
	return true, nil
}

// str reads the string at pos (its opening quote).
func (d *jsonReader) str() (string, error) {
	start := d.pos + 1
	for i := start; i < len(d.s); i++ {
		switch c := d.s[i]; {
		case c == '"':
			d.pos = i + 1
			return d.s[start:i], nil
		case c == '\\':
			return d.unescape(start, i)
		case c < 0x20:
			d.pos = i
			return "", d.syntaxError("in string literal")
		}
	}
	d.pos = len(d.s)
	return "", d.syntaxError("")
}

// unescape reads the rest of a string that opened at start and holds an
// escape at esc, as encoding/json unquotes it.
func (d *jsonReader) unescape(start, esc int) (string, error) {
	b := make([]byte, 0, esc-start+16)
	b = append(b, d.s[start:esc]...)
	i := esc
	for i < len(d.s) {
		c := d.s[i]
		switch {
		case c == '"':
			d.pos = i + 1
			return string(b), nil
		case c < 0x20:
			d.pos = i
			return "", d.syntaxError("in string literal")
		case c != '\\':
			b = append(b, c)
			i++
			continue
		}
		if i+1 >= len(d.s) {
			d.pos = len(d.s)
			return "", d.syntaxError("")
		}
		switch e := d.s[i+1]; e {
		case '"', '\\', '/':
			b = append(b, e)
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'u':
			r, ok := d.hex4(i + 2)
			if !ok {
				return "", d.syntaxError("in \\u hexadecimal character escape")
			}
			i += 6
			if utf16.IsSurrogate(r) {
				// A high surrogate followed by a low one is one character;
				// anything else, U+FFFD in its place.
				if r2, ok := d.hex4(i + 2); ok && i+1 < len(d.s) && d.s[i] == '\\' && d.s[i+1] == 'u' {
					if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
						i += 6
						b = utf8.AppendRune(b, dec)
						continue
					}
				}
				r = utf8.RuneError
			}
			b = utf8.AppendRune(b, r)
			continue
		default:
			d.pos = i + 1
			return "", d.syntaxError("in string escape code")
		}
		i += 2
	}
	d.pos = len(d.s)
	return "", d.syntaxError("")
}

// hex4 reads the 4 hex digits at i, setting pos to the first bad one when
// they are not.
func (d *jsonReader) hex4(i int) (rune, bool) {
	var r rune
	for j := i; j < i+4; j++ {
		if j >= len(d.s) {
			d.pos = len(d.s)
			return 0, false
		}
		c := d.s[j]
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			d.pos = j
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// key reads an object's next field name and the colon after it.
func (d *jsonReader) key() (string, error) {
	d.skipSpace()
	if d.peek() != '"' {
		return "", d.syntaxError("looking for beginning of object key string")
	}
	name, err := d.str()
	if err != nil {
		return "", err
	}
	if err := d.expect(':', "after object key"); err != nil {
		return "", err
	}
	d.skipSpace()
	return name, nil
}

// fields reads the object at pos (its '{'), calling field for each field
// with its index in names, once the name and colon are read; field reads
// the value. Unknown and repeated names are refused; at places the object
// for messages (fieldPath).
func (d *jsonReader) fields(names stringFields, at int, field func(i int, name string) error) error {
	var seen uint64
	return d.members(func(name string) error {
		i := names.index(name)
		switch {
		case i < 0:
			return badRequest("request body: unknown field %q", fieldPath(at, name))
		case seen&(1<<i) != 0:
			return badRequest("request body: field %q is given twice", fieldPath(at, name))
		}
		seen |= 1 << i
		return field(i, name)
	})
}

// members reads the object at pos (its '{'), calling member for each
// member once its name and colon are read; member reads the value.
func (d *jsonReader) members(member func(name string) error) error {
	d.pos++ // '{'
	d.skipSpace()
	if d.peek() == '}' {
		d.pos++
		return nil
	}
	for {
		name, err := d.key()
		if err != nil {
			return err
		}
		if err := member(name); err != nil {
			return err
		}
		d.skipSpace()
		switch d.peek() {
		case ',':
			d.pos++
		case '}':
			d.pos++
			return nil
		default:
			return d.syntaxError("after object key:value pair")
		}
	}
}

// stringObject reads an object of string fields: the value of names[i]
// into *dst[i]. A null leaves it empty.
func (d *jsonReader) stringObject(names stringFields, dst []*string, at int) error {
	return d.fields(names, at, func(i int, name string) error {
		if d.peek() == '"' {
			// The usual case, read without naming the field: its path
			// ("slots[3].stream_id") is built only for a message.
			s, err := d.str()
			*dst[i] = s
			return err
		}
		return d.stringValue(fieldPath(at, name), dst[i])
	})
}

// stringValue reads the string value at pos, of the field at path, into
// *dst. A null leaves it empty.
func (d *jsonReader) stringValue(path string, dst *string) error {
	if d.peek() == '"' {
		s, err := d.str()
		*dst = s
		return err
	}
	if isNull, err := d.null(); isNull || err != nil {
		return err
	}
	return d.typeError(path, "a string")
}

// intValue reads the whole number at pos, of the field at path, into
// *dst (see integer). A null leaves it 0.
func (d *jsonReader) intValue(path string, dst *int64) error {
	if isNull, err := d.null(); isNull || err != nil {
		return err
	}
	if c := d.peek(); c != '-' && (c < '0' || c > '9') {
		return d.typeError(path, "a whole number")
	}
	n, err := d.integer(path)
	if err != nil {
		return err
	}
	*dst = n
	return nil
}

// integer reads the number at pos as a whole number for the field at
// path, as encoding/json reads one into an int64: a fraction or an
// exponent is refused, as is a value past int64.
func (d *jsonReader) integer(path string) (int64, error) {
	start := d.pos
	i := start
	if i < len(d.s) && d.s[i] == '-' {
		i++
	}
	digits := i
	for i < len(d.s) && d.s[i] >= '0' && d.s[i] <= '9' {
		i++
	}
	switch {
	case i == digits:
		d.pos = i
		return 0, d.syntaxError("in numeric literal")
	case d.s[digits] == '0' && i-digits > 1:
		d.pos = digits + 1
		return 0, d.syntaxError("after object key:value pair")
	}
	if i < len(d.s) && (d.s[i] == '.' || d.s[i] == 'e' || d.s[i] == 'E') {
		return 0, badRequest("field %q must be a whole number", path)
	}
	d.pos = i
	n, err := strconv.ParseInt(d.s[start:i], 10, 64)
	if err != nil {
		return 0, newRangeError(path, d.s[start:i])
	}
	return n, nil
}

// rangeError is a whole number of a request body too large for 64 bits:
// 400 invalid_request, as the requestError it wraps says. The handler that
// knows the field's bound answers with the bound instead (OutOfRange).
type rangeError struct {
	requestError
	field  string // the field's path (fieldPath)
	number string // as sent, cut at maxShownDigits
}

func (e *rangeError) Unwrap() error { return &e.requestError }

// maxShownDigits bounds the digits of a number a message repeats.
const maxShownDigits = 20

func newRangeError(field, number string) *rangeError {
	if len(number) > maxShownDigits+1 {
		number = number[:maxShownDigits+1]
		if number[0] != '-' {
			number = number[:maxShownDigits]
		}
		number += "…"
	}
	return &rangeError{
		requestError: requestError{msg: fmt.Sprintf("field %q is out of range: %s does not fit in a 64-bit integer", field, number)},
		field:        field,
		number:       number,
	}
}

// end refuses anything but whitespace after the top-level value.
func (d *jsonReader) end() error {
	d.skipSpace()
	if d.pos < len(d.s) {
		return badRequest("request body holds data after the JSON object")
	}
	return nil
}
