-- heartbeat: extend a held slot; never re-add a lost one.
--
-- KEYS[1] -> <prefix>{<user id>}  sorted set: member = stream id, score = expiry (Redis ms)
-- ARGV[1] -> stream id
-- ARGV[2] -> slot ttl (ms, > 0)
-- returns {alive (0|1), expires_at_ms, pruned}
--   alive 0: the slot is missing or had expired; the caller lost it and
--   must stop or acquire again. expires_at_ms is then 0.
--   pruned: the user's slots that had expired unreleased (this one
--   included), removed now.
--   The expiry only moves forward (ZADD GT).
local key = KEYS[1]
local member = ARGV[1]
local ttl = tonumber(ARGV[2])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local pruned = redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
if not redis.call('ZSCORE', key, member) then
  return {0, 0, pruned}
end

redis.call('ZADD', key, 'XX', 'GT', now + ttl, member)
local expires = tonumber(redis.call('ZSCORE', key, member))

local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', key, tonumber(last[2]) + ttl)

return {1, expires, pruned}
