-- acquire: take a slot for a stream, if the user has one free.
--
-- KEYS[1] -> <prefix>{<user id>}           sorted set: member = stream id, score = expiry (Redis ms)
-- KEYS[2] -> <prefix>{<user id>}:meta      hash: field = stream id, value = the slot's record
-- KEYS[3] -> <prefix>{<user id>}:override  hash: support's override of the limit
--            (fields limit, expires_at in Redis ms; see set_override)
-- KEYS[4] -> <prefix>{<user id>}:q         sorted set of waiting acquires' tickets (see wait)
-- KEYS[5] -> <prefix>{<user id>}:q:expiry  sorted set: member = stream id, score = ticket expiry (Redis ms)
--            KEYS[4] and KEYS[5] are optional: absent for a plan whose
--            acquires never wait (maxWait 0), which then ignores the queue
--            and costs what it did before there was one
-- ARGV[1] -> stream id
-- ARGV[2] -> limit (max concurrent streams, >= 0): the plan's; an override
--            in force replaces it
-- ARGV[3] -> slot ttl (ms, > 0, decimal digits)
-- ARGV[4] -> the rest of a new slot's record: '' or ';name=value' fields
--            (optional: absent is '')
-- returns {granted (0|1), used, expires_at_ms, pruned, retry_after_ms, override, {wake ids}}
--   used           slots held after this call (live slots only)
--   expires_at_ms  the slot's expiry when granted, 0 when denied
--   pruned         slots that had expired unreleased and were removed now,
--                  with their records
--   retry_after_ms when denied: ms until enough slots expire for one to be
--                  free (the earliest, unless the limit was lowered); when
--                  slots are free but owed to waiting acquires: until the
--                  earliest slot expires, 1000 when none is held
--   override       the override's limit when one was in force (and so
--                  applied), else -1
--   wake ids       when this call pruned slots: the waiting acquires owed
--                  the slots now free; the caller wakes them (see wait)
--
-- Idempotent on the stream id: acquiring a held stream extends it (never
-- shortens it) and leaves used unchanged.
--
-- First come, first served: while acquires wait in the user's queue (live
-- tickets, see wait), the free slots are theirs, and a new stream is
-- granted only if one is left over. Expired tickets are removed.
--
-- The record of a slot starts with its TTL (ARGV[3]), so that heartbeats
-- keep the slot by its own TTL whatever happens to its plan; then
-- ';started=<now>' (Redis ms) and the fields of ARGV[4] (who took it, for
-- what), each after a ';'. A new slot's record is written with it; a held
-- slot keeps the record it has (and gets one if it had none). Both keys
-- expire together, at least one TTL and at most two after the latest
-- slot (see below; heartbeat keeps them so too). The override is only
-- read: it has its own expiry.
local key = KEYS[1]
local meta = KEYS[2]
local queue = KEYS[4]
local expiry = KEYS[5]
local member = ARGV[1]
local limit = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local record = ARGV[3] .. ';started=' .. string.format('%d', now) .. (ARGV[4] or '')

-- A support override in force replaces the plan's limit.
local override = -1
local o = redis.call('HMGET', KEYS[3], 'limit', 'expires_at')
if o[1] and o[2] and tonumber(o[2]) > now then
  override = tonumber(o[1])
  limit = override
end

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

-- Tickets expired by now go: their servers stopped refreshing them. (A
-- user nobody waits for costs one ZCARD of a missing key.)
local waiting = 0
if expiry then
  waiting = redis.call('ZCARD', expiry)
end
if waiting > 0 then
  local dead = redis.call('ZRANGEBYSCORE', expiry, '-inf', now)
  if #dead > 0 then
    redis.call('ZREMRANGEBYSCORE', expiry, '-inf', now)
    for i = 1, #dead, 1000 do
      redis.call('ZREM', queue, unpack(dead, i, math.min(i + 999, #dead)))
    end
    waiting = waiting - #dead
  end
end

-- The live slots, before this call adds one.
local used = redis.call('ZCARD', key)
local granted = 0
local expires = 0
local retry = 0
local fresh = false -- the key was empty (so missing) before this call

-- A held stream is extended (never shortened) and keeps its record (or
-- gets one, if it had none).
local function extend()
  redis.call('ZADD', key, 'GT', now + ttl, member)
  redis.call('HSETNX', meta, member, record)
  granted = 1
  expires = tonumber(redis.call('ZSCORE', key, member))
end

if used + waiting < limit then
  -- NX adds a new stream and answers 1; 0 means it is held already.
  if redis.call('ZADD', key, 'NX', now + ttl, member) == 1 then
    redis.call('HSET', meta, member, record)
    granted = 1
    expires = now + ttl
    fresh = used == 0
    used = used + 1
  else
    extend()
  end
elseif redis.call('ZSCORE', key, member) then
  extend()
end

if granted == 1 then
  -- Both keys outlive the slot by at least one TTL, so slots that expire
  -- unreleased stay visible for the next call to prune and count. As a
  -- heartbeat does, their expiry moves only when it must, and then to two
  -- TTLs past the slot: a user's next acquires within a TTL write the
  -- slot alone. A fresh key has no expiry yet.
  local current = -1
  if not fresh then
    current = redis.call('PEXPIRETIME', key)
  end
  if current < expires + ttl then
    local at = string.format('%d', math.max(current, expires + 2 * ttl))
    redis.call('PEXPIREAT', key, at)
    redis.call('PEXPIREAT', meta, at)
  end
elseif limit > 0 and used >= limit then
  -- A slot frees when used-limit+1 slots have expired (more than one if
  -- the plan's limit was lowered while the user held slots).
  local nth = redis.call('ZRANGE', key, used - limit, used - limit, 'WITHSCORES')
  retry = tonumber(nth[2]) - now
elseif limit > 0 then
  -- Free slots, owed to the acquires waiting for them.
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  retry = 1000
  if first[2] then
    retry = tonumber(first[2]) - now
  end
else
  -- limit 0: nothing will free up; ask the caller to come back after a TTL.
  retry = ttl
end

-- Slots this call freed (pruned) with acquires waiting: wake those owed
-- them.
local wake = {}
if pruned > 0 and waiting > 0 and used < limit then
  wake = redis.call('ZRANGE', queue, 0, limit - used - 1)
end

return {granted, used, expires, pruned, retry, override, wake}
