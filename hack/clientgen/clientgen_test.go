package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// root is the repository root, from this package's directory.
const root = "../.."

func readSpec(t *testing.T) []byte {
	t.Helper()
	spec, err := os.ReadFile(filepath.Join(root, SpecFile))
	if err != nil {
		t.Fatal(err)
	}
	return spec
}

// TestGeneratedFilesMatchTheContract is the drift check: the committed
// client types are what api/openapi.yaml generates now.
func TestGeneratedFilesMatchTheContract(t *testing.T) {
	files, err := Generate(readSpec(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 {
		t.Fatalf("generated %d files, want the Python and the TypeScript module", len(files))
	}
	for path, want := range files {
		got, err := os.ReadFile(filepath.Join(root, path))
		if err != nil {
			t.Errorf("%s: %v; run `make generate` and commit the result", path, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is out of date with %s (first difference: %s); run `make generate` and commit the result",
				path, SpecFile, firstDifference(got, want))
		}
	}
}

// firstDifference describes the first line where got and want differ.
func firstDifference(got, want []byte) string {
	g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := 0; i < len(g) || i < len(w); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return "line " + strconv.Itoa(i+1) + ": committed " + strconv.Quote(gl) + ", generated " + strconv.Quote(wl)
		}
	}
	return "none"
}

// TestGenerateFollowsTheContract: a field added to the contract appears in
// both clients' types and decoders, and a field removed disappears, so the
// drift check fails whenever the contract changes without a regeneration.
func TestGenerateFollowsTheContract(t *testing.T) {
	spec := readSpec(t)
	before, err := Generate(spec)
	if err != nil {
		t.Fatal(err)
	}
	changed := editSchema(t, spec, "AcquireRequest", func(s *yaml.Node) {
		props := mapValue(t, s, "properties")
		props.Content = append(props.Content,
			&yaml.Node{Kind: yaml.ScalarNode, Value: "priority"},
			&yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{
				{Kind: yaml.ScalarNode, Value: "type"}, {Kind: yaml.ScalarNode, Value: "string"},
				{Kind: yaml.ScalarNode, Value: "description"}, {Kind: yaml.ScalarNode, Value: "How urgent the stream is."},
			}})
	})
	after, err := Generate(changed)
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string][]string{
		PythonFile:     {"    priority: Optional[str] = None\n", `("priority", "string", False),`},
		TypeScriptFile: {"  priority?: string;\n", `["priority", "string", false],`},
	} {
		if bytes.Equal(before[path], after[path]) {
			t.Errorf("%s: adding AcquireRequest.priority to the contract changed nothing", path)
		}
		for _, w := range want {
			if !strings.Contains(string(after[path]), w) || strings.Contains(string(before[path]), w) {
				t.Errorf("%s: %q appears %t before and %t after adding AcquireRequest.priority, want only after",
					path, w, strings.Contains(string(before[path]), w), strings.Contains(string(after[path]), w))
			}
		}
	}

	removed := editSchema(t, spec, "ReleaseResponse", func(s *yaml.Node) {
		props := mapValue(t, s, "properties")
		props.Content = props.Content[2:] // drop "released"
		req := mapValue(t, s, "required")
		req.Content = req.Content[1:]
	})
	gone, err := Generate(removed)
	if err != nil {
		t.Fatal(err)
	}
	if py := string(gone[PythonFile]); strings.Contains(py, "    released: bool\n") {
		t.Errorf("python: ReleaseResponse.released is still generated after its removal")
	}
	if ts := string(gone[TypeScriptFile]); strings.Contains(ts, "  released: boolean;\n") {
		t.Errorf("typescript: ReleaseResponse.released is still generated after its removal")
	}
}

// TestGenerateRefusesWhatItCannotTranslate: constructs the generator would
// translate wrongly are refused with an error naming the schema and the
// construct, never generated approximately.
func TestGenerateRefusesWhatItCannotTranslate(t *testing.T) {
	for _, tc := range []struct {
		name, schemas, want string
	}{
		{"a oneOf", "A:\n  type: object\n  properties:\n    x:\n      oneOf: [{type: string}, {type: integer}]\n", "A.x: oneOf is not supported"},
		{"a nullable field", "A:\n  type: object\n  properties:\n    x: {type: string, nullable: true}\n", "A.x: nullable is not supported"},
		{"a map", "A:\n  type: object\n  additionalProperties: {type: string}\n  properties:\n    x: {type: string}\n", "a map"},
		{"a reference to nothing", "A:\n  type: object\n  properties:\n    x: {$ref: '#/components/schemas/B'}\n", `A.x: $ref "#/components/schemas/B" names no schema`},
		{"a remote reference", "A:\n  type: object\n  properties:\n    x: {$ref: 'other.yaml#/B'}\n", "only references to #/components/schemas/"},
		{"a required field not defined", "A:\n  type: object\n  required: [y]\n  properties:\n    x: {type: string}\n", `A: required property "y" is not defined`},
		{"an array of inline objects", "A:\n  type: object\n  properties:\n    x:\n      type: array\n      items: {type: object, properties: {y: {type: string}}}\n", "A.x[]: an inline object here is not supported"},
		{"a keyword as a field", "A:\n  type: object\n  properties:\n    from: {type: string}\n", "A.from: property names must be snake_case identifiers"},
		{"a camelCase field", "A:\n  type: object\n  properties:\n    streamId: {type: string}\n", "A.streamId: property names must be snake_case"},
		{"a free-form object", "A:\n  type: object\n", "an object without properties"},
		{"an enum value that names no constant", "A:\n  type: string\n  enum: [ok, not-ok]\n", `A: enum value "not-ok" cannot name a constant`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := "openapi: 3.0.3\npaths:\n  /x:\n    get:\n      operationId: x\ncomponents:\n  schemas:\n" + indent(tc.schemas, "    ")
			_, err := Generate([]byte(spec))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Generate: got %v, want an error containing %q", err, tc.want)
			}
		})
	}
	if _, err := Generate([]byte("openapi: 3.1.0\npaths: {}\ncomponents: {schemas: {}}\n")); err == nil || !strings.Contains(err.Error(), "want a 3.0.x document") {
		t.Errorf("an OpenAPI 3.1 document: got %v, want it refused as not 3.0.x", err)
	}
	if _, err := Generate([]byte("openapi: 3.0.3\npaths:\n  /x:\n    get: {summary: s}\ncomponents:\n  schemas:\n    A: {type: string}\n")); err == nil || !strings.Contains(err.Error(), "operationId") {
		t.Errorf("an operation without operationId: got %v, want it refused", err)
	}
}

func indent(text, prefix string) string {
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n") + "\n"
}

// editSchema returns spec with components.schemas.name changed by edit.
func editSchema(t *testing.T, spec []byte, name string, edit func(*yaml.Node)) []byte {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal(spec, &doc); err != nil {
		t.Fatal(err)
	}
	edit(mapValue(t, mapValue(t, mapValue(t, doc.Content[0], "components"), "schemas"), name))
	out, err := yaml.Marshal(&doc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func mapValue(t *testing.T, node *yaml.Node, key string) *yaml.Node {
	t.Helper()
	for i := 0; i+1 < len(node.Content); i += 2 {
		if node.Content[i].Value == key {
			return node.Content[i+1]
		}
	}
	t.Fatalf("no %q in the mapping at line %d", key, node.Line)
	return nil
}
