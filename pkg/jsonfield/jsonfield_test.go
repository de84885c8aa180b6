package jsonfield_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/joishi/limiter/pkg/jsonfield"
)

// dupProblem is FieldError.Problem for a field appearing n times.
func dupProblem(n int) string {
	return fmt.Sprintf("appears %d times in the body, spellings in other cases included; JSON parsers disagree on which one counts "+
		"(Go and Python take the last, others the first), so the limiter takes neither", n)
}

// chatBody is an OpenAI-style chat request of about size bytes: a messages
// array (whose entries hide "model" keys, nested at depth, and strings full of
// escaped quotes, backslashes and brackets) followed by the model field.
func chatBody(size int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"messages":[`)
	for i := 0; b.Len() < size; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"role":"user","content":"message %d: say \"hi\" {not an object} [nor an array] \\ \\\" \u00e9 and some more prose to pad the string out a little further",`+
			`"metadata":{"model":"nested-%d","tools":[{"model":{"model":[1,2,{"model":"deep"}]}}]}}`, i, i)
	}
	b.WriteString(`],"stream":true,"temperature":0.7,"model":"gpt-4o"}`)
	return b.Bytes()
}

// deepBody has the model field after a value nested depth arrays deep.
func deepBody(depth int) []byte {
	return []byte(`{"a":` + strings.Repeat(`[`, depth) + `"]}\"[{"` + strings.Repeat(`]`, depth) +
		`,"model":"m"}`)
}

type testCase struct {
	name    string
	body    string
	names   []string
	want    map[string]string // when err, problem and field are empty
	err     error             // errors.Is target
	field   string            // FieldError.Field
	problem string            // FieldError.Problem
}

var model = []string{"model"}

