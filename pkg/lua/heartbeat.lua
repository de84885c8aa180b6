-- heartbeat: extend held slots of one user by their own TTLs; never re-add
-- a lost one.
--
-- KEYS[1] -> <prefix>{<user id>}       sorted set: member = stream id, score = expiry (Redis ms)
-- KEYS[2] -> <prefix>{<user id>}:meta  hash: field = stream id, value = the slot's record
-- ARGV[1]    -> who heartbeats: a caller name, '' for none
-- ARGV[2i]   -> stream id of the i-th slot (i = 1..n, n >= 1)
-- ARGV[2i+1] -> its fallback slot ttl (ms, >= 0, decimal digits): for a
--               slot that has no record (taken by a version that wrote
--               none); 0: none known. Or '=' and the slot's own ttl: its
--               record is not read (see below).
-- returns {pruned, used, alive_1, expires_at_ms_1, ..., alive_n, expires_at_ms_n, {i, record_i, ...}}
--   pruned: the user's slots that had expired unreleased (these included),
--   removed now with their records.
--   used: the user's live slots after the call (the live-streams metric).
--   alive 1: held; the expiry moves to now + the slot's TTL, only forward.
--   alive 0: the slot is missing or had expired; the caller lost it and
--   must stop or acquire again. expires_at_ms is then 0.
--   alive -1: held, but with neither a record nor a fallback ttl: left as
--   it is, expires_at_ms its current expiry.
--   alive -2: held by another caller (its record names one other than
--   ARGV[1]): left as it is, expires_at_ms 0.
--   The last value lists, for the slots kept alive whose record names
--   pool keys (';pools='), their place i and record: the caller keeps
--   their memberships alive too (see pkg/lua/records.go).
--
-- The TTL is the record's leading digits (see acquire), so a slot keeps
-- heartbeating after its plan is deleted, on any replica. A slot without
-- a record is kept by the fallback ttl, which is then recorded. A slot
-- given with '=<ttl>' is kept by that ttl and its record is not read: a
-- pool key's member, whose stream's slot holds the same TTL and was just
-- kept alive, its holder checked, by the user's own heartbeat.
--
-- Both keys expire at least one TTL after the latest slot, as acquire
-- leaves them, so slots that expire unreleased stay visible for the next
-- call to prune and count. A heartbeat moves their expiry only when a
-- slot's new expiry + TTL passes it, and then to that slot's expiry + 2
-- TTLs: a slot heartbeating every TTL/3 (or more often) moves it about
-- every third beat, not on every beat, and a beat that does not move it
-- writes (and replicates) the ZADD alone.
local key = KEYS[1]
local meta = KEYS[2]
local caller = ARGV[1]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Expired slots must go before the ZADD XX below, which would extend them.
local out = {prune(key, meta, now), 0}

-- The ttls given ('=<ttl>'), and the records of the other slots.
local members, given, read = {}, {}, {}
for i = 2, #ARGV, 2 do
  local n = #members + 1
  members[n] = ARGV[i]
  given[n] = string.match(ARGV[i + 1], '^=(%d+)$')
  if not given[n] then
    read[#read + 1] = n
  end
end
local records = {}
if #read == #members then
  records = redis.call('HMGET', meta, unpack(members))
elseif #read > 0 then
  local names = {}
  for j, i in ipairs(read) do
    names[j] = members[i]
  end
  for j, record in ipairs(redis.call('HMGET', meta, unpack(names))) do
    records[read[j]] = record
  end
end

local pooled = {} -- i, record of the slots alive with pool memberships
local need, at = 0, 0 -- the key's expiry must reach need; it is set to at
local recorded = false -- a record was written: the hash may be new
for i, member in ipairs(members) do
  local digits = given[i] or records[i] and string.match(records[i], '^%d+')
  local ttl = digits and tonumber(digits)
  local fallback = not given[i] and (not ttl or ttl <= 0)
  if fallback then
    ttl = tonumber(ARGV[2 * i + 1])
  end
  local alive, expires = 0, 0
  if caller ~= '' and foreign(records[i], caller) then
    alive = -2 -- another caller's: not this call's to keep
  elseif ttl > 0 then
    expires = now + ttl
    -- CH: 1 when the expiry moved. 0: missing (pruned above, or never
    -- held), or already later (the same ms, or a longer TTL before).
    if redis.call('ZADD', key, 'XX', 'GT', 'CH', string.format('%d', expires), member) == 1 then
      alive = 1
    else
      local score = redis.call('ZSCORE', key, member)
      if score then
        alive, expires = 1, tonumber(score)
      end
    end
    if alive == 1 then
      if records[i] and string.find(records[i], ';pools=', 1, true) then
        pooled[#pooled + 1] = i
        pooled[#pooled + 1] = records[i]
      end
      if fallback then
        redis.call('HSET', meta, member, ARGV[2 * i + 1])
        recorded = true
      end
      need = math.max(need, expires + ttl)
      at = math.max(at, expires + 2 * ttl)
    else
      expires = 0
    end
  else
    local score = redis.call('ZSCORE', key, member)
    if score then
      alive, expires = -1, tonumber(score)
    end
  end
  out[#out + 1] = alive
  out[#out + 1] = expires
end

if need > 0 then
  local current = redis.call('PEXPIRETIME', key) -- -1: none, which must not stay
  if current < need or recorded then
    at = string.format('%d', math.max(current, at))
    redis.call('PEXPIREAT', key, at)
    redis.call('PEXPIREAT', meta, at)
  end
end

out[2] = redis.call('ZCARD', key)
out[#out + 1] = pooled
return out
