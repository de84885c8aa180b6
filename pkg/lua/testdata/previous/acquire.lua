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
--            in force replaces it
-- ARGV[3] -> slot ttl (ms, > 0, decimal digits)
-- ARGV[4] -> the rest of a new slot's record: '' or ';name=value' fields
--            (optional: absent is ''); its caller, when it names one, is
--            who asks; its ';by=0@<token>', when it has one, names the
--            request (see below)
-- ARGV[5] -> '0': shadow mode (the scope's enforce: false): a stream the
--            limit refuses is granted all the same, and counted
--            (optional: absent enforces)
-- returns {granted (1|2|0|-1), used, expires_at_ms, pruned, retry_after_ms, override, {wake ids}, shadow, record}
--   granted 1      a new slot; 2: the stream held one, now extended (or
--                  asked again, see below: as the first try answered)
--   granted -1     the stream is held by another caller: its slot is left
--                  as it is (expired slots and tickets still go, as on any
--                  call, and pruned and wake ids say so)
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
--                  limit), else 0
--   record         when granted 2: the held slot's record, as kept (the
--                  caller compares the pools it names with those asked
--                  for, and reads its count of extensions); when granted
--                  1 by a call asked again (see below), the record its
--                  first try wrote; else ''
--
-- Idempotent on the stream id: acquiring a held stream extends it (never
-- shortens it) and leaves used unchanged. A stream belongs to the caller
-- that took it: another caller's acquire of it changes nothing.
--
-- First come, first served: while acquires wait in the user's queue (live
-- tickets, see wait), the free slots they are owed are theirs, and a new
-- stream is granted only if one is left over and taking it leaves each of
-- them room under its own limit. A ticket whose own limit is reached is
-- owed none (see owed), so it never blocks an acquire under a larger
-- limit. Expired tickets are removed.
--
-- The record of a slot starts with its TTL (ARGV[3]), so that heartbeats
-- keep the slot by its own TTL whatever happens to its plan; then
-- ';started=<now>' (Redis ms) and the fields of ARGV[4] (who took it, for
-- what), each after a ';'. A new slot's record is written with it; a held
-- slot keeps the record it has (and gets one if it had none), counting
-- one more extension (';again=<n>' after its head: see again): each
-- request of the stream holding the slot has a share of its own (0 the
-- one that took it, n the n-th extension), which it leaves if it gives
-- up, and the slot goes with the last share (see release's ARGV[3]).
-- The record names the request that took the latest share (ARGV[4]'s
-- token, see sharesOf): the same request's call asked again, after
-- its reply was lost, changes nothing and is answered the share its
-- first try took, so that the share it leaves if it gives up is that one,
-- not one nobody holds. (Only the latest share's token is kept: asked
-- again after another request extended the slot in between, it counts
-- one more share, which holds the slot until it expires.) Both keys
-- expire together, at least one TTL and at most two after the latest
-- slot (see below; heartbeat keeps them so too). The override is only
-- read: it has its own expiry.
-- prune(key, meta, now): removes the members of the sorted set key whose
-- score (expiry, Redis ms) is at or before now, with their records in the
-- hash meta; returns how many. A slot that expired unreleased is counted
-- here: the leak signal. (A script that extends members must prune first:
-- ZADD XX would extend an expired one.)
local function prune(key, meta, now)
  local at = string.format('%d', now)
  local expired = redis.call('ZRANGEBYSCORE', key, '-inf', at)
  local n = #expired
  if n > 0 then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', at)
    -- In chunks: unpack is bounded by the Lua stack.
    for i = 1, n, 1000 do
      redis.call('HDEL', meta, unpack(expired, i, math.min(i + 999, n)))
    end
  end
  return n
end

-- holder(record): the caller a slot's (or a ticket's) record names, ''
-- when none. The caller is the first field after the TTL and start (see
-- pkg/lua/records.go), so only that place is read: fields after it (a
-- user id, a label) may hold any character, ';caller=' too.
local function holder(record)
  if not record then
    return ''
  end
  return string.match(record, '^%d*;started=%d+;caller=([^;]*)')
    or string.match(record, '^%d*;caller=([^;]*)') or ''
end

-- foreign(record, caller): whether the record names a caller other than
-- caller. A call with no caller (an open API) and a record with none (a
-- slot taken while the API was open) are nobody's: never foreign.
local function foreign(record, caller)
  if caller == '' then
    return false
  end
  local h = holder(record)
  return h ~= '' and h ~= caller