var tests = []testCase{
	// Finding values.
	{name: "simple", body: `{"model":"gpt-4o","stream":true}`, names: model, want: map[string]string{"model": "gpt-4o"}},
	{name: "absent", body: `{"stream":true}`, names: model, want: map[string]string{}},
	{name: "null is absent", body: `{"model":null}`, names: model, want: map[string]string{}},
	{name: "empty string is present", body: `{"model":""}`, names: model, want: map[string]string{"model": ""}},
	{name: "empty object", body: `{}`, names: model, want: map[string]string{}},
	{name: "empty object with space", body: " { \n } ", names: model, want: map[string]string{}},
	{name: "no names", body: `{"model":"m"}`, names: nil, want: map[string]string{}},
	{name: "name listed twice", body: `{"model":"m"}`, names: []string{"model", "model"}, want: map[string]string{"model": "m"}},
	{name: "empty name", body: `{"":"e","model":"m"}`, names: []string{""}, want: map[string]string{"": "e"}},
	{
		name: "several names", body: `{"user":"u","x":[1,{"y":2}],"model":"m","n":-1.5e3,"t":true,"f":false,"z":null}`,
		names: []string{"model", "user", "missing", "z"}, want: map[string]string{"model": "m", "user": "u"},
	},
	{
		name: "whitespace everywhere", body: "\r\n\t {\n \"x\" \t:\r [ 1 , { \"model\" : 2 } , true ] ,\n\t\"model\"\n:\n\"m\"\t,\"n\" : 1 \n}\n\t ",
		names: model, want: map[string]string{"model": "m"},
	},
	{name: "scalar value last", body: `{"model":"m","n":12}`, names: model, want: map[string]string{"model": "m"}},

	// Names are compared after unescaping, in any case (as encoding/json
	// matches a member to a field).
	{name: "escaped name", body: `{"mod\u0065l":"m"}`, names: model, want: map[string]string{"model": "m"}},
	{name: "escaped name upper hex", body: `{"\u006D\u006F\u0064\u0065\u006C":"m"}`, names: model, want: map[string]string{"model": "m"}},
	{name: "escaped solidus in name", body: `{"a\/b":"m"}`, names: []string{"a/b"}, want: map[string]string{"a/b": "m"}},
	{name: "capitals", body: `{"MODEL":"m"}`, names: model, want: map[string]string{"model": "m"}},
	{name: "escaped other case", body: `{"\u004dodel":"m"}`, names: model, want: map[string]string{"model": "m"}},
	{name: "a name in capitals finds the field in lower case", body: `{"model":"m"}`, names: []string{"MODEL"}, want: map[string]string{"MODEL": "m"}},
	{name: "Kelvin sign is k", body: `{"\u212aey":"v"}`, names: []string{"key"}, want: map[string]string{"key": "v"}},
	{name: "long s is s", body: "{\"\u017ftream\":\"v\"}", names: []string{"stream"}, want: map[string]string{"stream": "v"}},
	{name: "final sigma is sigma", body: `{"ΜΟΝΤΈΛΟΣ":"v"}`, names: []string{"μοντέλος"}, want: map[string]string{"μοντέλος": "v"}},
	{name: "folding keeps letters apart", body: "{\"mode\u017f\":\"x\",\"modei\":\"y\",\"mode\u0130\":\"z\"}", names: []string{"model", "modes"}, want: map[string]string{"modes": "x"}},
	{name: "a longer or shorter name is another", body: `{"MODELS":"x","MODE":"y"}`, names: model, want: map[string]string{}},
	{name: "two names in two cases both find it", body: `{"Model":"m"}`, names: []string{"model", "MODEL"}, want: map[string]string{"model": "m", "MODEL": "m"}},
	{name: "escaped quote in name", body: `{"\"model\"":"q","model":"m"}`, names: []string{`"model"`, "model"}, want: map[string]string{`"model"`: "q", "model": "m"}},
	{name: "invalid UTF-8 name", body: "{\"\xff\":\"v\"}", names: []string{"\ufffd"}, want: map[string]string{"\ufffd": "v"}},

	// Duplicates.
	{name: "duplicate", body: `{"model":"a","model":"b"}`, names: model, err: jsonfield.ErrInvalidField, field: "model", problem: dupProblem(2)},
	{name: "duplicate in another case", body: `{"model":"a","Model":"b"}`, names: model, err: jsonfield.ErrInvalidField, field: "model", problem: dupProblem(2)},
	{name: "duplicate in two other cases", body: `{"MODEL":"a","Model":"b"}`, names: model, err: jsonfield.ErrInvalidField, field: "model", problem: dupProblem(2)},
	{name: "duplicate by Kelvin sign", body: `{"key":"a","\u212aEY":"b"}`, names: []string{"key"}, err: jsonfield.ErrInvalidField, field: "key", problem: dupProblem(2)},
	{name: "duplicate by escape", body: `{"model":"a","mod\u0065l":"a"}`, names: model, err: jsonfield.ErrInvalidField, field: "model", problem: dupProblem(2)},
	{name: "duplicate both escaped", body: `{"\u006dodel":"a","m\u006fdel":"b"}`, names: model, err: jsonfield.ErrInvalidField, field: "model", problem: dupProblem(2)},
	{name: "three times", body: `{"model":"a","x":1,"model":"b","model":null}`, names: model, err: jsonfield.ErrInvalidField, field: "model", problem: dupProblem(3)},
	{name: "duplicate of a non-string", body: `{"model":1,"model":"b"}`, names: model, err: jsonfield.ErrInvalidField, field: "model", problem: dupProblem(2)},
	{name: "duplicate unnamed ignored", body: `{"a":1,"a":2,"model":"m","a":3}`, names: model, want: map[string]string{"model": "m"}},
	{name: "duplicate second name", body: `{"model":"m","user":"u","user":"v"}`, names: []string{"model", "user"}, err: jsonfield.ErrInvalidField, field: "user", problem: dupProblem(2)},
	{name: "nested duplicates ignored", body: `{"messages":[{"model":"x"},{"model":"y"}],"meta":{"model":"z","model":"w"},"model":"m"}`, names: model, want: map[string]string{"model": "m"}},
	{name: "nested only", body: `{"meta":{"model":"x"},"list":["model"]}`, names: model, want: map[string]string{}},
	{name: "name as a value", body: `{"x":"model","y":"m"}`, names: model, want: map[string]string{}},

	// Non-string values.
	{name: "number", body: `{"model":4}`, names: model, err: jsonfield.ErrInvalidField, field: "model", problem: "is a number, want a string"},
	{name: "negative float", body: `{"model":-0.5e-3}`, names: model, err: jsonfield.ErrInvalidField, field: "model", problem: "is a number, want a string"},
	{name: "true", body: `{"model":true}`, names: model, err: jsonfield.ErrInvalidField, field: "model", problem: "is a boolean, want a string"},
	{name: "false", body: `{"model":false}`, names: model, err: jsonfield.ErrInvalidField, field: "model", problem: "is a boolean, want a string"},
	{name: "object", body: `{"model":{"model":"m"}}`, names: model, err: jsonfield.ErrInvalidField, field: "model", problem: "is an object, want a string"},
	{name: "array", body: `{"model":["m"]}`, names: model, err: jsonfield.ErrInvalidField, field: "model", problem: "is an array, want a string"},
	{name: "non-string unnamed ignored", body: `{"n":1,"model":"m"}`, names: model, want: map[string]string{"model": "m"}},

	// Values are unescaped; strings are skipped correctly.
	{name: "unicode escape", body: `{"model":"gpt\u002d4o"}`, names: model, want: map[string]string{"model": "gpt-4o"}},
	{name: "escapes", body: `{"model":"a\"b\\c\/d\b\f\n\r\t"}`, names: model, want: map[string]string{"model": "a\"b\\c/d\b\f\n\r\t"}},
	{name: "surrogate pair", body: `{"model":"\ud83d\ude00"}`, names: model, want: map[string]string{"model": "😀"}},
	{name: "lone surrogate", body: `{"model":"a\ud83db"}`, names: model, want: map[string]string{"model": "a\ufffdb"}},
	{name: "raw UTF-8", body: `{"model":"modèle 模型"}`, names: model, want: map[string]string{"model": "modèle 模型"}},
	{name: "invalid UTF-8 value", body: "{\"model\":\"a\xffb\"}", names: model, want: map[string]string{"model": "a\ufffdb"}},
	{name: "escaped quotes and braces", body: `{"a":"}\"{[\"]","model":"m\"}"}`, names: model, want: map[string]string{"model": `m"}`}},
	{name: "trailing backslash", body: `{"a":"x\\","model":"m"}`, names: model, want: map[string]string{"model": "m"}},
	{name: "backslashes and quote", body: `{"a":"\\\"}\\\\","model":"m"}`, names: model, want: map[string]string{"model": "m"}},
	{name: "brackets in nested strings", body: `{"a":[{"b":"]}"},"[{\""],"model":"m"}`, names: model, want: map[string]string{"model": "m"}},
	{name: "quote-ending key", body: `{"\"":1,"model\\":2,"model":"m"}`, names: model, want: map[string]string{"model": "m"}},
	{name: "deep nesting", body: string(deepBody(9000)), names: model, want: map[string]string{"model": "m"}},
	{name: "large body", body: string(chatBody(64 << 10)), names: []string{"model", "stream"}, err: jsonfield.ErrInvalidField, field: "stream", problem: "is a boolean, want a string"},
	{name: "large body model", body: string(chatBody(64 << 10)), names: model, want: map[string]string{"model": "gpt-4o"}},

	// Not JSON, or not an object.
	{name: "empty", body: ``, names: model, err: jsonfield.ErrNotJSON},
	{name: "only space", body: " \n", names: model, err: jsonfield.ErrNotJSON},
	{name: "garbage after", body: `{} x`, names: model, err: jsonfield.ErrNotJSON},
	{name: "two values", body: `{}{}`, names: model, err: jsonfield.ErrNotJSON},
	{name: "BOM", body: "\ufeff{}", names: model, err: jsonfield.ErrNotJSON},
	{name: "truncated", body: `{"model":"m"`, names: model, err: jsonfield.ErrNotJSON},
	{name: "single quotes", body: `{'model':'m'}`, names: model, err: jsonfield.ErrNotJSON},
	{name: "trailing comma", body: `{"model":"m",}`, names: model, err: jsonfield.ErrNotJSON},
	{name: "bad escape", body: `{"model":"\x"}`, names: model, err: jsonfield.ErrNotJSON},
	{name: "control character", body: "{\"model\":\"a\nb\"}", names: model, err: jsonfield.ErrNotJSON},
	{name: "too deep", body: string(deepBody(10001)), names: model, err: jsonfield.ErrNotJSON},
	{name: "array", body: `[{"model":"m"}]`, names: model, err: jsonfield.ErrNotObject},
	{name: "string", body: ` "model" `, names: model, err: jsonfield.ErrNotObject},
	{name: "number body", body: `42`, names: model, err: jsonfield.ErrNotObject},
	{name: "null body", body: `null`, names: model, err: jsonfield.ErrNotObject},
	{name: "true body", body: `true`, names: model, err: jsonfield.ErrNotObject},
}

