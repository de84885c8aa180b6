-- acquire: take a slot for a stream, if the user has one free.
--
-- KEYS[1] -> <prefix>{<user id>}  sorted set: member = stream id, score = expiry (Redis ms)
-- ARGV[1] -> stream id
-- ARGV[2] -> limit (max concurrent streams, >= 0)
-- ARGV[3] -> slot ttl (ms, > 0)
-- returns {granted (0|1), used, expires_at_ms, pruned, retry_after_ms}
--   used           slots held after this call (live slots only)
--   expires_at_ms  the slot's expiry when granted, 0 when denied
--   pruned         slots that had expired unreleased and were removed now
--   retry_after_ms when denied: ms until enough slots expire for one to be
--                  free (the earliest, unless the limit was lowered)
--
-- Idempotent on the stream id: acquiring a held stream extends it (never
-- shortens it) and leaves used unchanged.
local key = KEYS[1]
local member = ARGV[1]
local limit = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local pruned = redis.call('ZREMRANGEBYSCORE', key, '-inf', now)

local granted = 0
local expires = 0
local retry = 0
if redis.call('ZSCORE', key, member) then
  redis.call('ZADD', key, 'GT', now + ttl, member)
  granted = 1
elseif redis.call('ZCARD', key) < limit then
  redis.call('ZADD', key, now + ttl, member)
  granted = 1
end

local used = redis.call('ZCARD', key)
if granted == 1 then
  expires = tonumber(redis.call('ZSCORE', key, member))
elseif limit > 0 then
  -- A slot frees when used-limit+1 slots have expired (more than one if
  -- the plan's limit was lowered while the user held slots).
  local nth = redis.call('ZRANGE', key, used - limit, used - limit, 'WITHSCORES')
  retry = tonumber(nth[2]) - now
else
  -- limit 0: nothing will free up; ask the caller to come back after a TTL.
  retry = ttl
end

if used > 0 then
  -- The key outlives its longest slot by one TTL, so slots that expire
  -- unreleased stay visible for the next acquire to prune and count.
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', key, tonumber(last[2]) + ttl)
end

return {granted, used, expires, pruned, retry}
