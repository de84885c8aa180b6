-- acquire: take a slot for a stream, if the user has one free.
--
-- KEYS[1] -> <prefix>{<user id>}           sorted set: member = stream id, score = expiry (Redis ms)
-- KEYS[2] -> <prefix>{<user id>}:meta      hash: field = stream id, value = the slot's record
-- KEYS[3] -> <prefix>{<user id>}:override  hash: support's override of the limit
--            (fields limit, expires_at in Redis ms; see set_override)
-- KEYS[4] -> <prefix>{<user id>}:q         sorted set of waiting acquires' tickets (see wait)
-- KEYS[5] -> <prefix>{<user id>}:q:expiry  sorted set: member = stream id, score = ticket expiry (Redis ms)
-- KEYS[6] -> <prefix>{<user id>}:q:rec     hash: field = stream id, value = the ticket's record (see wait)
-- ARGV[1] -> stream id
-- ARGV[2] -> limit (max concurrent streams, >= 0): the plan's; an override
--            in force replaces it, unless it is 2147483647 (2^31-1): no
--            cap (a pool key whose cap was lifted), which no override
--            applies to, as wait's does not
-- ARGV[3] -> slot ttl (ms, > 0, decimal digits): a new slot's; a held
--            slot is extended by the TTL its record keeps (see below)
-- ARGV[4] -> the rest of a new slot's record: '' or ';name=value' fields
--            (optional: absent is ''); its caller, when it names one, is
--            who asks; its ';by=0@<token>', when it has one, names the
--            request (see below)
-- ARGV[5] -> '0': shadow mode (the scope's enforce: false): a stream the
--            limit refuses is granted all the same, and counted
--            (optional: absent enforces)
-- returns {granted (1|2|0|-1), used, expires_at_ms, pruned, retry_after_ms, override, {wake ids}, shadow, record, share, extended_from_ms, owed}
--   granted 1      a new slot; 2: the stream held one, now extended (or
--                  asked again, see below: as the first try answered)
--   granted -1     the stream is held by another caller: its slot is left
--                  as it is (expired slots and tickets still go, as on any
--                  call, and pruned and wake ids say so)
--   granted -2     the stream is held by none, and waits in the queue under
--                  another caller (its ticket's record names it): nothing
--                  is added, as for -1
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
--   shadow         1 when the limit would have refused the new slot and
--                  shadow mode granted it (used then counts it, above the
--                  limit); when granted 2, the verdict on the acquire that
--                  took the slot, as its record keeps it (see overLimit):
--                  an extension is never refused, and answers that one's
--                  would_refuse (a retry whose first answer was lost is
--                  told what that answer said); else 0
--   record         when granted 2: the held slot's record, as kept (the
--                  caller compares the pools it names with those asked
--                  for); when granted 1 by a call asked again (see
--                  below), the record its first try wrote; else ''
--   share          when granted: the share of the slot the call's request
--                  holds (0 the one that took it, n the n-th extension;
--                  see sharesOf), 0 else
--   extended_from_ms when this call moved a held slot's expiry later: the
--                  expiry it had before (Redis ms), which the request,
--                  if it gives up, gives back (see release's ARGV[5]);
--                  0 else
--   owed           when denied with slots free (used < the limit): how
--                  many waiting acquires they are owed to (see below),
--                  which refused it: at most limit - used, though wake
--                  ids may name more; 0 else
--
-- Idempotent on the stream id: acquiring a held stream extends it (never
-- shortens it) and leaves used unchanged. A stream belongs to the caller
-- that took it: another caller's acquire of it changes nothing. So does a
-- waiting acquire's place: another caller's acquire of a stream id that
-- waits in the queue takes no slot under it, free or not (its record is
-- read only while the queue holds tickets).
--
-- First come, first served: while acquires wait in the user's queue (live
-- tickets, see wait), the free slots they are owed are theirs, and a new
-- stream is granted only if one is left over and taking it leaves each of
-- them room under its own limit. A ticket whose own limit is reached is
-- owed none (see owed), so it never blocks an acquire under a larger
-- limit. Expired tickets are removed.
--
-- The record of a slot starts with its TTL (ARGV[3]), so that heartbeats
-- and extensions keep the slot by its own TTL whatever happens to its
-- plan (ARGV[3] for a held slot without a record); then
-- ';started=<now>' (Redis ms) and the fields of ARGV[4] (who took it, for
-- what), each after a ';'. A new slot's record is written with it; a held
-- slot keeps the record it has (and gets one if it had none), counting
-- one more extension (';again=<n>' after its head: see again): each
-- request of the stream holding the slot has a share of its own (0 the
-- one that took it, n the n-th extension), which it leaves if it gives
-- up, and the slot goes with the last share (see release's ARGV[3]).
-- The record names the requests that took the shares held (ARGV[4]'s
-- token, see sharesOf): the same request's call asked again, after its
-- reply was lost, changes nothing and is answered the share its first
-- try took, so that the share it leaves if it gives up is that one, not
-- one nobody holds. (The latest eight requests are named: asked again
-- after more than seven others extended the slot in between, it counts
-- one more share, which holds the slot until it expires.) Both keys
-- expire together, at least one TTL and at most two after the latest
-- slot (see below; heartbeat keeps them so too). The override is only
-- read: it has its own expiry.
local key, meta = KEYS[1], KEYS[2]
local queue, expiry, recs = KEYS[4], KEYS[5], KEYS[6]
local member = ARGV[1]
local limit = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local caller = holder(ARGV[4])
local shadow = ARGV[5] == '0'

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local record = ARGV[3] .. ';started=' .. string.format('%d', now) .. (ARGV[4] or '')

-- A support override in force replaces the plan's limit; a scope with no
-- cap has none to replace.
local override = -1
if limit < 2147483647 then
  local o = redis.call('HMGET', KEYS[3], 'limit', 'expires_at')
  if o[1] and o[2] and tonumber(o[2]) > now then
    override = tonumber(o[1])
    limit = override
  end
end

local pruned = prune(key, meta, now)

-- Tickets expired by now go: their servers stopped refreshing them. (A
-- user nobody waits for costs one ZCARD of a missing key.)
local waiting = redis.call('ZCARD', expiry)
if waiting > 0 then
  waiting = waiting - dropDead(queue, expiry, recs, now)
end

-- The live slots, before this call adds one; and those owed to the
-- waiting acquires ahead of it.
local used = redis.call('ZCARD', key)
local taken = used
local due, slack = {}, {}
if waiting > 0 then
  local stop = limit
  if pruned > 0 then
    stop = math.huge -- all those owed the slots pruned are woken
  end
  due, taken, slack = owed(queue, expiry, recs, used, override, stop, key, limit, planOf(ARGV[4]))
end
-- A new stream takes its slot before those owed theirs are granted: only
-- if each of them still fits under its own limit with one more held.
local fits = taken < limit
for _, room in ipairs(slack) do
  fits = fits and room >= 1
end
-- A stream id waiting in the queue under another caller is that caller's,
-- as a held slot is (see extend): no slot is taken under it. (A held one
-- goes by its slot's record.)
local ticket = waiting > 0 and redis.call('HGET', recs, member)
local theirs = ticket and foreign(ticket, caller)
-- A request of a stream whose own ticket (this caller's) is owed one of
-- the free slots under this call's limit takes that slot, none of the
-- others': a retry of the stream, its waiting request's server gone or
-- not. As wait grants the ticket, only while each ticket served before
-- it keeps room under its own limit. The ticket keeps its place until
-- its server, woken by a grant of its stream (see below), finds the
-- stream held and shares the slot (see wait); a gone server's ticket,
-- owed no slot while its stream holds one, lapses. A ticket of the
-- previous release (its order older, see queueOrder) is left its slot:
-- that release's wait shares a held stream's slot only in the ticket's
-- turn, which a slot taken this way would not leave it.
local ahead = math.huge -- the least slack of the tickets served before it
for k, id in ipairs(due) do
  if id == member then
    local _, _, _, _, order = ticketOf(ticket)
    if used + k <= limit and ahead >= 1 and not theirs and order >= queueOrder then
      fits = true
    end
    break
  end
  ahead = math.min(ahead, slack[k])
end
-- Shadow mode: what the limit would refuse is granted, and said to be.
local wouldRefuse = 0
if not fits and shadow then
  fits = true
  wouldRefuse = 1
end
local granted = 0
local expires = 0
local retry = 0
local owedTo = 0
local fresh = false    -- the key was empty (so missing) before this call
local recorded = false -- a record was written to a hash that may be new

-- A held stream is extended (never shortened) and keeps its record (or
-- gets one, if it had none); unless another caller holds it, which is
-- not this call's to extend (granted -1). Its record is read only then:
-- a new stream's acquire reads none.
local held = '' -- the extended slot's record, as kept
local share = 0 -- the share of the slot this request holds (see sharesOf)
local from = 0 -- the held slot's expiry before this call moved it
-- extend(score): extends the held slot, whose expiry is score (Redis ms,
-- as ZSCORE answers it).
local function extend(score)
  local kept = redis.call('HGET', meta, member)
  if caller ~= '' and foreign(kept, caller) then
    granted = -1
    return
  end
  local mine = tokenOf(record)
  granted = 2
  -- The slot moves by the TTL its record keeps, as its heartbeats move
  -- it, not by its plan's now: a plan whose TTL was raised since leaves
  -- a slot whose holder stops for no longer than the TTL it was answered.
  -- (So do the keys' expiries below.)
  ttl = ownTTL(kept, ttl)
  expires = tonumber(score)
  local owned = kept and ownedShare(kept, mine)
  if not owned and now + ttl > expires then
    from, expires = expires, now + ttl
  end
  if not kept then
    redis.call('ZADD', key, 'GT', now + ttl, member)
    kept = record
    recorded = redis.call('HSET', meta, member, kept) == 1
  elseif owned then
    -- This request's own call, asked again after its reply was lost: it
    -- holds the share its first try took, which is answered as it was
    -- (a new slot for share 0, with its record), not counted twice.
    share = owned
    if owned == 0 then
      granted = 1
    end
  else
    if from == 0 then
      -- Held as late as this call would extend it, or later: another
      -- request of the stream moved it (in this ms, or by a longer TTL),
      -- which it gives back if it gives up (see release), from under the
      -- expiry this call answers. One ms more makes it this call's own:
      -- the other, giving up, finds it moved since and gives nothing
      -- back; this request gives back the ms.
      from, expires = expires, expires + 1
      redis.call('ZADD', key, 'XX', string.format('%d', expires), member)
    else
      redis.call('ZADD', key, 'GT', now + ttl, member)
    end
    kept = extended(kept, mine)
    redis.call('HSET', meta, member, kept)
    share = again(kept)
  end
  held = kept
end

if theirs and not redis.call('ZSCORE', key, member) then
  granted = -2
  wouldRefuse = 0
elseif fits then
  -- NX adds a new stream and answers 1; 0 means it is held already.
  if redis.call('ZADD', key, 'NX', now + ttl, member) == 1 then
    if wouldRefuse == 1 then
      record = overLimit(record) -- for its call asked again to say so too
    end
    redis.call('HSET', meta, member, record)
    granted = 1
    expires = now + ttl
    fresh = used == 0
    used = used + 1
  else
    extend(redis.call('ZSCORE', key, member))
    wouldRefuse = 0 -- a held stream is extended, whatever the limit
  end
else
  local score = redis.call('ZSCORE', key, member)
  if score then
    extend(score)
  end
end
if held ~= '' and wasOverLimit(held) then
  -- A held slot (extended, or retaken by its request's call asked again)
  -- answers the verdict on the acquire that took it, which its record
  -- keeps.
  wouldRefuse = 1
end

if granted < 0 then
  -- Another caller's stream, held or waiting: left as it is.
elseif granted > 0 then
  -- Both keys outlive the slot by at least one TTL, so slots that expire
  -- unreleased stay visible for the next call to prune and count. As a
  -- heartbeat does, their expiry moves only when it must, and then to two
  -- TTLs past the slot: a user's next acquires within a TTL write the
  -- slot alone. A fresh key has no expiry yet, nor has a records hash
  -- this call wrote the first field of (its slots' hash was lost).
  local current = -1
  if not fresh then
    current = redis.call('PEXPIRETIME', key)
  end
  if current < expires + ttl or recorded then
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
  -- Free slots, owed to the acquires waiting for them: those served
  -- first, one a slot. After a prune due runs on past the limit (every
  -- ticket owed a slot under its own, larger, limit is woken), and those
  -- past it are owed none of this limit's free slots.
  owedTo = math.min(#due, limit - used)
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
-- them; and the stream's own ticket, when it is granted: the waiting
-- request shares the slot at once.
local wake = {}
if pruned > 0 then
  wake = due
end
if ticket and not theirs and granted > 0 then
  local named = false
  for _, id in ipairs(wake) do
    named = named or id == member
  end
  if not named then
    wake[#wake + 1] = member
  end
end

return {granted, used, expires, pruned, retry, override, wake, wouldRefuse, held, share, from, owedTo}
