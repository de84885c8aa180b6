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
	return mapstructure.ComposeDecodeHookFunc(durationHook, stringListHook, stringMapHook)
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
