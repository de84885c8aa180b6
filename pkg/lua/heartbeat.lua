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
-- returns {pruned, used, alive_1, expires_at_ms_1, ..., alive_n, expires_at_ms_n[, {i, record_i, ...}]}
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
--   their memberships alive too (see pkg/lua/records.go). It is left out
--   when there are none.
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

local n = (#ARGV - 1) / 2
local need, at = 0, 0 -- the key's expiry must reach need; it is set to at

-- One pass sorts the members. Those given a TTL ('=<ttl>': a pool key's,
-- with no record and no holder to check) go into one ZADD below, as
-- expiry, member pairs (batch), with their places (batched); they are
-- held unless the ZADD says otherwise. The others' records are read
-- (places, names). Members next to each other mostly share one TTL
-- argument, which is parsed and formatted once; a user's call makes no
-- table it does not use (each costs Redis).
local batch, batched, m = nil, nil, 0
local bneed, bat = 0, 0 -- need and at, should every given member move
local places, names
local last, ttl, stamp -- the latest TTL argument, its given ttl, its expiry
for i = 1, n do
  local arg = ARGV[2 * i + 1]
  if arg ~= last then
    local digits = string.byte(arg) == 61 and string.match(arg, '^=(%d+)$')
    last, ttl = arg, digits and tonumber(digits)
    if ttl and ttl > 0 then
      stamp = string.format('%d', now + ttl)
      bneed, bat = math.max(bneed, now + 2 * ttl), math.max(bat, now + 3 * ttl)
    end
  end
  if ttl and ttl > 0 then
    if not batch then
      batch, batched = {}, {}
    end
    m = m + 1
    batch[2 * m - 1], batch[2 * m], batched[m] = stamp, ARGV[2 * i], i
    out[2 * i + 1], out[2 * i + 2] = 1, now + ttl
  else
    if not places then
      places, names = {}, {}
    end
    places[#places + 1], names[#names + 1] = i, ARGV[2 * i]
  end
end

local pooled -- i, record of the slots alive with pool memberships
local recorded = false -- a record was written: the hash may be new
if places then
  local records = redis.call('HMGET', meta, unpack(names))
  for j, i in ipairs(places) do
    local member, record = names[j], records[j]
    local arg = ARGV[2 * i + 1]
    local given = string.byte(arg) == 61 -- given no ttl ('=0'): its record is not looked at
    local ttl, fallback = 0, false
    if not given then
      ttl = record and tonumber((string.match(record, '^%d+'))) -- (): one value, nil when none (the embedded store's match returns none)
      if not ttl or ttl <= 0 then
        fallback, ttl = true, tonumber(arg)
      end
    end
    local alive, expires = 0, 0
    if not given and caller ~= '' and foreign(record, caller) then
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
        if record and string.find(record, ';pools=', 1, true) then
          pooled = pooled or {}
          pooled[#pooled + 1] = i
          pooled[#pooled + 1] = record
        end
        if fallback then
          redis.call('HSET', meta, member, arg)
          recorded = true
        end
        need, at = math.max(need, expires + ttl), math.max(at, expires + 2 * ttl)
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
if batch then
  local moved = 0
  for j = 1, #batch, 1000 do
    moved = moved + redis.call('ZADD', key, 'XX', 'GT', 'CH', unpack(batch, j, math.min(j + 999, #batch)))
  end
  if moved == m then
    need, at = math.max(need, bneed), math.max(at, bat)
  else
    local scores = {}
    for j = 1, m, 500 do
      local chunk = {}
      for k = j, math.min(j + 499, m) do
        chunk[#chunk + 1] = batch[2 * k]
      end
      for _, score in ipairs(redis.call('ZMSCORE', key, unpack(chunk))) do
        scores[#scores + 1] = score
      end
    end
    for j, i in ipairs(batched) do
      local alive, expires = 0, 0
      if scores[j] then
        local ttl = tonumber(string.sub(ARGV[2 * i + 1], 2))
        alive, expires = 1, tonumber(scores[j])
        need, at = math.max(need, expires + ttl), math.max(at, expires + 2 * ttl)
      end
      out[2 * i + 1], out[2 * i + 2] = alive, expires
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
out[2 * n + 3] = pooled -- none: the answer ends at the last slot's
return out
