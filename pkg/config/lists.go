package config

import (
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-viper/mapstructure/v2"
	"github.com/joishi/limiter/pkg/tiers"
	"go.yaml.in/yaml/v3"
)

// listKey is a key holding a list of entries (tiers, pools). Lists are read
// apart from viper: from the file's own text, which keeps the case of a
// pool's keys (model names) and the line of each field, or from their
// environment variable, one JSON or YAML string, which wins over the file.
type listKey struct {
	name    string // "tiers.static"
	entry   string // "tier"
	example string // a list in the environment's form
	// required are the fields an entry must write, each with why: those
	// whose zero is no default but a value that would surprise.
	required map[string]string
	// notZero are the fields whose zero stands for their default when
	// left out, each with what it may be: written as zero, one is
	// refused, not silently given the default.
	notZero map[string]string
}

var listKeys = []listKey{
	{name: "tiers.static", entry: "tier", example: "[{plan: free, maxConcurrentStreams: 1}]",
		required: map[string]string{
			"maxConcurrentStreams": fmt.Sprintf("the streams one user of the plan may hold at once, 0 to %d (0 refuses every stream)", tiers.MaxConcurrentStreams),
		},
		notZero: map[string]string{
			"slotTTL":           fmt.Sprintf("must be between %s and %s (leave it out for the default, %s)", tiers.MinSlotTTL, tiers.MaxSlotTTL, tiers.DefaultSlotTTL),
			"heartbeatInterval": fmt.Sprintf("must be at least %s and <= slotTTL/3 (leave it out for the default, %s or slotTTL/3)", tiers.MinHeartbeatInterval, tiers.DefaultHeartbeatInterval),
		}},
	{name: "pools.static", entry: "pool", example: "[{pool: model, keys: {gpt-4o: 500}}]"},
}

func isListKey(name string) bool {
	for _, l := range listKeys {
		if l.name == name {
			return true
		}
	}
	return false
}

// loadLists sets the list keys that the environment or file sets in cfg.
func loadLists(cfg *Config, file *configFile) []error {
	var errs []error
	for _, l := range listKeys {
		k, _ := lookupKey(l.name)
		var (
			node  *yaml.Node
			where func(line int) string
		)
		if env := os.Getenv(EnvVar(l.name)); env != "" {
			var doc yaml.Node
			if err := yaml.Unmarshal([]byte(env), &doc); err != nil {
				errs = append(errs, &KeyError{Key: l.name, Problem: fmt.Sprintf("cannot be read: want a JSON or YAML list of %ss, like %s: %v", l.entry, l.example, err), Err: err})
				continue
			}
			if len(doc.Content) > 0 {
				node = doc.Content[0]
			}
			where = func(int) string { return "env " + EnvVar(l.name) }
		} else if node = file.lookup(l.name); node != nil {
			where = file.at
		}
		if isNull(resolve(node)) {
			continue
		}
		list, listErrs := l.decode(k.typ, resolve(node), where)
		if len(listErrs) > 0 {
			errs = append(errs, listErrs...)
			continue
		}
		k.field(cfg).Set(list)
	}
	return errs
}

