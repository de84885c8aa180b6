package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/httpapi"
)

// trickyStrings are what appendString must write as encoding/json does.
var trickyStrings = []string{
	"", "s-1", "plain text", `quote " and backslash \`, "<script>&amp;</script>", "tab\tnewline\nreturn\r",
	"\b\f\x00\x01\x1f\x7f", "é€😀", "\u2028\u2029", "bad \xff\xfe utf-8", "\xed\xa0\x80 a surrogate", "\ufffd",
}

// fill sets every field of v, recursively, from seed: each string one of
// trickyStrings, pointers and slices nil or not, so that over a few seeds
// every field is written both ways, and a field an append encoder leaves
// out shows.
func fill(v reflect.Value, seed int) {
	switch v.Kind() {
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			t := time.UnixMilli(1_700_000_000_000 + int64(seed)*123_457).UTC()
			if seed%5 == 4 {
				t = t.In(time.FixedZone("", -7*3600)).Add(time.Duration(seed) * time.Nanosecond)
			}
			v.Set(reflect.ValueOf(t))
			return
		}
		for i := range v.NumField() {
			fill(v.Field(i), seed+i)
		}
	case reflect.String:
		v.SetString(trickyStrings[seed%len(trickyStrings)])
	case reflect.Bool:
		v.SetBool(seed%2 == 0)
	case reflect.Int, reflect.Int64:
		v.SetInt(int64(seed*7919) - 100)
	case reflect.Pointer:
		if seed%3 != 0 {
			v.Set(reflect.New(v.Type().Elem()))
			fill(v.Elem(), seed+1)
		}
	case reflect.Slice:
		if seed%4 != 0 {
			n := seed % 3
			v.Set(reflect.MakeSlice(v.Type(), n, n))
			for i := range n {
				fill(v.Index(i), seed+i+1)
			}
		}
	default:
		panic("fill: no case for " + v.Type().String())
	}
}

// TestAppendJSON holds each append encoder to what json.Encoder writes for
// the same value, zero and filled.
func TestAppendJSON(t *testing.T) {
	for _, tc := range []struct {
		typ    reflect.Type
		append func([]byte, any) []byte
	}{
		{reflect.TypeFor[httpapi.AcquireResponse](), func(b []byte, v any) []byte { return appendAcquireResponse(b, v.(httpapi.AcquireResponse)) }},
		{reflect.TypeFor[httpapi.HeartbeatResponse](), func(b []byte, v any) []byte { return appendHeartbeatResponse(b, v.(httpapi.HeartbeatResponse)) }},
		{reflect.TypeFor[httpapi.HeartbeatResult](), func(b []byte, v any) []byte {
			return appendHeartbeatResult(b, v.(httpapi.HeartbeatResult), new(timeAppender))
		}},
		{reflect.TypeFor[httpapi.ReleaseResponse](), func(b []byte, v any) []byte { return appendReleaseResponse(b, v.(httpapi.ReleaseResponse)) }},
		{reflect.TypeFor[httpapi.TiersResponse](), func(b []byte, v any) []byte { return appendTiersResponse(b, v.(httpapi.TiersResponse)) }},
		{reflect.TypeFor[httpapi.ErrorResponse](), func(b []byte, v any) []byte { return appendErrorResponse(b, v.(httpapi.ErrorResponse)) }},
	} {
		t.Run(tc.typ.Name(), func(t *testing.T) {
			for seed := -1; seed < 3*len(trickyStrings); seed++ {
				v := reflect.New(tc.typ).Elem()
				if seed >= 0 {
					fill(v, seed)
				}
				var want bytes.Buffer
				if err := json.NewEncoder(&want).Encode(v.Interface()); err != nil {
					t.Fatal(err)
				}
				got := append(tc.append([]byte("prefix"), v.Interface()), '\n')
				if !bytes.Equal(got[len("prefix"):], want.Bytes()) {
					t.Errorf("seed %d:\n got %s\nwant %s", seed, got[len("prefix"):], want.Bytes())
				}
			}
		})
	}
}

// FuzzAppendTime holds a batch's time writer to time.Time's MarshalJSON,
// for times in and out of its fast path (UTC, years 1970-9999), with the
// minute it keeps from the time before.
func FuzzAppendTime(f *testing.F) {
	for _, t := range []time.Time{
		time.Date(2026, 12, 1, 22, 7, 19, 0, time.UTC),
		time.Date(2026, 12, 1, 22, 7, 59, 999_000_000, time.UTC),
		time.Date(2026, 12, 1, 22, 8, 0, 1, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(1969, 12, 31, 23, 59, 59, 500, time.UTC),
		time.Date(2026, 12, 1, 22, 7, 19, 120_000_000, time.FixedZone("", 3600)),
	} {
		f.Add(t.Unix(), int64(t.Nanosecond()), 0, t.Location() == time.UTC)
	}
	f.Fuzz(func(t *testing.T, sec, nsec int64, step int, utc bool) {
		var times timeAppender
		at := time.Unix(sec, nsec).UTC()
		for range 3 {
			v := at
			if !utc {
				v = at.In(time.FixedZone("", 5400))
			}
			want, err := v.MarshalJSON()
			if err != nil {
				return // a year MarshalJSON refuses; never an expiry time
			}
			if got := times.append(nil, v); !bytes.Equal(got, want) {
				t.Fatalf("append(%v) = %s, want %s", v, got, want)
			}
			at = at.Add(time.Duration(step) * time.Millisecond)
		}
	})
}

func FuzzAppendString(f *testing.F) {
	for _, s := range trickyStrings {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := json.Marshal(s)
		if got := appendString(nil, s); !bytes.Equal(got, want) {
			t.Errorf("appendString(%q) = %s, want %s", s, got, want)
		}
	})
}

// An answer carries the JSON headers and the body as json.Encoder ends it;
// writeError adds Retry-After to a 503 only.
func TestAnswerHeaders(t *testing.T) {
	for _, status := range []int{http.StatusTooManyRequests, http.StatusServiceUnavailable} {
		rec := httptest.NewRecorder()
		writeError(rec, status, httpapi.Error{Code: "c", Message: "m"})
		want := map[string]string{"Content-Type": "application/json", "Cache-Control": "no-store", "Retry-After": ""}
		if status == http.StatusServiceUnavailable {
			want["Retry-After"] = unavailableRetryAfter
		}
		for k, v := range want {
			if got := rec.Header().Get(k); got != v {
				t.Errorf("%d: %s %q, want %q", status, k, got, v)
			}
		}
		if got, want := rec.Body.String(), `{"error":{"code":"c","message":"m"}}`+"\n"; rec.Code != status || got != want {
			t.Errorf("answer %d %q, want %d %q", rec.Code, got, status, want)
		}
	}
}
