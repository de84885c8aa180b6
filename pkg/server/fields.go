package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
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
