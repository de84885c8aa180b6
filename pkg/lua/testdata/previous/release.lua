-- release: give a slot back. Releasing a missing slot is not an error.
--
-- KEYS[1] -> <prefix>{<user id>}           sorted set: member = stream id, score = expiry (Redis ms)
-- KEYS[2] -> <prefix>{<user id>}:meta      hash: field = stream id, value = the slot's record
-- KEYS[3] -> <prefix>{<user id>}:q         sorted set of waiting acquires' tickets (see wait)
-- KEYS[4] -> <prefix>{<user id>}:q:expiry  sorted set: member = stream id, score = ticket expiry (Redis ms)
-- KEYS[5] -> <prefix>{<user id>}:q:rec     hash: field = stream id, value = the ticket's record (see wait)
-- KEYS[6] -> <prefix>{<user id>}:override  hash: support's override of the limit (see set_override)
-- ARGV[1] -> stream id
-- ARGV[2] -> who releases: a caller name, '' for none (optional: absent is '')
-- ARGV[3] -> the share of the slot the request that releases it holds,
--            when that request gives up (see acquire): 0 for the acquire
--            that took it, n for its n-th extension. Several requests of
--            one stream (a client's retries) may hold it at once; each
--            that gives up leaves its share, and the slot goes with the
--            last (see lib_holder.lua's leave). Optional: absent or ''
--            releases the slot whatever its shares.
-- ARGV[4] -> with ARGV[3]: the slot's start (Redis ms) as the request
--            knew it, so that a later slot of the stream is not left
--            for it; a slot whose record has a start is not left for a
--            share without one (absent or '')
-- returns {released (1|0|-1|-2), pruned, head, record}
--   released 0: the slot was not held (never, already released, or expired)
--   released -1: the slot is held by another caller (its record names
--   one other than ARGV[2]): nothing changed
--   released -2: another request of the stream holds a share of the slot
--   still (ARGV[3]'s left), or the slot is not the one the share was of:
--   it is kept
--   pruned: the user's slots that had expired unreleased, removed now
--   head: the stream id of the first acquire in the user's queue owed a
--   slot (see owed) when this call freed one (released or pruned), ''
--   when none is: the caller wakes it (see wait), whose server grants it
--   the slot or wakes the next ones owed one.
--   record: the released slot's record ('' when none): the pool keys it
--   names are the memberships the caller drops (see pkg/lua/records.go)
--   The slot's record goes with it, as do those of pruned slots.
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
local queue, expiry, recs = KEYS[3], KEYS[4], KEYS[5]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local record = redis.call('HGET', meta, ARGV[1])
if foreign(record, ARGV[2] or '') then
  return {-1, 0, '', ''}
end
if (ARGV[3] or '') ~= '' then
  local kept = true
  if record then
    kept = leave(record, tonumber(ARGV[3]), ARGV[4] or '')
  elseif ARGV[3] ~= '0' then
    kept = false -- an extension's share of a slot without a record
  end
  if kept ~= true then
    if kept then
      redis.call('HSET', meta, ARGV[1], kept)
    end
    return {-2, 0, '', ''}
  end
end

local pruned = prune(key, meta, now)
local released = redis.call('ZREM', key, ARGV[1])
redis.call('HDEL', meta, ARGV[1])
if released == 0 then
  record = false
end

local head = ''
if released + pruned > 0 and redis.call('EXISTS', queue) == 1 then
  local override = -1
  local o = redis.call('HMGET', KEYS[6], 'limit', 'expires_at')
  if o[1] and o[2] and tonumber(o[2]) > now then
    override = tonumber(o[1])
  end
  local used = redis.call('ZCARD', key)
  local due = owed(queue, expiry, recs, used, override, used + 1, KEYS[1], -1, '')
  head = due[1] or ''
end
return {released, pruned, head, record or ''}
