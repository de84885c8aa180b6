-- release: give a slot back. Releasing a missing slot is not an error.
--
-- KEYS[1] -> <prefix>{<user id>}       sorted set: member = stream id, score = expiry (Redis ms)
-- KEYS[2] -> <prefix>{<user id>}:meta  hash: field = stream id, value = the slot's record
-- ARGV[1] -> stream id
-- returns {released (0|1), pruned}
--   released 0: the slot was not held (never, already released, or expired)
--   pruned: the user's slots that had expired unreleased, removed now
--   The slot's record goes with it, as do those of pruned slots.
local key = KEYS[1]
local meta = KEYS[2]
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
return {released, pruned}
