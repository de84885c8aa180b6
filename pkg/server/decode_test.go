package server

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/joishi/limiter/pkg/httpapi"
)

// requestTypes are the types decode reads, each a fresh value per call.
var requestTypes = []func() any{
	func() any { return &httpapi.AcquireRequest{} },
	func() any { return &httpapi.HeartbeatRequest{} },
	func() any { return &httpapi.ReleaseRequest{} },
	func() any { return &httpapi.HeartbeatsRequest{} },
	func() any { return &httpapi.AdminReleaseRequest{} },
	func() any { return &httpapi.AdminOverrideRequest{} },
	func() any { return &httpapi.AdminOverrideRemoveRequest{} },
}

func jsonRequest(body string) (*httptest.ResponseRecorder, *http.Request) {
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	return httptest.NewRecorder(), r
}

// decodeSeeds are bodies at the edges of what decode accepts.
var decodeSeeds = []string{
	`{"user_id":"u","plan":"three","stream_id":"s"}`,
	` {"user_id" : "u" , "plan":"three"}` + "\n\t\r ",
	`{}`, `{ }`, `null`, `[]`, `""`, `1`, ``, " \n", "\u00a0{}", `{}` + "\u00a0", "\ufeff{}",
	`{"user_id":null,"plan":null,"stream_id":null}`,
	`{"USER_ID":"u","plan":"three"}`, `{"User_Id":"u"}`, `{"ſtream_id":"s"}`, `{"reaſon":"x"}`,
	`{"user_id":"a","user_id":"b"}`, `{"user_id":"a","user\u005fid":"b"}`, `{"user\u005fid":"a"}`,
	`{"user_id":"u","priority":1}`, `{"priority":1,"user_id":"u"}`,
	`{"user_id":42}`, `{"user_id":true}`, `{"user_id":false}`, `{"user_id":{}}`, `{"user_id":[]}`,
	`{"user_id":-1}`, `{"user_id":tru}`, `{"user_id":nul}`, `{"user_id":nullx}`, `{"user_id":x}`,
	`{"user_id":"u"} {}`, `{"user_id":"u"}}`, `{"user_id":"u"}x`, `{"user_id":"u",}`, `{,}`, `{"user_id"}`,
	`{"user_id":"u" "plan":"p"}`, `{"user_id":"`, `{"user_id":"u`, `{"user_id":"u"`, `{"user_id":"u",`, `{`,
	`{"user_id":"u-` + "\xff\xfe" + `"}`, `{"user_id":"a` + "\x01" + `b"}`, `{"user_id":"a` + "\x7f" + `b"}`,
	`{"user_id":"\u00e9\n\t\"\\\/\b\f\r"}`, `{"user_id":"\ud83d\ude00"}`, `{"user_id":"\ud800"}`,
	`{"user_id":"\ud800\u0041"}`, `{"user_id":"\udc00\ud800"}`, `{"user_id":"\ud800\u12"}`, `{"user_id":"\u12"}`,
	`{"user_id":"\uZZZZ"}`, `{"user_id":"\x"}`, `{"user_id":"\`, `{"user_id":"é€😀"}`, `{"user_id":"\u0000"}`,
	`{"slots":[{"user_id":"u","plan":"p","stream_id":"s"},{"user_id":"v","plan":"p","stream_id":"t"}]}`,
	`{"slots":[]}`, `{"slots":null}`, `{"slots":[null]}`, `{"slots":[null,{}]}`, `{"slots":"all"}`, `{"slots":{}}`,
	`{"slots":[1]}`, `{"slots":[[]]}`, `{"slots":[{}],"slots":[{}]}`, `{"slots":[{"Plan":"p"}]}`,
	`{"slots":[{"user_id":"u","user_id":"v"}]}`, `{"slots":[{"ttl":1}]}`, `{"slots":[{}],}`, `{"slots":[{},]}`,
	`{"slots":[{}}`, `{"slots":[`, `{"slots":[{}`, `{"slots":[{} {}]}`, `{"slots":[` + strings.Repeat("[", 100) + `]}`,
	`{"reason":"ticket 4812"}`, `{"reason":" \n\t "}`, `{"reason":"x","bogus":1}`,
	`{"user_id":"u","plan":"p","wait_ms":5000}`, `{"wait_ms":0}`, `{"wait_ms":-0}`, `{"wait_ms":-5}`, `{"wait_ms":null}`,
	`{"wait_ms":1.5}`, `{"wait_ms":1.0}`, `{"wait_ms":1e3}`, `{"wait_ms":1E+3}`, `{"wait_ms":2e-1}`, `{"wait_ms":01}`,
	`{"wait_ms":00}`, `{"wait_ms":-}`, `{"wait_ms":-a}`, `{"wait_ms":1.}`, `{"wait_ms":1e}`, `{"wait_ms":.5}`, `{"wait_ms":+1}`,
	`{"wait_ms":9223372036854775807}`, `{"wait_ms":9223372036854775808}`, `{"wait_ms":-9223372036854775809}`,
	`{"wait_ms":"5000"}`, `{"wait_ms":true}`, `{"wait_ms":[]}`, `{"wait_ms":{}}`, `{"wait_ms":1,"wait_ms":2}`,
	`{"wait_ms":5 }`, `{"wait_ms":5,}`, `{"wait_ms":5`, `{"wait_ms":12x}`,
	`{"max_concurrent_streams":5,"expires_in":86400,"reason":"r"}`, `{"max_concurrent_streams":0,"expires_in":-1}`,
	`{"max_concurrent_streams":null,"expires_in":null,"reason":null}`, `{"max_concurrent_streams":-0}`,
	`{"max_concurrent_streams":2.5}`, `{"max_concurrent_streams":1e3}`, `{"max_concurrent_streams":1E3}`, `{"expires_in":1.}`,
	`{"max_concurrent_streams":05}`, `{"max_concurrent_streams":-}`, `{"max_concurrent_streams":--1}`, `{"expires_in":+1}`,
	`{"max_concurrent_streams":9223372036854775807}`, `{"max_concurrent_streams":9223372036854775808}`,
	`{"expires_in":-9223372036854775808}`, `{"expires_in":-9223372036854775809}`, `{"expires_in":99999999999999999999}`,
	`{"max_concurrent_streams":"5"}`, `{"max_concurrent_streams":true}`, `{"max_concurrent_streams":[]}`, `{"expires_in":{}}`,
	`{"max_concurrent_streams":5,"max_concurrent_streams":6}`, `{"max_concurrent_streams":5 ,"reason":"r" }`,
	`{"max_concurrent_streams":5`, `{"max_concurrent_streams":5x}`, `{"max_concurrent_streams":1 2}`, `{"reason":5}`,
}

// FuzzDecode holds decode to the decoder it replaced (legacyDecode): for
// every body and request type, both refuse it, or both accept it and
// decode the same value.
func FuzzDecode(f *testing.F) {
	for _, body := range decodeSeeds {
		for kind := range requestTypes {
			f.Add(body, uint8(kind))
		}
	}
	f.Fuzz(func(t *testing.T, body string, kind uint8) {
		newDst := requestTypes[int(kind)%len(requestTypes)]
		got, want := newDst(), newDst()
		w, r := jsonRequest(body)
		gotErr := decode(w, r, httpapi.MaxBodyBytes, got)
		w, r = jsonRequest(body)
		wantErr := legacyDecode(w, r, httpapi.MaxBodyBytes, want)
		switch {
		case (gotErr == nil) != (wantErr == nil):
			t.Fatalf("%T from %q: got error %v, want %v", got, body, gotErr, wantErr)
		case gotErr == nil && !reflect.DeepEqual(got, want):
			t.Fatalf("%T from %q: got %+v, want %+v", got, body, got, want)
		case gotErr != nil:
			var reqErr *requestError
			if !errors.As(gotErr, &reqErr) {
				t.Fatalf("%T from %q: got %T %v, want a *requestError (400 invalid_request)", got, body, gotErr, gotErr)
			}
		}
	})
}

func TestDecodeRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		dst  func() any
		want string // in the message
	}{
		{"an unknown field is named", `{"user_id":"u","priority":1}`, requestTypes[0], `unknown field "priority"`},
		{"a field in another case is an unknown field", `{"USER_ID":"u"}`, requestTypes[0], `unknown field "USER_ID"`},
		{"a field folded by Unicode is an unknown field", `{"ſtream_id":"s"}`, requestTypes[0], `unknown field "ſtream_id"`},
		{"a field given twice is refused", `{"plan":"a","plan":"b"}`, requestTypes[0], `field "plan" is given twice`},
		{"a field given twice, once escaped, is refused", `{"plan":"a","pl\u0061n":"b"}`, requestTypes[0], `field "plan" is given twice`},
		{"an unknown field in a batch slot is named by its place", `{"slots":[{},{"ttl":1}]}`, requestTypes[3], `unknown field "slots[1].ttl"`},
		{"a field given twice in a batch slot is named by its place", `{"slots":[{"plan":"a","plan":"a"}]}`, requestTypes[3], `field "slots[0].plan" is given twice`},
		{"a number for a string is a wrong type", `{"user_id":42}`, requestTypes[0], `field "user_id" must be a string, got number`},
		{"a string for wait_ms is a wrong type", `{"wait_ms":"5s"}`, requestTypes[0], `field "wait_ms" must be a whole number, got string`},
		{"a fraction of a millisecond is refused", `{"wait_ms":1.5}`, requestTypes[0], `field "wait_ms" must be a whole number`},
		{"an exponent is refused", `{"wait_ms":1e3}`, requestTypes[0], `field "wait_ms" must be a whole number`},
		{"a wait past 64 bits is refused", `{"wait_ms":9223372036854775808}`, requestTypes[0], `field "wait_ms" is out of range: 9223372036854775808 does not fit in a 64-bit integer`},
		{"a long number out of range is cut in the message", `{"wait_ms":` + strings.Repeat("9", 1000) + `}`, requestTypes[0], `field "wait_ms" is out of range: ` + strings.Repeat("9", 20) + `… does not fit`},
		{"wait_ms on a heartbeat is an unknown field", `{"wait_ms":1}`, requestTypes[1], `unknown field "wait_ms"`},
		{"an object for a string is a wrong type", `{"slots":[{"plan":{}}]}`, requestTypes[3], `field "slots[0].plan" must be a string, got object`},
		{"null for a pool's key is a wrong type", `{"pools":{"model":null}}`, requestTypes[0], `field "pools.model" must be a string, got null`},
		{"a string for slots is a wrong type", `{"slots":"all"}`, requestTypes[3], `field "slots" must be an array, got string`},
		{"a number for a slot is a wrong type", `{"slots":[1]}`, requestTypes[3], `field "slots[0]" must be an object, got number`},
		{"invalid UTF-8 is refused", `{"user_id":"` + "\xff" + `"}`, requestTypes[0], "not valid UTF-8"},
		{"a raw control character in a string is refused", "{\"user_id\":\"a\x01\"}", requestTypes[0], "not valid JSON at byte 14: invalid character '\\x01' in string literal"},
		{"a bad escape is refused", `{"user_id":"\x"}`, requestTypes[0], "in string escape code"},
		{"a second value after the object is refused", `{} {}`, requestTypes[2], "data after the JSON object"},
		{"a stray brace after the object is refused", `{}}`, requestTypes[2], "data after the JSON object"},
		{"a truncated object is refused", `{"user_id":"u"`, requestTypes[2], "truncated JSON"},
		{"a trailing comma is refused", `{"user_id":"u",}`, requestTypes[2], "looking for beginning of object key string"},
		{"a missing colon is refused", `{"user_id" "u"}`, requestTypes[2], "after object key"},
		{"an array body is refused", `[]`, requestTypes[2], "must be a JSON object"},
		{"null is refused", `null`, requestTypes[2], "must be a JSON object"},
		{"an empty body is refused", ``, requestTypes[2], "is empty"},
		{"a space JSON does not know before the object is refused", "\u00a0{}", requestTypes[2], "invalid character '\\u00a0' looking for beginning of value"},
		{"a body over the limit is refused", `{"reason":"` + strings.Repeat("r", httpapi.MaxBodyBytes) + `"}`, requestTypes[4], "exceeds the limit of 65536 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, r := jsonRequest(tc.body)
			err := decode(w, r, httpapi.MaxBodyBytes, tc.dst())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("decode(%.80q): got %v, want an error containing %q", tc.body, err, tc.want)
			}
		})
	}
}

// A body over the limit closes the connection after the answer, whether
// its length was declared or not: its rest is never read.
func TestDecodeOverLimitClosesTheConnection(t *testing.T) {
	body := `{"reason":"` + strings.Repeat("r", httpapi.MaxBodyBytes) + `"}`
	for _, declared := range []bool{true, false} {
		w, r := jsonRequest(body)
		if !declared {
			r.ContentLength = -1
		}
		if err := decode(w, r, httpapi.MaxBodyBytes, &httpapi.AdminReleaseRequest{}); err == nil {
			t.Fatalf("length declared %v: a body of %d bytes was accepted", declared, len(body))
		}
		if got := w.Header().Get("Connection"); got != "close" {
			t.Errorf("length declared %v: Connection header %q, want close", declared, got)
		}
	}
}

// The field tables of jsonReader name the json tags of the types they
// decode, all of them: a field added to a request type must be added there.
func TestDecodeFieldsAreTheJSONTags(t *testing.T) {
	for _, tc := range []struct {
		typ    any
		fields stringFields
	}{
		{httpapi.AcquireRequest{}, acquireFields},
		{httpapi.HeartbeatRequest{}, heartbeatFields},
		{httpapi.ReleaseRequest{}, releaseFields},
		{httpapi.AdminReleaseRequest{}, adminReleaseFields},
		{httpapi.HeartbeatsRequest{}, heartbeatsFields},
		{httpapi.AdminOverrideRequest{}, overrideFields},
		{httpapi.AdminOverrideRemoveRequest{}, adminReleaseFields},
	} {
		typ := reflect.TypeOf(tc.typ)
		var tags []string
		for i := range typ.NumField() {
			tag, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
			tags = append(tags, tag)
		}
		if !reflect.DeepEqual(stringFields(tags), tc.fields) {
			t.Errorf("%s: json tags %q, decoded fields %q", typ, tags, tc.fields)
		}
	}
}

func TestDecodeAccepts(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		dst  any
		want any
	}{
		{"every field", `{"user_id":"u","plan":"three","stream_id":"s","wait_ms":5000}`, &httpapi.AcquireRequest{},
			&httpapi.AcquireRequest{UserID: "u", Plan: "three", StreamID: "s", WaitMs: 5000}},
		{"wait_ms null is no wait", `{"wait_ms":null}`, &httpapi.AcquireRequest{}, &httpapi.AcquireRequest{}},
		{"a negative wait_ms is decoded, for the handler to refuse", `{"wait_ms":-1}`, &httpapi.AcquireRequest{}, &httpapi.AcquireRequest{WaitMs: -1}},
		{"JSON whitespace anywhere", " {\n\"user_id\" :\t\"u\" ,\r\"plan\":\"p\" } \n", &httpapi.AcquireRequest{},
			&httpapi.AcquireRequest{UserID: "u", Plan: "p"}},
		{"null leaves a field empty", `{"user_id":null,"stream_id":"s"}`, &httpapi.ReleaseRequest{},
			&httpapi.ReleaseRequest{StreamID: "s"}},
		{"escapes are decoded", `{"user_id":"\u00e9\/\"\\\ud83d\ude00"}`, &httpapi.ReleaseRequest{},
			&httpapi.ReleaseRequest{UserID: "é/\"\\😀"}},
		// As encoding/json decodes it; the id then collides with
		// "\ufffd", which is valid.
		{"a lone surrogate becomes U+FFFD", `{"user_id":"a\ud800"}`, &httpapi.ReleaseRequest{},
			&httpapi.ReleaseRequest{UserID: "a\ufffd"}},
		{"a batch in order, a null slot empty", `{"slots":[{"user_id":"u","plan":"p","stream_id":"s"},null]}`, &httpapi.HeartbeatsRequest{},
			&httpapi.HeartbeatsRequest{Slots: []httpapi.HeartbeatRequest{{UserID: "u", Plan: "p", StreamID: "s"}, {}}}},
		{"an empty batch", `{"slots":[]}`, &httpapi.HeartbeatsRequest{}, &httpapi.HeartbeatsRequest{Slots: []httpapi.HeartbeatRequest{}}},
		{"slots null", `{"slots":null}`, &httpapi.HeartbeatsRequest{}, &httpapi.HeartbeatsRequest{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, r := jsonRequest(tc.body)
			if err := decode(w, r, httpapi.MaxBodyBytes, tc.dst); err != nil {
				t.Fatalf("decode(%q): %v", tc.body, err)
			}
			if !reflect.DeepEqual(tc.dst, tc.want) {
				t.Errorf("decode(%q): got %+v, want %+v", tc.body, tc.dst, tc.want)
			}
		})
	}
}

// BenchmarkDecode: an acquire body and a batch of 1000 slots, through
// decode and through the decoder it replaced.
func BenchmarkDecode(b *testing.B) {
	acquire := `{"user_id":"load-0a1b2c3d4e5f-123456","plan":"three","stream_id":"w12-345"}`
	slots := make([]string, httpapi.MaxBatch)
	for i := range slots {
		slots[i] = `{"user_id":"user-` + strconv.Itoa(i) + `","plan":"three","stream_id":"stream-` + strconv.Itoa(i) + `"}`
	}
	batch := `{"slots":[` + strings.Join(slots, ",") + `]}`
	for _, tc := range []struct {
		name, body string
		limit      int64
		dst        func() any
	}{
		{"acquire", acquire, httpapi.MaxBodyBytes, requestTypes[0]},
		{"batch", batch, maxBatchBodyBytes, requestTypes[3]},
	} {
		for _, impl := range []struct {
			name   string
			decode func(http.ResponseWriter, *http.Request, int64, any) error
		}{{"onepass", decode}, {"legacy", legacyDecode}} {
			b.Run(tc.name+"/"+impl.name, func(b *testing.B) {
				r := httptest.NewRequest(http.MethodPost, "/", nil)
				r.Header.Set("Content-Type", "application/json")
				body := strings.NewReader(tc.body)
				r.Body = io.NopCloser(body)
				b.ReportAllocs()
				b.SetBytes(int64(len(tc.body)))
				for b.Loop() {
					body.Reset(tc.body)
					r.ContentLength = int64(len(tc.body))
					if err := impl.decode(nil, r, tc.limit, tc.dst()); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