func TestStrings(t *testing.T) {
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := jsonfield.Strings([]byte(tc.body), tc.names)
			if tc.err == nil {
				if err != nil {
					t.Fatalf("Strings: %v", err)
				}
				if !maps.Equal(got, tc.want) {
					t.Fatalf("Strings = %q, want %q", got, tc.want)
				}
				return
			}
			if !errors.Is(err, tc.err) {
				t.Fatalf("Strings = %q, %v; want error %v", got, err, tc.err)
			}
			if got != nil {
				t.Errorf("Strings returned %q with its error", got)
			}
			var fe *jsonfield.FieldError
			if isFE, wantFE := errors.As(err, &fe), tc.err == jsonfield.ErrInvalidField; isFE != wantFE {
				t.Fatalf("error %v: a *FieldError %t, want %t", err, isFE, wantFE)
			}
			if fe != nil && (fe.Field != tc.field || fe.Problem != tc.problem) {
				t.Fatalf("FieldError{%q, %q}, want {%q, %q}", fe.Field, fe.Problem, tc.field, tc.problem)
			}
			if dup := fe != nil && strings.HasPrefix(tc.problem, "appears "); fe != nil && (fe.Count > 1) != dup {
				t.Errorf("FieldError.Count = %d for %q; want > 1 exactly when duplicated", fe.Count, tc.problem)
			}
		})
	}
}

