package cluster

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2/proto"
	"github.com/joishi/limiter/pkg/keys"
)

// sweepCallTimeout bounds each of the sweep's calls to the store.
const sweepCallTimeout = 10 * time.Second

// sweepBatch is how many keys one sweep script takes: enough to spend
// little on starting scripts, few enough to hold the store briefly.
const sweepBatch = 100

// sweepSlotsScript removes the long-expired slots of slot keys, and their
// records, in one step: the store runs a script alone, as Redis does, so
// an acquire cannot come between the read and the removal and lose the
// slot it just took (the same stream id again) or its record. HDEL drops
// a records hash with its last field.
//
// KEYS[2i-1] -> a slot key (sorted set: stream id -> expiry, ms)
// KEYS[2i]   -> its records hash
// ARGV[1]    -> cutoff (ms): slots that expired before it go
// returns the number of slots removed
const sweepSlotsScript = `
local removed = 0
for k = 1, #KEYS, 2 do
  local expired = redis.call('ZRANGEBYSCORE', KEYS[k], '-inf', '(' .. ARGV[1])
  for i = 1, #expired, 500 do
    local chunk = {unpack(expired, i, math.min(i + 499, #expired))}
    redis.call('ZREM', KEYS[k], unpack(chunk))
    redis.call('HDEL', KEYS[k + 1], unpack(chunk))
  end
  removed = removed + #expired
end
return removed
`

// sweepOverridesScript deletes the overrides that have expired (or have
// no expiry), in one step: an override set since the sweep listed the
// keys is kept.
//
// KEYS[i]  -> an override hash
// ARGV[1]  -> now (ms)
// returns the number of overrides deleted
const sweepOverridesScript = `
local deleted = 0
for _, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then
    local at = tonumber(redis.call('HGET', key, 'expires_at'))
    if not at or at <= tonumber(ARGV[1]) then
      deleted = deleted + redis.call('DEL', key)
    end
  end
end
return deleted
`

// sweep drops what miniredis would keep for ever (see sweepEvery). Keys
// are swept by scripts, never by a read and a later write: the scripts
// the limiter runs in between must not be undone.
func (s *embeddedStore) sweep(now time.Time) {
	conn, err := s.dial()
	if err != nil {
		return // closing
	}
	defer conn.Close()
	store := proto.NewClient(conn)
	var slots, overrides []string
	answers := map[string]bool{}
	for _, key := range s.server.Keys() {
		switch s.server.Type(key) {
		case "zset":
			if !keys.IsQueue(key) { // a queue's tickets are no slots
				slots = append(slots, key, keys.SlotRecords(key))
			}
		case "hash":
			if keys.IsOverride(key) {
				overrides = append(overrides, key)
			}
		case "string":
			switch {
			case !keys.IsReleasedAnswer(key):
			case s.answers[key]:
				s.server.Del(key)
			default:
				answers[key] = true
			}
		}
	}
	s.answers = answers
	cutoff := strconv.FormatInt(now.Add(-sweepAfter).UnixMilli(), 10)
	err = errors.Join(
		evalBatches(conn, store, sweepSlotsScript, slots, 2*sweepBatch, cutoff),
		evalBatches(conn, store, sweepOverridesScript, overrides, sweepBatch, strconv.FormatInt(now.UnixMilli(), 10)),
	)
	if err != nil {
		s.logger.Warn("the embedded store's sweep failed; the next one retries", "err", err)
	}
	s.watch.drop(s.server)
}

// evalBatches runs script on keys, batch keys at a time, and returns the
// first failure.
func evalBatches(conn net.Conn, store *proto.Client, script string, keys []string, batch int, args ...string) error {
	for chunk := range slices.Chunk(keys, batch) {
		_ = conn.SetDeadline(time.Now().Add(sweepCallTimeout))
		cmd := append([]string{"EVAL", script, strconv.Itoa(len(chunk))}, chunk...)
		reply, err := store.Do(append(cmd, args...)...)
		if err == nil && strings.HasPrefix(reply, "-") {
			err = errors.New(strings.TrimSpace(reply[1:]))
		}
		if err != nil {
			return fmt.Errorf("sweeping %s…: %w", chunk[0], err)
		}
	}
	return nil
}
