package apitest_test

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/joishi/limiter/internal/apitest"
)

// example is one example of the spec and the schema it illustrates.
type example struct {
	where  string
	schema *openapi3.Schema
	value  any
}

// Every example in the spec (of a schema, a media type, a parameter or a
// header, under paths or components) is valid against its schema, formats
// included: an example is what a reader copies.
func TestEveryExampleMatchesItsSchema(t *testing.T) {
	examples := collectExamples(apitest.Spec(t))
	if len(examples) == 0 {
		t.Fatal("found no example in the spec")
	}
	var where []string
	for _, ex := range examples {
		where = append(where, ex.where)
		if err := ex.schema.VisitJSON(ex.value, openapi3.EnableFormatValidation(), openapi3.MultiErrors()); err != nil {
			t.Errorf("%s: the example does not match its schema: %v", ex.where, strings.Join(strings.Fields(err.Error()), " "))
		}
	}
	// The 429's example, which once contradicted its schema, is among them.
	if want := "components.responses.LimitReached.content[application/json].example"; !slices.Contains(where, want) {
		t.Errorf("the examples checked do not include %s; got:\n  %s", want, strings.Join(where, "\n  "))
	}
}

func collectExamples(doc *openapi3.T) []example {
	var out []example
	seen := map[*openapi3.Schema]bool{}
	var schema func(where string, ref *openapi3.SchemaRef)
	schema = func(where string, ref *openapi3.SchemaRef) {
		if ref == nil || ref.Value == nil || seen[ref.Value] {
			return
		}
		s := ref.Value
		seen[s] = true
		if s.Example != nil {
			out = append(out, example{where + ".example", s, s.Example})
		}
		for name, p := range s.Properties {
			schema(where+".properties."+name, p)
		}
		schema(where+".items", s.Items)
		if s.AdditionalProperties.Schema != nil {
			schema(where+".additionalProperties", s.AdditionalProperties.Schema)
		}
		for i, list := range [][]*openapi3.SchemaRef{s.AllOf, s.AnyOf, s.OneOf} {
			for j, sub := range list {
				schema(fmt.Sprintf("%s.%s[%d]", where, [...]string{"allOf", "anyOf", "oneOf"}[i], j), sub)
			}
		}
		schema(where+".not", s.Not)
	}
	// examples collects the example and the named examples of what has a
	// schema of its own (a media type, a parameter), then its schema's.
	examples := func(where string, s *openapi3.SchemaRef, one any, named openapi3.Examples) {
		if s != nil && s.Value != nil {
			if one != nil {
				out = append(out, example{where + ".example", s.Value, one})
			}
			for name, ex := range named {
				if ex != nil && ex.Value != nil {
					out = append(out, example{where + ".examples." + name, s.Value, ex.Value.Value})
				}
			}
		}
		schema(where+".schema", s)
	}
	content := func(where string, c openapi3.Content) {
		for mt, m := range c {
			if m != nil {
				examples(fmt.Sprintf("%s.content[%s]", where, mt), m.Schema, m.Example, m.Examples)
			}
		}
	}
	parameter := func(where string, p *openapi3.Parameter) {
		if p == nil {
			return
		}
		examples(where, p.Schema, p.Example, p.Examples)
		content(where, p.Content)
	}
	header := func(where string, h *openapi3.Header) {
		if h != nil {
			parameter(where, &h.Parameter)
		}
	}
	response := func(where string, r *openapi3.Response) {
		if r == nil {
			return
		}
		for name, h := range r.Headers {
			header(where+".headers."+name, h.Value)
		}
		content(where, r.Content)
	}

	// Components first, so that each example is named where it is written
	// rather than where it is referred to.
	c := doc.Components
	if c != nil {
		for _, name := range sortedKeys(c.Schemas) {
			schema("components.schemas."+name, c.Schemas[name])
		}
		for _, name := range sortedKeys(c.Responses) {
			response("components.responses."+name, c.Responses[name].Value)
		}
		for _, name := range sortedKeys(c.Parameters) {
			parameter("components.parameters."+name, c.Parameters[name].Value)
		}
		for _, name := range sortedKeys(c.Headers) {
			header("components.headers."+name, c.Headers[name].Value)
		}
		for _, name := range sortedKeys(c.RequestBodies) {
			if rb := c.RequestBodies[name].Value; rb != nil {
				content("components.requestBodies."+name, rb.Content)
			}
		}
	}
	for _, path := range doc.Paths.InMatchingOrder() {
		item := doc.Paths.Value(path)
		for _, p := range item.Parameters {
			if p.Ref == "" {
				parameter("paths."+path+".parameters."+p.Value.Name, p.Value)
			}
		}
		for method, op := range item.Operations() {
			where := "paths." + path + "." + strings.ToLower(method)
			for _, p := range op.Parameters {
				if p.Ref == "" {
					parameter(where+".parameters."+p.Value.Name, p.Value)
				}
			}
			if op.RequestBody != nil && op.RequestBody.Ref == "" && op.RequestBody.Value != nil {
				content(where+".requestBody", op.RequestBody.Value.Content)
			}
			for status, r := range op.Responses.Map() {
				if r.Ref == "" {
					response(where+".responses."+status, r.Value)
				}
			}
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
