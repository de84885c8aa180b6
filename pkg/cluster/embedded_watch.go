package cluster

import (
	"reflect"
	"unsafe"

	"github.com/alicebob/miniredis/v2"
)

// watchVersions reaches two unexported maps of miniredis's RedisDB:
// keyVersion, the version WATCH compares for each key, and keys, the keys
// that exist. miniredis adds a version at a key's first write and, when it
// deletes the key, bumps it rather than dropping it, so without help the
// store would keep one entry (some 170 bytes) for every user id, call id,
// override and queue name it ever saw, until the process ends. miniredis
// has no call that drops them, so the sweep does (see drop).
//
// Only WATCH reads the versions, and the limiter never sends WATCH or
// MULTI: dropping the version of a deleted key (a later write starts it
// again from 1) changes nothing it does.
type watchVersions struct {
	versions *map[string]uint   // RedisDB.keyVersion
	keys     *map[string]string // RedisDB.keys: key -> type
}

// findWatchVersions finds db's maps, or reports false when they are not
// there with the types expected (a miniredis upgrade changed them).
func findWatchVersions(db *miniredis.RedisDB) (watchVersions, bool) {
	v := reflect.ValueOf(db).Elem()
	versions, keys := v.FieldByName("keyVersion"), v.FieldByName("keys")
	if !versions.IsValid() || versions.Type() != reflect.TypeFor[map[string]uint]() ||
		!keys.IsValid() || keys.Type() != reflect.TypeFor[map[string]string]() {
		return watchVersions{}, false
	}
	return watchVersions{
		versions: (*map[string]uint)(unsafe.Pointer(versions.UnsafeAddr())),
		keys:     (*map[string]string)(unsafe.Pointer(keys.UnsafeAddr())),
	}, true
}

func (w watchVersions) found() bool { return w.versions != nil }

// drop forgets the versions of the keys that no longer exist. It holds
// the store's lock, which every miniredis command holds while it reads or
// writes these maps. The kept versions move to a new map: a Go map never
// gives back the room of its deleted entries.
func (w watchVersions) drop(store *miniredis.Miniredis) {
	if !w.found() {
		return
	}
	store.Lock()
	defer store.Unlock()
	live := *w.keys
	kept := make(map[string]uint, len(live))
	for key, version := range *w.versions {
		if _, ok := live[key]; ok {
			kept[key] = version
		}
	}
	if len(kept) < len(*w.versions) {
		*w.versions = kept
	}
}