// decode decodes node, a list of entries, into a slice of typ; where
// names the source of a line. Each field is decoded on its own, so that an
// error names it as written, and its line.
func (l listKey) decode(typ reflect.Type, node *yaml.Node, where func(line int) string) (reflect.Value, []error) {
	if node.Kind != yaml.SequenceNode {
		return reflect.Value{}, []error{&KeyError{Key: l.name, Problem: fmt.Sprintf("must be a list of %ss, like %s", l.entry, l.example), Source: where(node.Line)}}
	}
	out := reflect.MakeSlice(typ, 0, len(node.Content))
	var errs []error
	for i, item := range node.Content {
		item = resolve(item)
		index := fmt.Sprintf("[%d]", i)
		if item.Kind != yaml.MappingNode {
			errs = append(errs, &KeyError{Key: l.name, Field: index, Problem: fmt.Sprintf("must be a mapping of a %s's fields (%s)", l.entry, strings.Join(fieldNames(typ.Elem()), ", ")), Source: where(item.Line)})
			continue
		}
		if fieldErrs := l.checkFields(item, typ.Elem(), index, where); len(fieldErrs) > 0 {
			errs = append(errs, fieldErrs...)
			continue
		}
		entry := reflect.New(typ.Elem()).Elem()
		written := map[string]bool{}
		eachPair(item, func(k, v *yaml.Node) {
			f, _ := fieldOf(typ.Elem(), k.Value)
			written[fieldName(f)] = true
			if sub, problem, got, line := checkScalars(v, f.Type); problem != "" {
				errs = append(errs, &KeyError{Key: l.name, Field: index + "." + fieldName(f) + sub, Problem: problem, Got: got, Source: where(line)})
				return
			}
			val, err := decodeValue(v, f.Type)
			if err != nil {
				errs = append(errs, &KeyError{Key: l.name, Field: index + "." + fieldName(f), Problem: "cannot be read: " + decodeMessage(err), Source: where(k.Line), Err: err})
				return
			}
			if problem, ok := l.notZero[fieldName(f)]; ok && val.IsZero() {
				errs = append(errs, &KeyError{Key: l.name, Field: index + "." + fieldName(f), Problem: problem, Got: asWritten(v), Source: where(v.Line)})
				return
			}
			entry.FieldByIndex(f.Index).Set(val)
		})
		for _, name := range slices.Sorted(maps.Keys(l.required)) {
			if !written[name] {
				errs = append(errs, &KeyError{Key: l.name, Field: index + "." + name, Problem: "is required: " + l.required[name], Source: where(item.Line)})
			}
		}
		out = reflect.Append(out, entry)
	}
	return out, errs
}

// decodeValue decodes n into a new value of typ, weakly typed as viper
// decodes every other key.
func decodeValue(n *yaml.Node, typ reflect.Type) (reflect.Value, error) {
	var raw any
	if err := n.Decode(&raw); err != nil {
		return reflect.Value{}, err
	}
	val := reflect.New(typ)
	dec, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{DecodeHook: decodeHook(), WeaklyTypedInput: true, ErrorUnused: true, Result: val.Interface()})
	if err == nil {
		err = dec.Decode(raw)
	}
	return val.Elem(), err
}

// checkScalars says what is wrong with n as a value of typ that the weakly
// typed decode would let through, turning it into another value: a whole
// number written 0.5, true, an empty string or nothing (read as 0 or 1, a cap that
// shuts a key), a boolean written 0. It returns where below the field
// (".<key>" in a map), the problem, the value as written, and its line;
// no problem when there is none. A mapping's keys, and a string field's
// value, are strings as written (a key 007 or 1.10 is "007" or "1.10",
// not the number's "7" or "1.1").
func checkScalars(n *yaml.Node, typ reflect.Type) (sub, problem, got string, line int) {
	n = resolve(n)
	if typ.Kind() == reflect.Pointer {
		if isNull(n) {
			return "", "", "", 0 // as if left out
		}
		typ = typ.Elem()
	}
	if typ == reflect.TypeFor[time.Duration]() {
		return "", "", "", 0 // "10s": decodeHook reads it
	}
	switch typ.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if !wholeNumber(n) {
			return "", "must be a whole number", asWritten(n), nodeLine(n)
		}
	case reflect.Bool:
		if !boolean(n) {
			return "", "must be true or false", asWritten(n), nodeLine(n)
		}
	case reflect.String:
		// A name written as a number or a date is the name as written: a
		// plan 007 or 1.0 is "007" or "1.0", not the number's "7" or "1",
		// which acquires naming the plan would not find.
		if n.Kind == yaml.ScalarNode && (n.Tag == "!!int" || n.Tag == "!!float" || n.Tag == "!!timestamp") {
			n.Tag = "!!str"
		}
	case reflect.Map:
		eachPair(n, func(k, v *yaml.Node) {
			if k.Kind == yaml.ScalarNode {
				k.Tag = "!!str"
			}
			if problem != "" {
				return
			}
			if s, p, g, l := checkScalars(v, typ.Elem()); p != "" {
				sub, problem, got, line = "."+k.Value+s, p, g, l
			}
		})
	}
	return sub, problem, got, line
}

// wholeNumber reports whether n is written as a whole number that fits
// 64 bits: a YAML integer (42, -7, +2, 0x10), or a string of decimal
// digits as the environment's keys are.
func wholeNumber(n *yaml.Node) bool {
	if isNull(n) || n.Kind != yaml.ScalarNode {
		return !isNull(n) // not a scalar: the decode says what is wrong
	}
	switch n.Tag {
	case "!!int":
		_, err := strconv.ParseInt(n.Value, 0, 64)
		return err == nil
	case "!!str":
		_, err := strconv.ParseInt(strings.TrimSpace(n.Value), 10, 64)
		return err == nil
	}
	return false
}

