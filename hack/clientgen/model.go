package main

import (
	"fmt"
	"regexp"
	"strings"
	"unicode"

	"go.yaml.in/yaml/v3"
)

// kind is what a value is on the wire, as both clients decode it.
type kind int

const (
	kindString kind = iota
	kindInteger
	kindNumber
	kindBoolean
	kindTime   // string, format date-time: decoded into the language's time
	kindArray  // Elem
	kindObject // Name: an object declaration
	kindAlias  // Name: a named string (UserID, StreamID...)
	kindEnum   // Name: a named string enum (ErrorCode)
	kindMap    // Elem: an object of any names, each value of Elem (additionalProperties)
)

// typ is the type of one field.
type typ struct {
	Kind kind
	Name string // kindObject, kindAlias, kindEnum
	Elem *typ   // kindArray, kindMap
	// Values lists an inline string enum's values. Answers may carry
	// values added later, so they document the field and type it in
	// TypeScript, and are never enforced.
	Values []string
}

// field is one property of an object declaration.
type field struct {
	JSON     string // the property name, also the field name in both languages
	Type     *typ
	Required bool
	Doc      string
	MaxItems int // an array's maxItems; 0: unbounded
}

type declKind int

const (
	declObject declKind = iota
	declAlias
	declEnum
)

// decl is one named type: a schema of components.schemas, or an inline
// object schema named after its parent and property.
type decl struct {
	Name   string
	Doc    string
	Kind   declKind
	Base   kind     // declAlias: kindString, kindInteger, kindNumber or kindBoolean
	Fields []field  // declObject, in document order
	Values []string // declEnum
}

// model is everything the renderers need, in document order.
type model struct {
	Decls []*decl
	Paths []operation
}

// operation is one path of the API, named by its operationId.
type operation struct {
	ID, Method, Path string
}

var identifier = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// buildModel resolves the schemas into declarations, refusing what either
// language could not express faithfully.
func buildModel(schemas []namedSchema, ops []operation) (*model, error) {
	b := &builder{named: make(map[string]*schema), kinds: make(map[string]declKind)}
	for _, ns := range schemas {
		if !validTypeName(ns.Name) {
			return nil, fmt.Errorf("components.schemas.%s: a schema name must be an upper-camel identifier", ns.Name)
		}
		k, err := classify(ns.Schema)
		if err != nil {
			return nil, fmt.Errorf("components.schemas.%s: %w", ns.Name, err)
		}
		b.named[ns.Name], b.kinds[ns.Name] = ns.Schema, k
	}
	for _, ns := range schemas {
		if err := b.declare(ns.Name, ns.Schema); err != nil {
			return nil, err
		}
	}
	return &model{Decls: b.decls, Paths: ops}, nil
}

type builder struct {
	named map[string]*schema
	kinds map[string]declKind
	decls []*decl
}

// classify says which declaration a named schema becomes.
func classify(s *schema) (declKind, error) {
	if what := s.unsupported(); what != "" {
		return 0, fmt.Errorf("%s is not supported", what)
	}
	switch {
	case s.Ref != "" || len(s.AllOf) > 0:
		return 0, fmt.Errorf("a named schema must define a type, not only refer to or combine others")
	case s.Type == "object" || len(s.Properties) > 0:
		return declObject, nil
	case s.Type == "string" && len(s.Enum) > 0:
		return declEnum, nil
	case s.Type == "string" || s.Type == "integer" || s.Type == "number" || s.Type == "boolean":
		return declAlias, nil
	}
	return 0, fmt.Errorf("type %q is not supported", s.Type)
}

func (b *builder) declare(name string, s *schema) error {
	d := &decl{Name: name, Doc: clean(s.Description), Kind: b.kinds[name]}
	if d.Doc == "" {
		d.Doc = "Schema " + name + " of the contract."
	}
	b.decls = append(b.decls, d)
	switch d.Kind {
	case declEnum:
		d.Values = s.Enum
	case declAlias:
		t, err := b.resolve(name, s)
		if err != nil {
			return err
		}
		d.Base = t.Kind
	case declObject:
		return b.fields(d, s)
	}
	return nil
}

// fields fills an object declaration; inline object properties become
// declarations of their own, right after it.
func (b *builder) fields(d *decl, s *schema) error {
	if len(s.Properties) == 0 {
		return fmt.Errorf("%s: an object without properties (free-form) is not supported", d.Name)
	}
	required := make(map[string]bool, len(s.Required))
	for _, name := range s.Required {
		required[name] = true
	}
	seen := make(map[string]bool, len(s.Properties))
	for _, p := range s.Properties {
		where := d.Name + "." + p.Name
		if !identifier.MatchString(p.Name) || reserved[p.Name] {
			return fmt.Errorf("%s: property names must be snake_case identifiers of neither language's keywords", where)
		}
		seen[p.Name] = true
		ps := p.Schema
		var inline *decl
		var t *typ
		if m, err := b.mapOf(where, ps); err != nil {
			return err
		} else if m != nil {
			t = m
		} else if (ps.Type == "object" || len(ps.Properties) > 0) && ps.Ref == "" && len(ps.AllOf) == 0 {
			inline = &decl{Name: d.Name + pascal(p.Name), Doc: clean(ps.Description), Kind: declObject}
			if _, taken := b.named[inline.Name]; taken {
				return fmt.Errorf("%s: its inline object would be named %s, which a schema already is", where, inline.Name)
			}
		}
		switch {
		case t != nil:
		case inline != nil:
			t = &typ{Kind: kindObject, Name: inline.Name}
		default:
			var err error
			if t, err = b.resolve(where, ps); err != nil {
				return err
			}
		}
		f := field{JSON: p.Name, Type: t, Required: required[p.Name], Doc: clean(describe(ps))}
		if ps.MaxItems != nil {
			f.MaxItems = *ps.MaxItems
		}
		d.Fields = append(d.Fields, f)
		if inline != nil {
			if inline.Doc == "" {
				inline.Doc = "The " + p.Name + " of a " + d.Name + "."
			}
			b.decls = append(b.decls, inline)
			if err := b.fields(inline, ps); err != nil {
				return err
			}
		}
	}
	for _, name := range s.Required {
		if !seen[name] {
			return fmt.Errorf("%s: required property %q is not defined", d.Name, name)
		}
	}
	return nil
}