// TestNameUnescaping checks that a member name with escapes is found by the
// name encoding/json decodes it to, and by no other.
func TestNameUnescaping(t *testing.T) {
	for _, tok := range []string{
		`"\u006dodel"`, `"\u00e9t\u00C9"`, `"\ud83d\ude00"`, `"\uD83D\uDE00x"`, `"\ud83d"`, `"\ude00\ud83d"`,
		`"\ud83d\u0041"`, `"\ud83dA"`, `"\ud83d\n"`, `"\ud83d\ud83d\ude00"`, `"\uffff\ufffd\u0000"`,
		`"\"\\\/\b\f\n\r\t"`, "\"\xff\\u0041\xc3\"", "\"\xed\xa0\x80\\t\"", "\"\xf0\x9f\x98\\t\"",
		"\"\u00e9\\u00e9\"", `"\\u0041"`,
	} {
		var name string
		if err := json.Unmarshal([]byte(tok), &name); err != nil {
			t.Fatalf("%s: %v", tok, err)
		}
		body := []byte(`{"x":1,` + tok + `:"v","y":2}`)
		got, err := jsonfield.Strings(body, []string{name, tok[1 : len(tok)-1]})
		if want := map[string]string{name: "v"}; err != nil || !maps.Equal(got, want) {
			t.Errorf("%s: Strings(%q) = %q, %v; want %q", tok, name, got, err, want)
		}
	}
}