end

-- The head of a record that has a start: its TTL, its start and its
-- caller (if it names one), which an extension count follows (see
-- again); nil for a record without a start (an older version's).
local function recordHead(record)
  return string.match(record, '^%d*;started=%d+;caller=[^;]*')
    or string.match(record, '^%d*;started=%d+')
end

-- sharesOf(record): a record with a start, taken apart where it keeps its
-- shares: its head; n, how many acquires of the stream extended its slot
-- (or membership) after the one that took it (';again=<n>' right after
-- the head, 0 when none: the n-th holds share n, see leave); the shares
-- given up (';left=<i>.<j>', '' when none); the request that took the
-- latest share, as '<n>@<token>' (';by=', '' when none: see owned; a
-- '!' after it says that shadow mode let a new slot in over its limit,
-- for its call asked again to say so too); and
-- the rest. Nil for a record without a start (an older version's), which
-- counts no extensions. Read at that place only, as holder reads the
-- caller: a label or a user id may hold ';again=' too. The previous
-- version knew again and left only, and kept what follows them as it
-- was: so by comes last, and names its share, which an extension by that
-- version leaves behind.
local function sharesOf(record)
  local head = recordHead(record)
  if not head then
    return nil
  end
  local rest = string.sub(record, #head + 1)
  local n, after = string.match(rest, '^;again=(%d+)(.*)$')
  if not n then
    n, after = '0', rest
  end
  local list, tail = string.match(after, '^;left=([%d%.]*)(.*)$')
  if list then
    after = tail
  else
    list = ''
  end
  local by
  by, tail = string.match(after, '^;by=(%d+@[%w_%-]+!?)(.*)$')
  if by then
    after = tail
  else
    by = ''
  end
  return head, tonumber(n), list, by, after
end

-- withShares(head, n, list, by, rest): the record sharesOf took apart.
local function withShares(head, n, list, by, rest)
  local s = head
  if n > 0 then
    s = s .. ';again=' .. string.format('%d', n)
    if list ~= '' then
      s = s .. ';left=' .. list
    end
  end
  if by ~= '' then
    s = s .. ';by=' .. by
  end
  return s .. rest
end

-- isLeft(list, share): whether share is in list, the shares given up.
local function isLeft(list, share)
  for s in string.gmatch(list, '%d+') do
    if tonumber(s) == share then
      return true
    end
  end
  return false
end

-- again(record): the record's count of extensions (see sharesOf), 0 when
-- none.
local function again(record)
  if not record then
    return 0
  end
  local _, n = sharesOf(record)
  return n or 0
end

-- tokenOf(record): the token of the request that took the record's
-- latest share (see sharesOf), '' when none: what a new slot's record,
-- as a request writes it (';by=0@<token>'), names.
local function tokenOf(record)
  local _, _, _, by = sharesOf(record)
  return string.match(by or '', '@([%w_%-]*)') or ''
end

-- owned(record, token): whether the request of token (not '') took the
-- record's latest share and has not left it: its call, asked again after
-- the reply was lost, which changes nothing and is answered that share.
local function owned(record, token)
  local head, n, list, by = sharesOf(record)
  local mine = string.format('%d', n) .. '@' .. token
  return token ~= '' and head ~= nil and (by == mine or by == mine .. '!')
    and not isLeft(list, n)
end

-- overLimit(record): the record of a new slot, marked as let in over its
-- limit by shadow mode (see sharesOf), when it names its request; as it
-- is when it does not.
local function overLimit(record)
  local head, n, list, by, rest = sharesOf(record)
  if not head or by == '' then
    return record
  end
  return withShares(head, n, list, by .. '!', rest)
end

-- wasOverLimit(record): whether the record says shadow mode let its
-- slot in over its limit (see overLimit).
local function wasOverLimit(record)
  local _, _, _, by = sharesOf(record)
  return string.sub(by or '', -1) == '!'
end

-- extended(record, token): the record of a slot one more acquire
-- extended, by the request of token ('' for none), which is named as
-- the latest share's (see owned). A record without a start is not
-- counted (again reads 0 of it).
local function extended(record, token)
  local head, n, list, _, rest = sharesOf(record)
  if not head then
    return record
  end
  local by = ''
  if token ~= '' then
    by = string.format('%d', n + 1) .. '@' .. token
  end
  return withShares(head, n + 1, list, by, rest)
end

-- startedAt(record): the record's start (Redis ms, as written), '' when
-- it has none.
local function startedAt(record)
  return string.match(record, '^%d*;started=(%d+)') or ''
end

-- leave(record, share, start): the request that holds share of a
-- stream's slot (0: the acquire that took it; n: the n-th that extended
-- it, see again) gives it up. The requests that gave theirs up are
-- listed in ';left=' after the count, so that a leave asked again
-- changes nothing more. Answers true when every share has gone (the slot
-- goes), the record to keep while another request holds one, and false
-- when the record is not known to be of the slot the share is of: it
-- counts fewer extensions, or it started at another time than start (a
-- later slot of the stream, taken after that one was released), or start
-- is '' (a share whose grant's answer was lost: it may be another
-- request's). A record without a start (an older version's) counts no
-- extensions: share 0 of it leaves it.
local function leave(record, share, start)
  local head, n, list, by, rest = sharesOf(record)
  if not head then
    return share == 0
  end
  if startedAt(record) ~= start then
    return false
  end
  if share > n then
    return false
  end
  local gone, count = {}, 0
  for s in string.gmatch(list, '%d+') do
    if not gone[s] then
      gone[s], count = true, count + 1
    end
  end
  local mine = string.format('%d', share)
  if not gone[mine] then
    if #list > 200 then
      return record -- a list that long is not grown: the slot expires
    end
    count = count + 1
    if list == '' then
      list = mine
    else
      list = list .. '.' .. mine
    end
  end
  if count > n then
    return true
  end
  return withShares(head, n, list, by, rest)
end

-- The tickets of a queue (see wait): queue is the sorted set of tickets by
-- arrival, expiry their expiries (Redis ms), recs their records (hash:
-- field = stream id, value = '<limit>' then ';caller=<name>' when one is
-- recorded). A ticket's limit is its plan's: the most slots its acquire may
-- be granted while holding the others.

-- dropDead(queue, expiry, recs, now): removes the tickets expired by now
-- (their servers stopped refreshing them); returns how many.
local function dropDead(queue, expiry, recs, now)
  local dead = redis.call('ZRANGEBYSCORE', expiry, '-inf', string.format('%d', now))
  local n = #dead
  if n > 0 then
    redis.call('ZREMRANGEBYSCORE', expiry, '-inf', string.format('%d', now))
    for i = 1, n, 1000 do
      local chunk = {unpack(dead, i, math.min(i + 999, n))}
      redis.call('ZREM', queue, unpack(chunk))
      redis.call('HDEL', recs, unpack(chunk))
    end
  end
  return n
end

-- dropTicket(queue, expiry, recs, id): takes one ticket out of the queue.
local function dropTicket(queue, expiry, recs, id)
  redis.call('ZREM', queue, id)
  redis.call('ZREM', expiry, id)
  redis.call('HDEL', recs, id)
end

-- ticketOf(rec): the limit, priority, user and plan a ticket's record
-- names. The record is the ticket's limit, then its stream's slot record
-- fields (see pkg/lua/records.go): ';caller=', ';plan=', ';pools=' and
-- ';prio=' hold no ';', the user id goes with its length and the label
-- runs to the end, so the fields are read in order up to the user. A
-- record with no limit (queued by an earlier version, or a slot's record
-- with no ticket's limit before it) fits any; no priority is 0; no user
-- (a user's own queue) and no plan are ''.
local function ticketOf(rec)
  if not rec then
    return math.huge, 0, '', ''
  end
  local limit = tonumber((string.match(rec, '^%d+'))) or math.huge -- (): one value, nil when none (the embedded store's match returns none)
  local prio, user, plan = 0, '', ''
  local pos = string.find(rec, ';', 1, true)
  while pos do
    local name, from = string.match(rec, '^;(%a+)=()', pos)
    if not name or name == 'label' then
      break
    end
    if name == 'user' then
      local n, at = string.match(rec, '^(%d+):()', from)
      if n then
        user = string.sub(rec, at, at + tonumber(n) - 1)
      end
      break
    end
    pos = string.find(rec, ';', from, true)
    if name == 'prio' then
      prio = tonumber(string.sub(rec, from, (pos or 0) - 1)) or 0
    elseif name == 'plan' then
      plan = string.sub(rec, from, (pos or 0) - 1)
    end
  end
  return limit, prio, user, plan
end

-- planOf(rec): the plan a slot's or ticket's record names ('' for none).
local function planOf(rec)
  local _, _, _, plan = ticketOf(rec)
  return plan
end

-- liveTickets(queue, expiry, recs): the live tickets, in arrival order,
-- each {id, limit, prio, user, plan} as its record names them (ticketOf),
-- read a hundred at a time; and whether any names a user (a pool key's
-- queue).
local function liveTickets(queue, expiry, recs)
  local tickets, users = {}, false
  local from = 0
  while true do
    local ids = redis.call('ZRANGE', queue, from, from + 99)
    if #ids == 0 then
      break
    end
    from = from + #ids
    local live = redis.call('ZMSCORE', expiry, unpack(ids))
    local rec = redis.call('HMGET', recs, unpack(ids))
    for i, id in ipairs(ids) do
      if live[i] then
        local limit, prio, user, plan = ticketOf(rec[i])
        tickets[#tickets + 1] = {id = id, limit = limit, prio = prio, user = user, plan = plan}
        users = users or user ~= ''
      end
    end
  end
  return tickets, users
end

-- heldBy(slots, count): adds to count[user] the members of slots each
-- user holds (a pool key's members are '<stream id> <user id>').
local function heldBy(slots, count)
  for _, member in ipairs(redis.call('ZRANGE', slots, 0, -1)) do
    local user = string.match(member, ' (.*)$')
    if user then
      count[user] = (count[user] or 0) + 1
    end
  end
  return count
end

-- owed(queue, expiry, recs, used, override, stop, slots, cap, plan): the live
-- tickets owed a slot, in the order they are served; the slots taken then
-- (used plus them); and each owed ticket's slack: how many more slots may
-- be granted ahead of it before it no longer fits under its own limit.
--
-- The order (DESIGN §17): the highest priority first; within one, the
-- ticket whose user holds the fewest members of slots (a pool key's
-- members are '<stream id> <user id>'), counting those owed to the
-- tickets served before it; then arrival. A user's own queue has no user
-- in its tickets, so there it is priority, then arrival.
--
-- A ticket is owed a slot while fewer slots than its own limit (override,
-- when one is in force, else its record's) are taken, counting those owed
-- to the tickets served before it. When the caller knows the limit of
-- the scope as it is now (cap >= 0), it holds at once for the tickets it
-- bounds, rather than the one recorded when they queued, so that a limit
-- lowered or raised meanwhile, or a scope put in shadow mode (a cap no
-- ticket reaches), holds for them: a pool key's tickets (those naming a
-- user) all wait for the key's one cap, and a user's own tickets of
-- plan, the caller's, for that plan's limit. A ticket whose limit is
-- reached is passed over: it holds no place against an acquire it could not itself
-- be granted the slot of, so a waiter of one plan never blocks the user's
-- acquires under a larger one. The selection ends once stop slots are
-- taken (math.huge: never): a caller that only needs to know whether a
-- slot is left over.
local function owed(queue, expiry, recs, used, override, stop, slots, cap, plan)
  local out, slack, taken = {}, {}, used
  if taken >= stop then
    return out, taken, slack
  end
  -- Every live ticket: the order depends on all of them.
  local tickets, users = liveTickets(queue, expiry, recs)
  for _, t in ipairs(tickets) do
    if cap >= 0 and (t.user ~= '' or (plan ~= '' and t.plan == plan)) then
      t.limit = cap
    end
    if override >= 0 then
      t.limit = override
    end
  end
  -- How many members each user holds, when the tickets name users.
  local held = {}
  if users then
    heldBy(slots, held)
  end
  local served = {}
  while taken < stop do
    local best, bestHeld
    for i, t in ipairs(tickets) do
      if not served[i] and taken < t.limit then
        local h = held[t.user] or 0
        if not best or t.prio > tickets[best].prio or (t.prio == tickets[best].prio and h < bestHeld) then
          best, bestHeld = i, h
        end
      end
    end
    if not best then
      break
    end
    local t = tickets[best]
    served[best] = true
    taken = taken + 1
    held[t.user] = bestHeld + 1
    out[#out + 1] = t.id
    slack[#slack + 1] = t.limit - taken
  end
  return out, taken, slack
end

-- fullQueue(queue, expiry, recs, slots): what displace weighs, read once
-- per call that finds the queue full: its live tickets in arrival order,
-- each with its priority and user, and how many of slots' members each
-- user holds and how many tickets it has.
local function fullQueue(queue, expiry, recs, slots)
  local tickets, users = liveTickets(queue, expiry, recs)
  local q = {tickets = tickets, count = {}}
  for _, t in ipairs(tickets) do
    q.count[t.user] = (q.count[t.user] or 0) + 1
  end
  if users then
    heldBy(slots, q.count)
  end
  return q
end

-- displace(q, queue, expiry, recs, id, prio, user): for a full queue (q,
-- see fullQueue) and a new ticket id of priority prio and user's: takes
-- out the ticket that would be served last, and returns its id, when the
-- new one would be served before it (see owed), noting the swap in q for
-- the call's next new ticket; else changes nothing and returns nil. So
-- a full queue holds the tickets served first, and one user's many
-- tickets do not shut out a user with none (DESIGN §17), nor lower
-- priorities a higher one.
--
-- The last is of the lowest priority; within it, of the user who holds
-- and waits for the most members of the key (a user's own queue names no
-- user: all alike); then the latest to arrive. The new ticket goes
-- before it when its priority is higher, or, at the same priority, when
-- its user holds and waits for fewer than that user, less the one taken
-- out.
local function displace(q, queue, expiry, recs, id, prio, user)
  -- The last, found again only after a swap: a call whose new tickets
  -- displace none reads the queue's tickets once.
  local last = q.last
  if not last then
    -- In arrival order: a later ticket of the same rank is later served.
    for k, t in ipairs(q.tickets) do
      if not t.gone then
        local l = last and q.tickets[last]
        if not l or t.prio < l.prio or (t.prio == l.prio and q.count[t.user] >= q.count[l.user]) then
          last = k
        end
      end
    end
    q.last = last
  end
  if not last then
    return nil
  end
  local l = q.tickets[last]
  if prio > l.prio or (prio == l.prio and user ~= l.user and (q.count[user] or 0) < q.count[l.user] - 1) then
    dropTicket(queue, expiry, recs, l.id)
    l.gone, q.last = true, nil
    q.count[l.user] = q.count[l.user] - 1
    q.tickets[#q.tickets + 1] = {id = id, prio = prio, user = user}
    q.count[user] = (q.count[user] or 0) + 1
    return l.id
  end
  return nil
end

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

-- A support override in force replaces the plan's limit.
local override = -1
local o = redis.call('HMGET', KEYS[3], 'limit', 'expires_at')
if o[1] and o[2] and tonumber(o[2]) > now then
  override = tonumber(o[1])
  limit = override
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
-- Shadow mode: what the limit would refuse is granted, and said to be.
local wouldRefuse = 0
if not fits and shadow then
  fits = true
  wouldRefuse = 1
end
local granted = 0
local expires = 0
local retry = 0
local fresh = false    -- the key was empty (so missing) before this call
local recorded = false -- a record was written to a hash that may be new

-- A held stream is extended (never shortened) and keeps its record (or
-- gets one, if it had none); unless another caller holds it, which is
-- not this call's to extend (granted -1). Its record is read only then:
-- a new stream's acquire reads none.
local held = '' -- the extended slot's record, as kept
local retaken = false -- this request took the slot in a try whose reply was lost
local function extend()
  local kept = redis.call('HGET', meta, member)
  if caller ~= '' and foreign(kept, caller) then
    granted = -1
    return
  end
  local mine = tokenOf(record)
  granted = 2
  if not kept then
    redis.call('ZADD', key, 'GT', now + ttl, member)
    kept = record
    recorded = redis.call('HSET', meta, member, kept) == 1
  elseif owned(kept, mine) then
    -- This request's own call, asked again after its reply was lost: it
    -- holds the share its first try took, which is answered as it was
    -- (a new slot for share 0, with its record), not counted twice.
    if again(kept) == 0 then
      granted = 1
      retaken = true
    end
  else
    redis.call('ZADD', key, 'GT', now + ttl, member)
    kept = extended(kept, mine)
    redis.call('HSET', meta, member, kept)
  end
  held = kept
  expires = tonumber(redis.call('ZSCORE', key, member))
end

if fits then
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
    extend()
    wouldRefuse = 0 -- a held stream is extended, whatever the limit
  end
elseif redis.call('ZSCORE', key, member) then
  extend()
end
if retaken then
  -- As its first try answered, which its record keeps.
  wouldRefuse = 0
  if wasOverLimit(held) then
    wouldRefuse = 1
  end
end

if granted < 0 then
  -- Another caller's stream: left as it is.
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
if pruned > 0 then
  wake = due
end

return {granted, used, expires, pruned, retry, override, wake, wouldRefuse, held}
