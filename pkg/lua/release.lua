-- release: give a slot back. Releasing a missing slot is not an error.
--
-- KEYS[1] -> <prefix>{<user id>}           sorted set: member = stream id, score = expiry (Redis ms)
-- KEYS[2] -> <prefix>{<user id>}:meta      hash: field = stream id, value = the slot's record
-- KEYS[3] -> <prefix>{<user id>}:q         sorted set of waiting acquires' tickets (see wait)
-- KEYS[4] -> <prefix>{<user id>}:q:expiry  sorted set: member = stream id, score = ticket expiry (Redis ms)
-- ARGV[1] -> stream id
-- returns {released (0|1), pruned, head}
--   released 0: the slot was not held (never, already released, or expired)
--   pruned: the user's slots that had expired unreleased, removed now
--   head: the stream id of the acquire at the head of the user's queue
--   when it freed a slot (released or pruned one), '' when none waits: the
--   caller wakes it (see wait), whose server grants it the slot or wakes
--   the next ones owed one (a release knows no plan, so no limit).
--   The slot's record goes with it, as do those of pruned slots.
local key = KEYS[1]
local meta = KEYS[2]
local queue = KEYS[3]
local expiry = KEYS[4]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Removes the slots expired by now and their records; returns how many.
local function prune()
  local expired = redis.call('ZRANGEBYSCORE', key, '-inf', now)
  local n = #expired
  if n > 0 then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
    -- In chunks: unpack is bounded by the Lua stack.
    for i = 1, n, 1000 do
      redis.call('HDEL', meta, unpack(expired, i, math.min(i + 999, n)))
    end
  end
  return n
end

local pruned = prune()
local released = redis.call('ZREM', key, ARGV[1])
redis.call('HDEL', meta, ARGV[1])

-- The first live ticket: one whose expiry is still ahead.
local head = ''
if released + pruned > 0 then
  for _, id in ipairs(redis.call('ZRANGE', queue, 0, 9)) do
    local at = redis.call('ZSCORE', expiry, id)
    if at and tonumber(at) > now then
      head = id
      break
    end
  end
end
return {released, pruned, head}
