package config

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
)

// decodeHook turns what the file, the environment and flags hold into
// Config's field types.
func decodeHook() mapstructure.DecodeHookFunc {
	return mapstructure.ComposeDecodeHookFunc(typeHook, durationHook, stringListHook, stringMapHook)
}

// typeHook refuses the values of another type that the decoder, weakly
// typed for the environment's strings, would turn into something else
// without a word: true as a duration (1ns) or a number (1), a fraction
// as a whole number (1.5 as 1), a number as true or false (1 as true),
// and true or false as a string ("1"). A number as a string ("123" for
// a password written unquoted) is taken as written.
func typeHook(from, to reflect.Type, data any) (any, error) {
	for to.Kind() == reflect.Pointer {
		to = to.Elem() // an optional field: the value's type is its element's
	}
	switch {
	case from.Kind() == reflect.Bool && to.Kind() != reflect.Bool && to.Kind() != reflect.Interface:
		return nil, fmt.Errorf("%v is true or false, not %s", data, kindName(to))
	case to.Kind() == reflect.Bool && from.Kind() != reflect.Bool && from.Kind() != reflect.String:
		return nil, fmt.Errorf("%v is not true or false", data)
	case isFloat(from.Kind()) && isWhole(to) && to != reflect.TypeFor[time.Duration]():
		if f := reflect.ValueOf(data).Float(); f != float64(int64(f)) {
			return nil, fmt.Errorf("%v is not a whole number", data)
		}
	}
	return data, nil
}

func isFloat(k reflect.Kind) bool { return k == reflect.Float32 || k == reflect.Float64 }

// isWhole reports whether t is an integer type.
func isWhole(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return true
	}
	return false
}

// kindName names what a field of type t holds, for an error.
func kindName(t reflect.Type) string {
	switch {
	case t == reflect.TypeFor[time.Duration]():
		return "a duration: write one like 250ms, 15s or 2m"
	case isWhole(t):
		return "a whole number"
	case t.Kind() == reflect.String:
		return "a string (quote it)"
	}
	return "a " + t.Kind().String()
}

// durationHook parses durations and refuses bare numbers: "timeout: 250"
// would otherwise be 250 nanoseconds.
func durationHook(from, to reflect.Type, data any) (any, error) {
	if to != reflect.TypeFor[time.Duration]() || from == to {
		return data, nil
	}
	switch v := data.(type) {
	case string:
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("%q is not a duration: want a number with a unit, like 250ms, 15s or 2m", v)
		}
		return d, nil
	case int, int64, uint64, float64:
		if reflect.ValueOf(v).IsZero() {
			return time.Duration(0), nil
		}
		return nil, fmt.Errorf("%v has no unit: write a duration like 250ms, 15s or 2m", v)
	}
	return data, nil
}

// stringListHook splits a comma-separated string (the environment's form of
// a list), trimming spaces and dropping empty items.
func stringListHook(from, to reflect.Type, data any) (any, error) {
	s, ok := data.(string)
	if !ok || to != reflect.TypeFor[[]string]() {
		return data, nil
	}
	out := []string{}
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out, nil
}

// stringMapHook reads a map of strings from a string, the environment's
// form: comma-separated key=value pairs (model=body:model,org=header:X-Org),
// spaces trimmed, or a JSON object.
func stringMapHook(from, to reflect.Type, data any) (any, error) {
	s, ok := data.(string)
	if !ok || to != reflect.TypeFor[map[string]string]() {
		return data, nil
	}
	out := map[string]string{}
	if t := strings.TrimSpace(s); strings.HasPrefix(t, "{") {
		if err := json.Unmarshal([]byte(t), &out); err != nil {
			return nil, fmt.Errorf("%q is not a JSON object of strings: %v", s, err)
		}
		if k, twice := twiceInJSON(t); twice {
			return nil, fmt.Errorf("%q is set twice: write each key once", k)
		}
		return out, nil
	}
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		k, v, ok := strings.Cut(item, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("%q is not key=value: write pairs like model=body:model,org=header:X-Org", item)
		}
		k = strings.TrimSpace(k)
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("%q is set twice", k)
		}
		out[k] = strings.TrimSpace(v)
	}
	return out, nil
}

// twiceInJSON returns a key that the JSON object s (valid) names twice:
// json.Unmarshal takes the last silently.
func twiceInJSON(s string) (string, bool) {
	dec := json.NewDecoder(strings.NewReader(s))
	if _, err := dec.Token(); err != nil { // {
		return "", false
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		k, _ := tok.(string)
		if seen[k] {
			return k, true
		}
		seen[k] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return "", false
		}
	}
	return "", false
}
