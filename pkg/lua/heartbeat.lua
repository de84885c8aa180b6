-- heartbeat: extend a held slot by its own TTL; never re-add a lost one.
--
-- KEYS[1] -> <prefix>{<user id>}       sorted set: member = stream id, score = expiry (Redis ms)
-- KEYS[2] -> <prefix>{<user id>}:meta  hash: field = stream id, value = the slot's record
-- ARGV[1] -> stream id
-- ARGV[2] -> fallback slot ttl (ms, >= 0, decimal digits): for a slot that
--            has no record (taken by a version that wrote none); 0: none known
-- returns {alive (1|0|-1), expires_at_ms, pruned}
--   alive 1: held; the expiry moves to now + the slot's TTL, only forward.
--   alive 0: the slot is missing or had expired; the caller lost it and
--   must stop or acquire again. expires_at_ms is then 0.
--   alive -1: held, but with neither a record nor a fallback ttl: left as
--   it is, expires_at_ms its current expiry.
--   pruned: the user's slots that had expired unreleased (this one
--   included), removed now with their records.
--
-- The TTL is the record's leading digits (see acquire), so a slot keeps
-- heartbeating after its plan is deleted, on any replica. A slot without
-- a record is kept by the fallback ttl, which is then recorded.
local key = KEYS[1]
local meta = KEYS[2]
local member = ARGV[1]

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
local score = redis.call('ZSCORE', key, member)
if not score then
  return {0, 0, pruned}
end
score = tonumber(score)

local record = redis.call('HGET', meta, member)
local digits = record and string.match(record, '^%d+')
local ttl = digits and tonumber(digits)
if not ttl or ttl <= 0 then
  ttl = tonumber(ARGV[2])
  if ttl <= 0 then
    return {-1, score, pruned}
  end
  redis.call('HSET', meta, member, ARGV[2])
end

local expires = math.max(score, now + ttl)
redis.call('ZADD', key, 'XX', 'GT', expires, member)

local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
local at = tonumber(last[2]) + ttl
redis.call('PEXPIREAT', key, at)
redis.call('PEXPIREAT', meta, at)

return {1, expires, pruned}