// mapOf is the type of a property schema that is an object of any names
// whose values share one schema (no properties, additionalProperties a
// schema); nil for any other schema.
func (b *builder) mapOf(where string, s *schema) (*typ, error) {
	if s.Type != "object" || len(s.Properties) > 0 || s.AdditionalProperties.Kind != yaml.MappingNode {
		return nil, nil
	}
	var elem schema
	if err := s.AdditionalProperties.Decode(&elem); err != nil {
		return nil, fmt.Errorf("%s: additionalProperties: %w", where, err)
	}
	t, err := b.resolve(where+"{}", &elem)
	if err != nil {
		return nil, err
	}
	if t.Kind == kindObject && t.Name == "" || t.Kind == kindMap || t.Kind == kindArray {
		return nil, fmt.Errorf("%s: a map of anything but scalars and named objects is not supported", where)
	}
	return &typ{Kind: kindMap, Elem: t}, nil
}

// resolve is the type of a property schema (where names it in errors).
func (b *builder) resolve(where string, s *schema) (*typ, error) {
	if what := s.unsupported(); what != "" {
		return nil, fmt.Errorf("%s: %s is not supported", where, what)
	}
	switch {
	case s.Ref != "":
		return b.named2typ(where, s.Ref)
	case len(s.AllOf) > 0:
		// allOf is used to annotate a reference (a description) or to
		// narrow it (an enum of its code): the reference is the type.
		var base *typ
		for _, part := range s.AllOf {
			if part.Ref == "" {
				if what := part.unsupported(); what != "" {
					return nil, fmt.Errorf("%s: allOf: %s is not supported", where, what)
				}
				continue
			}
			if base != nil {
				return nil, fmt.Errorf("%s: allOf of two references is not supported", where)
			}
			t, err := b.named2typ(where, part.Ref)
			if err != nil {
				return nil, err
			}
			base = t
		}
		if base == nil {
			return nil, fmt.Errorf("%s: allOf without a reference is not supported", where)
		}
		return base, nil
	}
	switch s.Type {
	case "string":
		if s.Format == "date-time" {
			return &typ{Kind: kindTime}, nil
		}
		return &typ{Kind: kindString, Values: s.Enum}, nil
	case "integer":
		return &typ{Kind: kindInteger}, nil
	case "number":
		return &typ{Kind: kindNumber}, nil
	case "boolean":
		return &typ{Kind: kindBoolean}, nil
	case "array":
		if s.Items == nil {
			return nil, fmt.Errorf("%s: an array needs items", where)
		}
		elem, err := b.resolve(where+"[]", s.Items)
		if err != nil {
			return nil, err
		}
		if elem.Kind == kindObject && elem.Name == "" {
			return nil, fmt.Errorf("%s: an array of inline objects is not supported; name the item schema", where)
		}
		return &typ{Kind: kindArray, Elem: elem}, nil
	case "object", "":
		return nil, fmt.Errorf("%s: an inline object here is not supported; name it in components.schemas", where)
	}
	return nil, fmt.Errorf("%s: type %q is not supported", where, s.Type)
}

func (b *builder) named2typ(where, ref string) (*typ, error) {
	name, err := refName(ref)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	k, ok := b.kinds[name]
	if !ok {
		return nil, fmt.Errorf("%s: $ref %q names no schema", where, ref)
	}
	switch k {
	case declObject:
		return &typ{Kind: kindObject, Name: name}, nil
	case declEnum:
		return &typ{Kind: kindEnum, Name: name}, nil
	}
	base, err := b.resolve(name, b.named[name])
	if err != nil {
		return nil, err
	}
	if base.Kind != kindString {
		// Only string aliases exist; others would need their own wire kind.
		return base, nil
	}
	return &typ{Kind: kindAlias, Name: name}, nil
}

// describe is a property's description; an allOf that annotates a
// reference carries it outside the reference.
func describe(s *schema) string {
	if s.Description != "" {
		return s.Description
	}
	for _, part := range s.AllOf {
		if part.Description != "" {
			return part.Description
		}
	}
	return ""
}

// clean trims a description; markdown is kept as written.
func clean(doc string) string { return strings.TrimSpace(doc) }

func validTypeName(name string) bool {
	if name == "" || !unicode.IsUpper(rune(name[0])) {
		return false
	}
	for _, r := range name {
		if !unicode.IsLetter(r) && !unicode.IsDigit(r) {
			return false
		}
	}
	return true
}

// pascal turns snake_case into PascalCase.
func pascal(s string) string {
	var b strings.Builder
	for _, part := range strings.Split(s, "_") {
		if part != "" {
			b.WriteString(strings.ToUpper(part[:1]) + part[1:])
		}
	}
	return b.String()
}

// reserved are the keywords of Python and TypeScript that could spell a
// snake_case property name.
var reserved = map[string]bool{}

func init() {
	for _, w := range strings.Fields(`and as assert async await break case catch class const continue
		debugger def default del delete do elif else enum except export extends false finally for
		from function global if import in instanceof is lambda let new nonlocal none not null or
		pass raise return super switch this throw true try typeof var void while with yield`) {
		reserved[w] = true
	}
}
