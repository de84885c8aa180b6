package config

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"
)

// configFile is the YAML file as written: its keys in their own case, each
// with its line, for the errors that name them (viper lower-cases keys and
// keeps no lines).
type configFile struct {
	path string
	root *yaml.Node // the top mapping; nil for an empty file
}

// parseConfigFile parses data, the file at path; viper has already read
// it, so it is YAML.
func parseConfigFile(path string, data []byte) (*configFile, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	f := &configFile{path: path}
	if len(doc.Content) > 0 {
		if root := resolve(doc.Content[0]); root.Kind == yaml.MappingNode {
			f.root = root
		}
	}
	return f, nil
}

// stringsAsWritten marks as strings the scalars the file gives settings
// of strings (a string, a list or a map of them, its keys too) that YAML reads as
// numbers or dates: a keyPrefix or username written 007 or 1.0 is "007"
// or "1.0", not the number's "7" or "1" (a replica given the same prefix
// by the environment, as written, would count in other keys than its
// peers). It reports whether it marked any. The lists of tiers and pools
// are read as written already (see checkScalars).
func (f *configFile) stringsAsWritten() bool {
	marked := false
	mark := func(n *yaml.Node) {
		if n = resolve(n); n != nil && n.Kind == yaml.ScalarNode && (n.Tag == "!!int" || n.Tag == "!!float" || n.Tag == "!!timestamp") {
			n.Tag, marked = "!!str", true
		}
	}
	for _, k := range configKeys() {
		n := f.lookup(k.name)
		if n == nil || isListKey(k.name) {
			continue
		}
		switch {
		case k.typ.Kind() == reflect.String:
			mark(n)
		case k.typ == reflect.TypeFor[[]string]() && n.Kind == yaml.SequenceNode:
			for _, item := range n.Content {
				mark(item)
			}
		case k.typ == reflect.TypeFor[map[string]string]():
			eachPair(n, func(k, v *yaml.Node) { mark(k); mark(v) }) // a pool 007 is "007"
		}
	}
	return marked
}

// at returns where line of the file is, for a KeyError's Source.
func (f *configFile) at(line int) string {
	return fmt.Sprintf("%s line %d", f.path, line)
}

// lookup returns the value of the dotted key (compared without case, as
// viper does), or nil when the file does not set it.
func (f *configFile) lookup(key string) *yaml.Node {
	if f == nil || f.root == nil {
		return nil
	}
	n := f.root
	for part := range strings.SplitSeq(key, ".") {
		var next *yaml.Node
		eachPair(n, func(k, v *yaml.Node) {
			if strings.EqualFold(k.Value, part) {
				next = v
			}
		})
		if next == nil || isNull(next) {
			return nil
		}
		n = next
	}
	return n
}

// checkKeys refuses (Load wraps its error in ErrInvalid) the keys of the
// file that Config does not have, naming the line of each and the key
// most likely meant.
func (f *configFile) checkKeys() error {
	if f == nil || f.root == nil {
		return nil
	}
	names := make([]string, 0, len(configKeys()))
	for _, k := range configKeys() {
		names = append(names, k.name)
	}
	var errs []error
	var walk func(m *yaml.Node, prefix string)
	walk = func(m *yaml.Node, prefix string) {
		errs = append(errs, twiceInCases(m, prefix)...)
		eachPair(m, func(k, v *yaml.Node) {
			name := prefix + k.Value
			if isNull(v) { // "redis:" with nothing under it
				return
			}
			if key, ok := lookupKey(name); ok {
				if key.typ.Kind() == reflect.Map {
					errs = append(errs, twiceInCases(v, name+".")...) // identity.pools: model and Model are one pool
				}
				return
			}
			section := sectionKeys(names, name)
			switch {
			case v.Kind == yaml.MappingNode && (len(section) > 0 || len(v.Content) > 0):
				walk(v, name+".") // name the unknown keys under it, one by one
			case len(section) > 0:
				errs = append(errs, fmt.Errorf("line %d: %q is a section, not a value: set its keys (%s)", k.Line, name, strings.Join(section, ", ")))
			default:
				hint := ""
				if near := nearestKey(names, name); near != "" {
					hint = fmt.Sprintf(" (did you mean %s?)", near)
				}
				errs = append(errs, fmt.Errorf("line %d: unknown key %q%s", k.Line, name, hint))
			}
		})
	}
	walk(f.root, "")
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("config file %s: %w", f.path, errors.Join(errs...))
}

// twiceInCases names the keys of the mapping m (its own, not merged)
// written twice in two cases ("redis" and "Redis", "timeout" and
// "Timeout"): keys are read without case, so one of them would be
// dropped unseen.
func twiceInCases(m *yaml.Node, prefix string) []error {
	m = resolve(m)
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	var errs []error
	first := map[string]*yaml.Node{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k := m.Content[i]
		if k.Tag == "!!merge" {
			continue
		}
		lower := strings.ToLower(k.Value)
		if prev, ok := first[lower]; ok {
			errs = append(errs, fmt.Errorf("line %d: %q is %q again (line %d; keys are read without case): write it once", k.Line, prefix+k.Value, prefix+prev.Value, prev.Line))
			continue
		}
		first[lower] = k
	}
	return errs
}

// eachPair calls fn with each key and value of the mapping m, aliases
// resolved, and first the keys of its merges (<<: *defaults), which its
// own keys override.
func eachPair(m *yaml.Node, fn func(k, v *yaml.Node)) {
	m = resolve(m)
	if m == nil || m.Kind != yaml.MappingNode {
		return
	}
	var own []int // indexes of m's own keys
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], resolve(m.Content[i+1])
		switch {
		case k.Tag != "!!merge":
			own = append(own, i)
		case v.Kind == yaml.SequenceNode:
			// Of several merged mappings, the first wins: apply it last.
			for j := len(v.Content) - 1; j >= 0; j-- {
				eachPair(v.Content[j], fn)
			}
		default:
			eachPair(v, fn)
		}
	}
	for _, i := range own {
		fn(m.Content[i], resolve(m.Content[i+1]))
	}
}

// resolve follows an alias (*name) to its anchor.
func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

// isNull reports whether n is an absent or null value.
func isNull(n *yaml.Node) bool {
	return n == nil || n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.Tag == "!!null")
}
