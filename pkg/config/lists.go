package config

import (
	"fmt"
	"os"
	"reflect"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-viper/mapstructure/v2"
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
}

var listKeys = []listKey{
	{name: "tiers.static", entry: "tier", example: "[{plan: free, maxConcurrentStreams: 1}]"},
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
		eachPair(item, func(k, v *yaml.Node) {
			f, _ := fieldOf(typ.Elem(), k.Value)
			val, err := decodeValue(v, f.Type)
			if err != nil {
				errs = append(errs, &KeyError{Key: l.name, Field: index + "." + fieldName(f), Problem: "cannot be read: " + decodeMessage(err), Source: where(k.Line), Err: err})
				return
			}
			entry.FieldByIndex(f.Index).Set(val)
		})
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
	var errs []error
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
