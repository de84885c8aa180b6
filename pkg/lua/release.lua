-- release: give a slot back. Releasing a missing slot is not an error.
--
-- KEYS[1] -> <prefix>{<user id>}  sorted set: member = stream id, score = expiry (Redis ms)
-- ARGV[1] -> stream id
-- returns {released (0|1), pruned}
--   released 0: the slot was not held (never, already released, or expired)
--   pruned: the user's slots that had expired unreleased, removed now
local key = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local pruned = redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
return {redis.call('ZREM', key, ARGV[1]), pruned}
