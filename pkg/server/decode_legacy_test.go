package server

// The decoder of the API's request bodies before jsonReader: encoding/json
// with DisallowUnknownFields, then a second pass over the body's tokens
// (checkFields) for what that lets through. FuzzDecode holds decode to
// refusing exactly what this refused, and to decoding the rest alike.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"unicode/utf8"
)

// checkFields walks body's JSON objects alongside t and refuses what
// encoding/json lets through silently: field names that match only
// case-insensitively ("USER_ID"), and a field given twice (the last would
// win). Either would let two different bodies mean the same request.
func checkFields(body []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	return checkValue(dec, t, "")
}

func checkValue(dec *json.Decoder, t reflect.Type, path string) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	delim, ok := tok.(json.Delim)
	if !ok {
		return nil // a scalar; types are checked by the decoder
	}
	switch {
	case delim == '{' && t.Kind() == reflect.Struct:
		return checkObject(dec, t, path)
	case delim == '[' && t.Kind() == reflect.Slice:
		for i := 0; dec.More(); i++ {
			if err := checkValue(dec, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	default:
		return skip(dec)
	}
	_, err = dec.Token() // the closing ']'
	return err
}

func checkObject(dec *json.Decoder, t reflect.Type, path string) error {
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		name := tok.(string)
		field, ok := fieldByJSONName(t, name)
		if !ok {
			return fmt.Errorf("unknown field %q", path+name)
		}
		if seen[name] {
			return fmt.Errorf("field %q is given twice", path+name)
		}
		seen[name] = true
		if err := checkValue(dec, field.Type, path+name+"."); err != nil {
			return err
		}
	}
	_, err := dec.Token() // the closing '}'
	return err
}

// fieldByJSONName finds the field whose json tag is exactly name.
func fieldByJSONName(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if tag == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// skip consumes the rest of a value whose opening delimiter was read.
func skip(dec *json.Decoder) error {
	for depth := 1; depth > 0; {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
	return nil
}

// decode reads r's body into dst strictly: declared application/json
// (checkContentType), at most limit bytes, valid UTF-8 (decoders would
// silently replace bad bytes, letting two different ids collide), one JSON
// object, no unknown fields, right types.
func legacyDecode(w http.ResponseWriter, r *http.Request, limit int64, dst any) error {
	if err := checkContentType(r); err != nil {
		return err
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return badRequest("request body exceeds the limit of %d bytes", limit)
		}
		return badRequest("reading the request body: %v", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return badRequest("request body is empty; a JSON object is required")
	}
	if !utf8.Valid(body) {
		return badRequest("request body is not valid UTF-8")
	}
	if trimmed := bytes.TrimSpace(body); trimmed[0] != '{' {
		return badRequest("request body must be a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return badRequest("%s", describeJSONError(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("request body holds data after the JSON object")
	}
	if err := checkFields(body, reflect.TypeOf(dst).Elem()); err != nil {
		return badRequest("request body: %v", err)
	}
	return nil
}

func describeJSONError(err error) string {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		if typeErr.Field == "" {
			return fmt.Sprintf("request body must be a JSON object, got %s", typeErr.Value)
		}
		return fmt.Sprintf("field %q must be %s, got %s", typeErr.Field, jsonType(typeErr.Type.Kind().String()), typeErr.Value)
	case errors.As(err, &syntaxErr):
		return fmt.Sprintf("request body is not valid JSON at byte %d: %v", syntaxErr.Offset, err)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "request body is truncated JSON"
	default:
		// DisallowUnknownFields reports `json: unknown field "x"`.
		return fmt.Sprintf("request body: %v", err)
	}
}

func jsonType(kind string) string {
	switch kind {
	case "string":
		return "a string"
	case "slice":
		return "an array"
	case "struct", "map":
		return "an object"
	case "bool":
		return "a boolean"
	default:
		return "a number"
	}
}
