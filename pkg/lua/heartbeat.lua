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
-- kept alive, its holder checked, by the user's own heartbeat. The given
-- members of a call move in one ZADD (per 500), one command for Redis to
-- run and for its replicas to apply, and answer as a ZADD each would.
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

-- The ttls given ('=<ttl>'), and the records of the other slots. A
-- call's members mostly share one TTL argument: each is parsed once.
local members, given, read = {}, {}, {}
local parsed = {} -- a TTL argument -> its given ttl, false when not one
local n = 0
for i = 2, #ARGV, 2 do
  n = n + 1
  members[n] = ARGV[i]
  local arg = ARGV[i + 1]
  local ttl = parsed[arg]
  if ttl == nil then
    local digits = string.match(arg, '^=(%d+)$')
    ttl = digits and tonumber(digits) or false
    parsed[arg] = ttl
  end
  if ttl then
    given[n] = ttl
  else
    read[#read + 1] = n
  end
end
local records = {}
if #read == n then
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
local function kept(expires, ttl)
  need = math.max(need, expires + ttl)
  at = math.max(at, expires + 2 * ttl)
end
-- The members given their TTL (a pool key's, with no record and no
-- holder to check) move together in one ZADD below: their expiry,
-- member pairs, their places, and each TTL's expiry as a string.
local batch, batched, stamps = {}, {}, {}
for i, member in ipairs(members) do
  local ttl = given[i]
  if ttl and ttl > 0 then
    local expires = now + ttl
    local stamp = stamps[ttl]
    if not stamp then
      stamp = string.format('%d', expires)
      stamps[ttl] = stamp
    end
    local m = #batched + 1
    batch[2 * m - 1], batch[2 * m], batched[m] = stamp, member, i
    out[2 * i + 1], out[2 * i + 2] = 1, expires -- held, unless the ZADD says otherwise
  else
    local digits = records[i] and string.match(records[i], '^%d+')
    ttl = ttl or digits and tonumber(digits)
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
        kept(expires, ttl)
      else
        expires = 0
      end
    else
      local score = redis.call('ZSCORE', key, member)
      if score then
        alive, expires = -1, tonumber(score)
      end
    end
    out[2 * i + 1], out[2 * i + 2] = alive, expires
  end
end

-- The given members move in one ZADD (in chunks: unpack is bounded by the
-- Lua stack), one command to run and to replicate, not one each. CH
-- counts those whose expiry moved: when it is fewer than all, some are
-- missing or already later, and their scores are read, as above.
if #batched > 0 then
  local moved = 0
  for j = 1, #batch, 1000 do
    moved = moved + redis.call('ZADD', key, 'XX', 'GT', 'CH', unpack(batch, j, math.min(j + 999, #batch)))
  end
  if moved < #batched then
    local names = {}
    for j, i in ipairs(batched) do
      names[j] = members[i]
    end
    local scores = {}
    for j = 1, #names, 1000 do
      for _, score in ipairs(redis.call('ZMSCORE', key, unpack(names, j, math.min(j + 999, #names)))) do
        scores[#scores + 1] = score
      end
    end
    for j, i in ipairs(batched) do
      out[2 * i + 1] = scores[j] and 1 or 0
      out[2 * i + 2] = scores[j] and tonumber(scores[j]) or 0
    end
  end
  if moved == #batched then
    for ttl in pairs(stamps) do
      kept(now + ttl, ttl) -- every member of that TTL moved
    end
  else
    for _, i in ipairs(batched) do
      if out[2 * i + 1] == 1 then
        kept(out[2 * i + 2], given[i])
      end
    end
  end
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
out[2 * n + 3] = pooled
return out