func TestErrorMessages(t *testing.T) {
	_, err := jsonfield.Strings([]byte(`{"model":"a","mod\u0065l":"b"}`), model)
	want := `field "model" appears 2 times in the body, spellings in other cases included; JSON parsers disagree on which one counts ` +
		`(Go and Python take the last, others the first), so the limiter takes neither`
	if err == nil || err.Error() != want {
		t.Errorf("duplicate: %v, want %s", err, want)
	}

	_, err = jsonfield.Strings([]byte(`{"model":[]}`), model)
	if want := `field "model" is an array, want a string`; err == nil || err.Error() != want {
		t.Errorf("array: %v, want %s", err, want)
	}

	_, err = jsonfield.Strings([]byte(`{"model":"m"} x`), model)
	var syn *json.SyntaxError
	if !errors.As(err, &syn) || syn.Offset != 15 || !strings.Contains(err.Error(), "at byte 15") {
		t.Errorf("garbage: %v, want a *json.SyntaxError at byte 15", err)
	}
	if !strings.HasPrefix(err.Error(), jsonfield.ErrNotJSON.Error()) {
		t.Errorf("garbage: %v, want it to start with %q", err, jsonfield.ErrNotJSON)
	}
}

func TestFieldErrorIs(t *testing.T) {
	var err error = &jsonfield.FieldError{Field: "model", Problem: "is a number, want a string"}
	if !errors.Is(err, jsonfield.ErrInvalidField) {
		t.Error("errors.Is(FieldError, ErrInvalidField) = false")
	}
	if errors.Is(err, jsonfield.ErrNotJSON) || errors.Is(err, jsonfield.ErrNotObject) {
		t.Error("FieldError matches another sentinel")
	}
	if errors.Is(fmt.Errorf("choosing a pool: %w", err), jsonfield.ErrInvalidField) != true {
		t.Error("wrapped FieldError does not match ErrInvalidField")
	}
}

// fuzzNames are looked up in every fuzzed body, besides the body's own names.
var fuzzNames = []string{"model", "", "a", "\ufffd", "mod\u00e9l"}

// FuzzStrings checks Strings against encoding/json: a body Strings accepts
// decodes, the values it returns are the ones encoding/json decodes, and it
// reports a field error exactly when a named top-level field is duplicated or
// not a string or null.
func FuzzStrings(f *testing.F) {
	for _, tc := range tests {
		if len(tc.body) < 4096 {
			f.Add([]byte(tc.body))
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		valid := json.Valid(body)
		var decoded map[string]json.RawMessage
		objectErr := json.Unmarshal(body, &decoded)
		names := fuzzNames
		for name := range decoded {
			names = append(names[:len(names):len(names)], name)
		}

		got, err := jsonfield.Strings(body, names)
		switch {
		case !valid:
			if !errors.Is(err, jsonfield.ErrNotJSON) {
				t.Fatalf("invalid JSON: Strings = %q, %v; want ErrNotJSON", got, err)
			}
			return
		case objectErr != nil || decoded == nil: // null decodes to a nil map
			if !errors.Is(err, jsonfield.ErrNotObject) {
				t.Fatalf("valid non-object (%v): Strings = %q, %v; want ErrNotObject", objectErr, got, err)
			}
			return
		case err != nil && !errors.Is(err, jsonfield.ErrInvalidField):
			t.Fatalf("Strings: unexpected error %v", err)
		}

		counts, values := topLevelCounts(t, body)
		var fe *jsonfield.FieldError
		if errors.As(err, &fe) {
			if p := problem(counts[fold(fe.Field)], values[fold(fe.Field)]); p == "" {
				t.Fatalf("Strings: %v, but field %q appears once as %s", err, fe.Field, values[fold(fe.Field)])
			}
			return
		}
		for _, name := range names {
			n, v := counts[fold(name)], values[fold(name)]
			if p := problem(n, v); p != "" {
				t.Fatalf("Strings = %q, nil; but field %q %s", got, name, p)
			}
			want, present := "", n == 1 && string(v) != "null"
			if present {
				if err := json.Unmarshal(v, &want); err != nil {
					t.Fatalf("unmarshal %q: %v", v, err)
				}
			}
			if v, ok := got[name]; ok != present || v != want {
				t.Fatalf("Strings[%q] = %q, %t; encoding/json has %q, %t", name, v, ok, want, present)
			}
		}
	})
}

