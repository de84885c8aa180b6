package jsonfield_test

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/joishi/limiter/pkg/jsonfield"
)

// notJSON reports whether Strings refuses body as not JSON.
func notJSON(body []byte) bool {
	_, err := jsonfield.Strings(body, model)
	return errors.Is(err, jsonfield.ErrNotJSON)
}

// TestStringsTellsJSONAsEncodingJSONDoes: Strings refuses a body as not
// JSON exactly when json.Valid does: on each of JSON's edges (escapes,
// control characters, numbers, literals, nesting, trailing bytes), at
// encoding/json's nesting bound and one past it, and on 30,000 bodies a
// few bytes away from valid ones.
func TestStringsTellsJSONAsEncodingJSONDoes(t *testing.T) {
	edges := []string{
		``, ` `, `{}`, ` {} `, `{`, `}`, `{}}`, `{}{}`, `{} x`, `[]`, `[`, `[1,]`, `[,1]`, `[1 2]`,
		`{"a":1,}`, `{,}`, `{"a"}`, `{"a":}`, `{"a" 1}`, `{a:1}`, `{"a":1 "b":2}`, `{"a":[}`, `{"a":{]}`,
		`"x"`, `"x`, `"\"`, `"\\"`, `"\/\b\f\n\r\t"`, `"\u00e9"`, `"\u00E9"`, `"\u00g9"`, `"\u00e"`, `"\x"`, `"\'"`,
		"\"a\tb\"", "\"a\x1fb\"", "\"a\x7fb\"", "\"\xff\xfe\"", "\"\xe9\"", "\xef\xbb\xbf{}", "\"a\x00\"",
		`0`, `-0`, `00`, `01`, `-`, `-a`, `1.`, `1.5`, `.5`, `1e5`, `1E+5`, `1e-5`, `1e`, `1e+`, `1.5e5`, `+1`, `0x1`, `1.e5`,
		`-01`, `1.5.5`, `NaN`, `Infinity`, `true`, `tru`, `truex`, `false`, `fals`, `null`, `nul`, `nulll`, `True`,
		"{\"a\":1}\n", "\t[1,\r\n2]", "[1,\v2]", "[1,\f2]", `{"a":1}` + "\x00",
	}
	for _, body := range edges {
		if got, want := notJSON([]byte(body)), !json.Valid([]byte(body)); got != want {
			t.Errorf("%q: refused as not JSON %t, json.Valid %t", body, got, !want)
		}
	}

	// encoding/json lets values nest 10,000 deep, not 10,001.
	for _, depth := range []int{9999, 10000, 10001} {
		for _, body := range []string{
			`{"a":` + strings.Repeat(`[`, depth-1) + strings.Repeat(`]`, depth-1) + `}`,
			`{"a":` + strings.Repeat(`[`, depth-1) + `1` + strings.Repeat(`]`, depth-1) + `}`,
			strings.Repeat(`{"a":`, depth) + `1` + strings.Repeat(`}`, depth),
		} {
			if got, want := notJSON([]byte(body)), !json.Valid([]byte(body)); got != want {
				t.Errorf("nested %d deep (%.20s...): refused as not JSON %t, json.Valid %t", depth, body, got, !want)
			}
		}
	}

	// Bodies a few bytes away from valid ones: replaced, dropped, doubled.
	seeds := [][]byte{chatBody(2000), deepBody(20), []byte(`{"model":"m","n":[-1.5e+3,0,true,false,null,{"a":"\u00e9\\"}]}`)}
	special := []byte("{}[]\",:\\ \t\n\x00\x1f0123456789-+.eEtrufalsn\xff")
	rng := rand.New(rand.NewPCG(1, 2))
	var refused int
	for n := range 30000 {
		body := append([]byte(nil), seeds[n%len(seeds)]...)
		for range 1 + rng.IntN(3) {
			at := rng.IntN(len(body))
			switch rng.IntN(3) {
			case 0:
				body[at] = special[rng.IntN(len(special))]
			case 1:
				body = append(body[:at], body[at+1:]...)
			default:
				body = append(body[:at+1], body[at:]...)
			}
		}
		got, want := notJSON(body), !json.Valid(body)
		if got != want {
			t.Fatalf("%q: refused as not JSON %t, json.Valid %t", body, got, !want)
		}
		if got {
			refused++
		}
	}
	if refused < 10000 || refused > 29000 {
		t.Errorf("of 30,000 changed bodies %d are not JSON: the changes do not test both ways", refused)
	}
}
