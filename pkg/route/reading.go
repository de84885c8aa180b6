package route

import "strings"

// A reading is one way a server may turn a request path into the
// segments it routes on. Each flag is a choice servers make differently;
// the segments are always percent-decoded once, as every server decodes
// them (so %2e%2e is a dot-dot and %63hat is chat), never twice (no
// server this sits in front of decodes %252F into a slash).
type reading uint8

const (
	// decodeFirst decodes the whole path before splitting it, so that %2F
	// separates segments (uvicorn, nginx's location matching); without
	// it %2F is a character of its segment, as RFC 3986 has it.
	decodeFirst reading = 1 << iota
	// backslash takes a backslash for a slash (IIS, servers on Windows).
	backslash
	// params cuts each segment at its first ";" (path parameters:
	// Tomcat, Jetty, Spring), so /..;/ is a dot-dot.
	params
	// keepDots routes on "." and ".." as on any other segment (a server
	// that does not normalize, behind a prefix router); without it they
	// are resolved, never above the root.
	keepDots
	// keepEmpty keeps the empty segment between two slashes (no slash
	// merging, so /a//.. is /a/); without it slashes are merged.
	keepEmpty
	// trimEnds cuts the dots and spaces a segment ends with (IIS, servers
	// on Windows, where no file name ends in either), so that
	// /v1/chat/completions. and /v1/chat/completions%20 are the route; a
	// segment of dots and spaces alone ("." and ".." too) stays as it is.
	trimEnds
	// finalNewline drops one newline the path ends with, once decoded:
	// Starlette (FastAPI, vLLM's OpenAI server) routes by Python regular
	// expressions ending in "$", which matches before a final newline too,
	// so that /v1/chat/completions%0A is its chat route. A newline
	// anywhere else, or a second one, routes nowhere there.
	finalNewline

	everyChoice = decodeFirst | backslash | params | keepDots | keepEmpty | trimEnds | finalNewline
)

// choicesOf returns the choices worth trying on path: those that act on
// a character it holds. Every combination of them is a reading to try; a
// path of plain segments, as nearly every request has, has one.
func choicesOf(path string) reading {
	if strings.IndexByte(path, '%') >= 0 {
		return everyChoice // an encoded byte may be any of the others
	}
	var choices reading
	if strings.IndexByte(path, '\\') >= 0 {
		choices |= backslash | keepEmpty
	}
	if strings.IndexByte(path, ';') >= 0 {
		choices |= params | keepEmpty
	}
	if strings.IndexByte(path, '.') >= 0 {
		choices |= keepDots | trimEnds
	}
	if strings.IndexByte(path, ' ') >= 0 {
		choices |= trimEnds
	}
	if strings.Contains(path, "//") {
		choices |= keepEmpty
	}
	return choices
}

// segments reads path as rd does.
func (rd reading) segments(path string) []string {
	if rd&decodeFirst != 0 {
		path = decode(path)
	}
	slashes := "/"
	if rd&backslash != 0 {
		slashes = `/\`
	}
	// The leading slash starts the path; it ends no empty segment.
	if path != "" && strings.IndexByte(slashes, path[0]) >= 0 {
		path = path[1:]
	}
	out := make([]string, 0, strings.Count(path, "/")+1)
	for {
		seg, rest, more := cutAny(path, slashes)
		if rd&params != 0 {
			seg, _, _ = strings.Cut(seg, ";")
		}
		if rd&decodeFirst == 0 {
			seg = decode(seg)
		}
		if rd&finalNewline != 0 && !more {
			seg = strings.TrimSuffix(seg, "\n")
		}
		if rd&trimEnds != 0 {
			if name := strings.TrimRight(seg, ". "); name != "" {
				seg = name
			}
		}
		switch {
		case rd&keepDots == 0 && seg == ".":
		case rd&keepDots == 0 && seg == "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
		case seg == "" && rd&keepEmpty == 0:
		default:
			out = append(out, seg)
		}
		if !more {
			return out
		}
		path = rest
	}
}

// cutAny cuts s around the first of the bytes in seps.
func cutAny(s, seps string) (before, after string, found bool) {
	if i := strings.IndexAny(s, seps); i >= 0 {
		return s[:i], s[i+1:], true
	}
	return s, "", false
}

// decode percent-decodes s, leaving a "%" that starts no valid escape as
// it is (net/http refuses such a path; Envoy may pass it on).
func decode(s string) string {
	i := strings.IndexByte(s, '%')
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	b.WriteString(s[:i])
	for ; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			b.WriteByte(unhex(s[i+1])<<4 | unhex(s[i+2]))
			i += 2
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}