// problem is what Strings should find wrong with a field that appears n
// times, the last with value v, or "".
func problem(n int, v json.RawMessage) string {
	switch {
	case n > 1:
		return "is duplicated"
	case n == 0 || v[0] == '"' || string(v) == "null":
		return ""
	default:
		return "is not a string or null"
	}
}

// topLevelCounts counts the members of the valid JSON object body by name,
// in any case (by fold of the name), with the value of the last member of
// each, using encoding/json's Decoder.
func topLevelCounts(t *testing.T, body []byte) (map[string]int, map[string]json.RawMessage) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(body))
	counts, values := map[string]int{}, map[string]json.RawMessage{}
	if _, err := dec.Token(); err != nil { // '{'
		t.Fatal(err)
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			t.Fatal(err)
		}
		counts[fold(key.(string))]++
		values[fold(key.(string))] = value
	}
	return counts, values
}

// fold spells name with each rune replaced by the least rune of its
// Unicode simple case folding orbit: two names have the same fold exactly
// when bytes.EqualFold holds of them.
func fold(name string) string {
	var b strings.Builder
	for _, r := range name {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		b.WriteRune(least)
	}
	return b.String()
}

// FuzzFoldedNames holds the comparison of names to bytes.EqualFold, which
// encoding/json's matching of members to fields follows: a member named a
// is the field b exactly when the two are equal in any case.
func FuzzFoldedNames(f *testing.F) {
	for _, seed := range [][2]string{
		{"MODEL", "model"}, {"model", "MODEL"}, {"\u212aey", "key"}, {"\u017ftream", "stream"}, {"ß", "ẞ"},
		{"modeİ", "modei"}, {"ΜΟΝΤΈΛΟΣ", "μοντέλος"}, {"models", "model"}, {"", ""}, {"\xff", "\ufffd"},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		if !utf8.ValidString(b) {
			return // not a field's name: those are valid UTF-8
		}
		member, _ := json.Marshal(a) // invalid UTF-8 becomes U+FFFD, as Strings decodes it
		var decoded string
		if err := json.Unmarshal(member, &decoded); err != nil {
			t.Fatal(err)
		}
		got, err := jsonfield.Strings([]byte(`{`+string(member)+`:"v"}`), []string{b})
		if err != nil {
			t.Fatalf("Strings: %v", err)
		}
		if _, found := got[b]; found != bytes.EqualFold([]byte(decoded), []byte(b)) {
			t.Fatalf("member %q found as field %q: %t; bytes.EqualFold says %t", decoded, b, found, !found)
		}
	})
}

// BenchmarkStrings reads the model of a chat request of 1 KiB (what the
// proxy's benchmark sends) and of 1 MiB.
func BenchmarkStrings(b *testing.B) {
	for _, size := range []int{1 << 10, 1 << 20} {
		body := chatBody(size)
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				got, err := jsonfield.Strings(body, model)
				if err != nil || got["model"] != "gpt-4o" {
					b.Fatalf("Strings = %q, %v", got, err)
				}
			}
		})
	}
}

// BenchmarkStringsEscapedNames is a hostile body: 1 MiB of top-level members
// whose names all have escapes, so all must be unescaped to be compared.
func BenchmarkStringsEscapedNames(b *testing.B) {
	var buf bytes.Buffer
	buf.WriteString(`{`)
	for i := 0; buf.Len() < 1<<20; i++ {
		fmt.Fprintf(&buf, `"\u006dodel%d":1,`, i)
	}
	buf.WriteString(`"model":"m"}`)
	body := buf.Bytes()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if got, err := jsonfield.Strings(body, model); err != nil || got["model"] != "m" {
			b.Fatalf("Strings = %q, %v", got, err)
		}
	}
}

func BenchmarkDecodeMap(b *testing.B) {
	body := chatBody(1 << 20)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var m map[string]any
		if err := json.Unmarshal(body, &m); err != nil || m["model"] != "gpt-4o" {
			b.Fatalf("Unmarshal = %v, %v", m["model"], err)
		}
	}
}