// boolean reports whether n is written true or false.
func boolean(n *yaml.Node) bool {
	if isNull(n) || n.Kind != yaml.ScalarNode {
		return !isNull(n)
	}
	return n.Tag == "!!bool" || (n.Tag == "!!str" && (strings.EqualFold(n.Value, "true") || strings.EqualFold(n.Value, "false")))
}

// asWritten is a scalar as the file wrote it: a string quoted, nothing
// (null) as "nothing".
func asWritten(n *yaml.Node) string {
	switch {
	case isNull(n):
		return "nothing"
	case n.Tag == "!!str":
		return strconv.Quote(n.Value)
	}
	return n.Value
}

func nodeLine(n *yaml.Node) int {
	if n == nil {
		return 0
	}
	return n.Line
}

// checkFields refuses the keys of the mapping m that are no field of the
// struct typ, at path (e.g. "[0]").
func (l listKey) checkFields(m *yaml.Node, typ reflect.Type, path string, where func(line int) string) []error {
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	if m.Kind != yaml.MappingNode || typ.Kind() != reflect.Struct {
		return nil // no fields to check: decoding says what is wrong
	}
	names := fieldNames(typ)
	errs := twice(l.name, m, typ, path, where)
	eachPair(m, func(k, v *yaml.Node) {
		f, ok := fieldOf(typ, k.Value)
		if !ok {
			e := &KeyError{Key: l.name, Field: path, Problem: fmt.Sprintf("unknown field %q", k.Value), Source: where(k.Line)}
			if near := nearestKey(names, k.Value); near != "" {
				e.Hint = fmt.Sprintf("did you mean %q?", near)
			} else {
				e.Hint = fmt.Sprintf("the fields of a %s are %s", l.entry, strings.Join(names, ", "))
			}
			errs = append(errs, e)
			return
		}
		if f.Type != reflect.TypeFor[time.Duration]() {
			errs = append(errs, l.checkFields(v, f.Type, path+"."+fieldName(f), where)...)
		}
	})
	return errs
}

// twice refuses each field of the struct typ that the mapping m, at path
// in key, sets more than once, in one case or another: the file's reader
// refuses a key written twice, but the environment's JSON does not, and
// names match without case, so the last would win unseen (a cap of 100
// behind a cap of 1). A merge (<<: *defaults) is overridden, as it is
// meant to be, not set twice.
func twice(key string, m *yaml.Node, typ reflect.Type, path string, where func(line int) string) []error {
	var errs []error
	first := map[string]*yaml.Node{} // field → the key that set it
	for i := 0; i+1 < len(m.Content); i += 2 {
		k := m.Content[i]
		f, ok := fieldOf(typ, k.Value)
		if k.Tag == "!!merge" || !ok {
			continue
		}
		name := fieldName(f)
		if prev, set := first[name]; set {
			errs = append(errs, &KeyError{Key: key, Field: path + "." + name,
				Problem: fmt.Sprintf("is set twice (%q, then %q): write each field once", prev.Value, k.Value), Source: where(k.Line)})
			continue
		}
		first[name] = k
	}
	return errs
}

// fieldOf returns the field of typ that name decodes into (mapstructure
// matches names without case).
func fieldOf(typ reflect.Type, name string) (reflect.StructField, bool) {
	for i := range typ.NumField() {
		if f := typ.Field(i); f.IsExported() && strings.EqualFold(fieldName(f), name) {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// fieldNames lists the fields of typ as the file spells them.
func fieldNames(typ reflect.Type) []string {
	var out []string
	for i := range typ.NumField() {
		if f := typ.Field(i); f.IsExported() {
			out = append(out, fieldName(f))
		}
	}
	return out
}

// fieldName is a field as the file spells it: its mapstructure tag, else
// its Go name with the first letter lowered (MaxConcurrentStreams →
// maxConcurrentStreams, SlotTTL → slotTTL).
func fieldName(f reflect.StructField) string {
	if tag, _, _ := strings.Cut(f.Tag.Get("mapstructure"), ","); tag != "" {
		return tag
	}
	r, size := utf8.DecodeRuneInString(f.Name)
	return string(unicode.ToLower(r)) + f.Name[size:]
}
