package jsonfield

import "bytes"

// maxDepth is how deep encoding/json lets objects and arrays nest: a body
// nested deeper is not valid to it, nor so to valid.
const maxDepth = 10000

// valid reports whether body is one JSON value, optionally surrounded by
// whitespace: what json.Valid reports, strings of invalid UTF-8 accepted
// as it accepts them, in one pass that looks at each byte of a string
// once, not through a state machine's step a byte (2-3 times as fast on a
// chat request, whose bytes are mostly its messages' strings).
func valid(body []byte) bool {
	var stack [64]byte
	open := stack[:0] // the containers the next value is inside: '{' or '['
	i := skipSpace(body, 0)
	for {
		// A value starts at i: a container opens, or a scalar ends.
		switch {
		case i < len(body) && (body[i] == '{' || body[i] == '['):
			if len(open) == maxDepth {
				return false
			}
			c := body[i]
			if i = skipSpace(body, i+1); i < len(body) && body[i] == closer(c) {
				i++ // empty
				break
			}
			open = append(open, c)
			if c == '{' {
				if i = pastName(body, i); i < 0 {
					return false
				}
			}
			continue
		default:
			if i = endOfValidScalar(body, i); i < 0 {
				return false
			}
		}
		// A value ended at i: it closes containers, or another follows.
		for {
			i = skipSpace(body, i)
			if len(open) == 0 {
				return i == len(body)
			}
			if i == len(body) {
				return false
			}
			top := open[len(open)-1]
			if body[i] == closer(top) {
				open = open[:len(open)-1]
				i++
				continue
			}
			if body[i] != ',' {
				return false
			}
			if i = skipSpace(body, i+1); top == '{' {
				if i = pastName(body, i); i < 0 {
					return false
				}
			}
			break
		}
	}
}

// closer is the byte that closes the container c opens: '}' for '{', ']'
// for '['.
func closer(c byte) byte { return c + 2 }

// pastName returns the index of the value of the object member whose name
// starts at body[i] (its string, whitespace, ':' and whitespace), or -1 if
// no valid member name and colon start there.
func pastName(body []byte, i int) int {
	if i >= len(body) || body[i] != '"' {
		return -1
	}
	if i = endOfValidString(body, i); i < 0 {
		return -1
	}
	if i = skipSpace(body, i); i >= len(body) || body[i] != ':' {
		return -1
	}
	return skipSpace(body, i+1)
}

// endOfValidScalar returns the index just after the string, number, true,
// false or null starting at body[i], or -1 if none valid starts there.
func endOfValidScalar(body []byte, i int) int {
	if i >= len(body) {
		return -1
	}
	switch body[i] {
	case '"':
		return endOfValidString(body, i)
	case 't':
		return endOfLiteral(body, i, "true")
	case 'f':
		return endOfLiteral(body, i, "false")
	case 'n':
		return endOfLiteral(body, i, "null")
	default:
		return endOfNumber(body, i)
	}
}

func endOfLiteral(body []byte, i int, lit string) int {
	if !bytes.HasPrefix(body[i:], []byte(lit)) {
		return -1
	}
	return i + len(lit)
}

// endOfValidString returns the index just after the string starting at
// body[i] ('"'), or -1 if it is not a valid JSON string: it ends, every
// escape is one JSON has, and no byte in it is a control character.
func endOfValidString(body []byte, i int) int {
	for i++; i < len(body); {
		switch c := body[i]; {
		case c == '"':
			return i + 1
		case c == '\\':
			if i+1 >= len(body) {
				return -1
			}
			switch body[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(body) || !isHex(body[i+2]) || !isHex(body[i+3]) || !isHex(body[i+4]) || !isHex(body[i+5]) {
					return -1
				}
				i += 6
			default:
				return -1
			}
		case c < 0x20:
			return -1
		default:
			i++
		}
	}
	return -1
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// endOfNumber returns the index just after the JSON number starting at
// body[i], or -1 if none starts there: an optional minus, 0 or digits not
// led by 0, then optionally a fraction and an exponent.
func endOfNumber(body []byte, i int) int {
	if i < len(body) && body[i] == '-' {
		i++
	}
	switch {
	case i < len(body) && body[i] == '0':
		i++
	case i < len(body) && '1' <= body[i] && body[i] <= '9':
		i = endOfDigits(body, i)
	default:
		return -1
	}
	if i < len(body) && body[i] == '.' {
		if i = endOfDigits(body, i+1); i < 0 {
			return -1
		}
	}
	if i < len(body) && (body[i] == 'e' || body[i] == 'E') {
		i++
		if i < len(body) && (body[i] == '+' || body[i] == '-') {
			i++
		}
		if i = endOfDigits(body, i); i < 0 {
			return -1
		}
	}
	return i
}

// endOfDigits returns the index just after the one or more digits starting
// at body[i], or -1 if there are none.
func endOfDigits(body []byte, i int) int {
	start := i
	for i < len(body) && '0' <= body[i] && body[i] <= '9' {
		i++
	}
	if i == start {
		return -1
	}
	return i
}
