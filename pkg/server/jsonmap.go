package server

import (
	"fmt"

	"github.com/joishi/limiter/pkg/keys"
)

// stringMap reads the object of string values at pos, of the field at
// path, into *dst: at most most entries (a bound of the request, named in
// the message), each name given once. A null, or an empty object, leaves
// *dst nil. Names are kept as sent: pool names and keys are validated by
// the limiter, which names the bound they break. It reads the pools of an
// acquire: more than most is keys.ErrInvalidPoolKey, as the limiter
// answers it.
func (d *jsonReader) stringMap(path string, most int, dst *map[string]string) error {
	if isNull, err := d.null(); isNull || err != nil {
		return err
	}
	if d.peek() != '{' {
		return d.typeError(path, "an object of strings")
	}
	m := map[string]string{}
	err := d.members(func(name string) error {
		if _, dup := m[name]; dup {
			return badRequest("request body: %q is given twice in %q", name, path)
		}
		if len(m) == most { // of pools: the limiter's bound, named by its code (invalid_pool_key)
			return fmt.Errorf("%w: request body: %q names more than %d pools, the most a stream may join", keys.ErrInvalidPoolKey, path, most)
		}
		if d.peek() != '"' {
			return d.typeError(path+"."+name, "a string")
		}
		value, err := d.str()
		m[name] = value
		return err
	})
	if err != nil || len(m) == 0 {
		return err
	}
	*dst = m
	return nil
}
