package main

import (
	"fmt"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"
)

// schema is the part of an OpenAPI 3.0 Schema Object the generator
// understands. Constructs it cannot translate faithfully (oneOf, anyOf,
// not, nullable, maps) are read only to be refused.
type schema struct {
	Ref         string     `yaml:"$ref"`
	Type        string     `yaml:"type"`
	Format      string     `yaml:"format"`
	Description string     `yaml:"description"`
	Enum        []string   `yaml:"enum"`
	Items       *schema    `yaml:"items"`
	AllOf       []*schema  `yaml:"allOf"`
	Required    []string   `yaml:"required"`
	Properties  properties `yaml:"properties"`
	MaxItems    *int       `yaml:"maxItems"`

	OneOf    []yaml.Node `yaml:"oneOf"`
	AnyOf    []yaml.Node `yaml:"anyOf"`
	Not      yaml.Node   `yaml:"not"`
	Nullable bool        `yaml:"nullable"`
	// AdditionalProperties is false on every closed schema; a schema
	// (a map) is refused.
	AdditionalProperties yaml.Node `yaml:"additionalProperties"`
}

// property is one entry of a schema's properties, in document order.
type property struct {
	Name   string
	Schema *schema
}

// properties keeps the document's order, so generated fields read like
// the contract.
type properties []property

func (p *properties) UnmarshalYAML(node *yaml.Node) error {
	if node.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: properties must be a mapping", node.Line)
	}
	for i := 0; i+1 < len(node.Content); i += 2 {
		var s schema
		if err := node.Content[i+1].Decode(&s); err != nil {
			return err
		}
		*p = append(*p, property{Name: node.Content[i].Value, Schema: &s})
	}
	return nil
}

// namedSchema is one entry of components.schemas, in document order.
type namedSchema struct {
	Name   string
	Schema *schema
}

// parse reads components.schemas and the operations of an OpenAPI
// document, in document order.
func parse(doc []byte) ([]namedSchema, []operation, error) {
	var root struct {
		OpenAPI    string    `yaml:"openapi"`
		Paths      yaml.Node `yaml:"paths"`
		Components struct {
			Schemas yaml.Node `yaml:"schemas"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(doc, &root); err != nil {
		return nil, nil, fmt.Errorf("parsing the OpenAPI document: %w", err)
	}
	if !strings.HasPrefix(root.OpenAPI, "3.0.") {
		return nil, nil, fmt.Errorf("openapi: want a 3.0.x document, got %q", root.OpenAPI)
	}
	node := root.Components.Schemas
	if node.Kind != yaml.MappingNode || len(node.Content) == 0 {
		return nil, nil, fmt.Errorf("components.schemas: want a mapping of schemas, found none")
	}
	var schemas []namedSchema
	for i := 0; i+1 < len(node.Content); i += 2 {
		var s schema
		if err := node.Content[i+1].Decode(&s); err != nil {
			return nil, nil, fmt.Errorf("components.schemas.%s: %w", node.Content[i].Value, err)
		}
		schemas = append(schemas, namedSchema{Name: node.Content[i].Value, Schema: &s})
	}
	ops, err := parsePaths(&root.Paths)
	if err != nil {
		return nil, nil, err
	}
	return schemas, ops, nil
}

var methods = map[string]bool{"get": true, "put": true, "post": true, "delete": true, "patch": true}

// parsePaths lists the operations of the paths object; each needs an
// operationId, which names it in the clients.
func parsePaths(node *yaml.Node) ([]operation, error) {
	if node.Kind != yaml.MappingNode || len(node.Content) == 0 {
		return nil, fmt.Errorf("paths: want a mapping of paths, found none")
	}
	var ops []operation
	ids := make(map[string]bool)
	for i := 0; i+1 < len(node.Content); i += 2 {
		path, item := node.Content[i].Value, node.Content[i+1]
		for j := 0; j+1 < len(item.Content); j += 2 {
			method := item.Content[j].Value
			if !methods[method] {
				continue // parameters, servers, summary...
			}
			var op struct {
				ID string `yaml:"operationId"`
			}
			if err := item.Content[j+1].Decode(&op); err != nil {
				return nil, fmt.Errorf("paths.%s.%s: %w", path, method, err)
			}
			if !operationID.MatchString(op.ID) || ids[op.ID] {
				return nil, fmt.Errorf("paths.%s.%s: want a unique lowerCamel operationId, got %q", path, method, op.ID)
			}
			ids[op.ID] = true
			ops = append(ops, operation{ID: op.ID, Method: strings.ToUpper(method), Path: path})
		}
	}
	return ops, nil
}

var operationID = regexp.MustCompile(`^[a-z][A-Za-z0-9]*$`)

// unsupported names the first construct of s the generator refuses.
func (s *schema) unsupported() string {
	switch {
	case len(s.OneOf) > 0:
		return "oneOf"
	case len(s.AnyOf) > 0:
		return "anyOf"
	case s.Not.Kind != 0:
		return "not"
	case s.Nullable:
		return "nullable"
	case s.AdditionalProperties.Kind != 0 && s.AdditionalProperties.Kind != yaml.ScalarNode:
		return "additionalProperties with a schema (a map)"
	}
	return ""
}

// refName is the schema name of a local reference.
func refName(ref string) (string, error) {
	const prefix = "#/components/schemas/"
	if !strings.HasPrefix(ref, prefix) {
		return "", fmt.Errorf("$ref %q: only references to %s* are supported", ref, prefix)
	}
	return strings.TrimPrefix(ref, prefix), nil
}
