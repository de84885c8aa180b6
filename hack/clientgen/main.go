// Clientgen generates the request and response types of the Python and
// TypeScript clients from the HTTP contract, api/openapi.yaml, so that
// the clients cannot drift from it: every object schema becomes a
// dataclass (Python) or an interface (TypeScript), with a decoder that
// checks an answer against the schema, and every path a constant.
// hack/codegen.sh (make generate) runs it; its test fails when the
// committed files differ from what it generates.
//
//	go run ./hack/clientgen [-root DIR]
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// SpecFile is the contract, relative to the repository root.
const SpecFile = "api/openapi.yaml"

func main() {
	root := flag.String("root", ".", "the repository root: reads "+SpecFile+", writes the generated files under it")
	flag.Parse()
	if err := run(*root); err != nil {
		fmt.Fprintln(os.Stderr, "clientgen:", err)
		os.Exit(1)
	}
}

func run(root string) error {
	spec, err := os.ReadFile(filepath.Join(root, SpecFile))
	if err != nil {
		return err
	}
	files, err := Generate(spec)
	if err != nil {
		return fmt.Errorf("%s: %w", SpecFile, err)
	}
	for path, data := range files {
		full := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(full, data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Generate returns the generated files, by path relative to the
// repository root, for the OpenAPI document spec.
func Generate(spec []byte) (map[string][]byte, error) {
	schemas, ops, err := parse(spec)
	if err != nil {
		return nil, err
	}
	m, err := buildModel(schemas, ops)
	if err != nil {
		return nil, err
	}
	py, err := renderPython(m)
	if err != nil {
		return nil, err
	}
	ts, err := renderTypeScript(m)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{PythonFile: py, TypeScriptFile: ts}, nil
}

// writer accumulates a generated file.
type writer struct{ buf bytes.Buffer }

// line writes one formatted line.
func (w *writer) line(format string, args ...any) {
	fmt.Fprintf(&w.buf, format, args...)
	w.buf.WriteByte('\n')
}

// raw writes text as it is, ending it with a newline.
func (w *writer) raw(text string) {
	w.buf.WriteString(text)
	if !strings.HasSuffix(text, "\n") {
		w.buf.WriteByte('\n')
	}
}

func (w *writer) bytes() []byte { return w.buf.Bytes() }
