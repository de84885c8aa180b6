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

// sweepQueuesScript deletes the queues whose tickets all expired before
// the cutoff, with their tickets' expiries and records, in one step: a
// ticket queued or refreshed since the sweep listed the keys is kept
// with its queue. A ticket with no expiry is not live (see wait), so a
// queue with none left goes too.
//
// KEYS[3i-2] -> a queue (sorted set: stream id -> arrival, µs)
// KEYS[3i-1] -> its tickets' expiries (sorted set: stream id -> expiry, ms)
// KEYS[3i]   -> its tickets' records (hash)
// ARGV[1]    -> cutoff (ms): a queue whose latest ticket expired before
// it goes
// returns the number of queues deleted
const sweepQueuesScript = `
local deleted = 0
for k = 1, #KEYS, 3 do
  local latest = redis.call('ZRANGE', KEYS[k + 1], -1, -1, 'WITHSCORES')
  if not latest[2] or tonumber(latest[2]) < tonumber(ARGV[1]) then
    if redis.call('DEL', KEYS[k], KEYS[k + 1], KEYS[k + 2]) > 0 then
      deleted = deleted + 1
    end
  end
end
return deleted
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
	var slots, queues, overrides []string
	queued := map[string]bool{} // the keys whose queues are listed
	answers := map[string]bool{}
	for _, key := range s.server.Keys() {
		if owner, ok := keys.QueueOf(key); ok { // a queue's tickets are no slots
			if !queued[owner] {
				queued[owner] = true
				queues = append(queues, keys.Queue(owner), keys.QueueExpiry(owner), keys.QueueRecords(owner))
			}
			continue
		}
		switch s.server.Type(key) {
		case "zset":
			slots = append(slots, key, keys.SlotRecords(key))
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
		evalBatches(conn, store, sweepQueuesScript, queues, 3*sweepBatch, cutoff),
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
