-- The tickets of a queue (see wait): queue is the sorted set of tickets by
-- arrival, expiry their expiries (Redis ms), recs their records (hash:
-- field = stream id, value = '<limit>' then ';caller=<name>' when one is
-- recorded, then ';order=<n>', see ticketRecord). A ticket's limit is its
-- plan's: the most slots its acquire may be granted while holding the
-- others.

-- queueOrder names the order this release serves a queue in (see owed):
-- 2, the fewest waiting before arrival, on keys of at most heldCounted
-- holdings weighed. The previous release's order (1, named by no ticket)
-- weighs holdings always, then goes by arrival. While a rolling update
-- runs, replicas of both serve one queue: were each to serve its own,
-- each would find the other's ticket owed a free place and wake it, and
-- the place would go unused while they woke each other. So a queue is
-- served in the oldest order a live ticket names (the previous release
-- skips the field), and in this one once every ticket is this release's.
local queueOrder = 2

-- ticketRecord(limit, rest): the record of a ticket of limit whose slot's
-- record has the fields rest ('' or ';name=value' fields): the order of
-- this release after the caller, which holder reads right after the limit.
local function ticketRecord(limit, rest)
  local caller, after = string.match(rest, '^(;caller=[^;]*)(.*)$')
  if not caller then
    caller, after = '', rest
  end
  return limit .. caller .. ';order=' .. string.format('%d', queueOrder) .. after
end

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

-- ticketOf(rec): the limit, priority, user, plan and order (see
-- queueOrder) a ticket's record names. The record is the ticket's limit,
-- its order, then its stream's slot record fields (see
-- pkg/lua/records.go): ';caller=', ';order=', ';plan=', ';pools=' and
-- ';prio=' hold no ';', the user id goes with its length and the label
-- runs to the end, so the fields are read in order up to the user. A
-- record with no limit (queued by an earlier version, or a slot's record
-- with no ticket's limit before it) fits any; no priority is 0; no user
-- (a user's own queue) and no plan are ''; no order (the previous
-- release's ticket) is 1.
local function ticketOf(rec)
  if not rec then
    return math.huge, 0, '', '', 1
  end
  local limit = tonumber((string.match(rec, '^%d+'))) or math.huge -- (): one value, nil when none (the embedded store's match returns none)
  local prio, user, plan, order = 0, '', '', 1
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
    elseif name == 'order' then
      order = tonumber(string.sub(rec, from, (pos or 0) - 1)) or 1
    end
  end
  return limit, prio, user, plan, order
end

-- planOf(rec): the plan a slot's or ticket's record names ('' for none).
local function planOf(rec)
  local _, _, _, plan = ticketOf(rec)
  return plan
end

-- liveTickets(queue, expiry, recs): the live tickets, in arrival order,
-- each {id, limit, prio, user, plan} as its record names them (ticketOf),
-- read a hundred at a time; whether any names a user (a pool key's
-- queue); and the oldest order they name, the one to serve them in (see
-- queueOrder).
local function liveTickets(queue, expiry, recs)
  local tickets, users, oldest = {}, false, queueOrder
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
        local limit, prio, user, plan, order = ticketOf(rec[i])
        tickets[#tickets + 1] = {id = id, limit = limit, prio = prio, user = user, plan = plan}
        users = users or user ~= ''
        oldest = math.min(oldest, order)
      end
    end
  end
  return tickets, users, oldest
end

-- heldCounted: the most members of a pool key whose users' holdings the
-- order of its waiters counts (see owed). Counting reads every member,
-- about half a microsecond of Redis's time each, on every call to a key
-- whose queue holds tickets, its acquires' included; a key of 100,000
-- would hold Redis 50 ms a call. Above it, users' holdings are not
-- weighed: all alike. (The previous release's order weighs them on any
-- key: see queueOrder.)
local heldCounted = 1000

-- heldBy(slots, count, all): adds to count[user] the members of slots each
-- user holds (a pool key's members are '<stream id> <user id>'); none
-- when slots holds more than heldCounted, unless all.
local function heldBy(slots, count, all)
  if not all and redis.call('ZCARD', slots) > heldCounted then
    return count
  end
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
-- members are '<stream id> <user id>'; not weighed on a key of more
-- than heldCounted), counting those owed to the tickets served before
-- it; then the one whose user waits for the fewest; then arrival. Without the waiting, a key whose streams end
-- before the next place frees would serve one user's many waiters all
-- before the users behind them with one each: each time, that user
-- would again hold none. A user's own queue has no user in its
-- tickets, so there it is priority, then arrival. While a live ticket
-- is the previous release's, the order is that release's (see
-- queueOrder): holdings weighed on any key, the waiting not weighed.
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
  local tickets, users, order = liveTickets(queue, expiry, recs)
  local weighWaiting = order >= queueOrder
  for _, t in ipairs(tickets) do
    if cap >= 0 and (t.user ~= '' or (plan ~= '' and t.plan == plan)) then
      t.limit = cap
    end
    if override >= 0 then
      t.limit = override
    end
  end
  -- How many members each user holds, and tickets it has, when the
  -- tickets name users.
  local held, waiting = {}, {}
  if users then
    heldBy(slots, held, not weighWaiting)
    for _, t in ipairs(tickets) do
      waiting[t.user] = (waiting[t.user] or 0) + 1
    end
  end
  local served = {}
  while taken < stop do
    local best, bestHeld, bestWaiting
    for i, t in ipairs(tickets) do
      if not served[i] and taken < t.limit then
        local h, w = held[t.user] or 0, 0
        if weighWaiting then
          w = waiting[t.user] or 0
        end
        if not best or t.prio > tickets[best].prio or (t.prio == tickets[best].prio and
            (h < bestHeld or (h == bestHeld and w < bestWaiting))) then
          best, bestHeld, bestWaiting = i, h, w
        end
      end
    end
    if not best then
      break
    end
    local t = tickets[best]
    served[best] = true
    taken = taken + 1
    held[t.user], waiting[t.user] = bestHeld + 1, (waiting[t.user] or 0) - 1
    out[#out + 1] = t.id
    slack[#slack + 1] = t.limit - taken
  end
  return out, taken, slack
end

-- fullQueue(queue, expiry, recs, slots): what displace weighs, read once
-- per call that finds the queue full: its live tickets in arrival order,
-- each with its priority and user, how many of slots' members each user
-- holds and how many tickets it has, how many of each user's tickets
-- are of each priority, and whether it is served in the previous
-- release's order (see queueOrder).
local function fullQueue(queue, expiry, recs, slots)
  local tickets, users, order = liveTickets(queue, expiry, recs)
  local q = {tickets = tickets, held = {}, waiting = {}, count = {}, previous = order < queueOrder}
  for _, t in ipairs(tickets) do
    q.waiting[t.user] = (q.waiting[t.user] or 0) + 1
    local c = q.count[t.user] or {}
    c[t.prio] = (c[t.prio] or 0) + 1
    q.count[t.user] = c
  end
  if users then
    heldBy(slots, q.held, q.previous)
  end
  return q
end

-- aheadOf(q, user, prio): how many of user's tickets in the full queue q
-- owed serves before a ticket of user's of priority prio arriving now:
-- those of a higher priority, and those of prio (earlier arrivals).
local function aheadOf(q, user, prio)
  local n = 0
  for p, c in pairs(q.count[user] or {}) do
    if p >= prio then
      n = n + c
    end
  end
  return n
end

-- ticketRank(q, user, prio, before): the place in owed's order of a
-- ticket of user's, of priority prio, with before of its user's tickets served
-- before it: owed serves a user's tickets in arrival order within a
-- priority, counting each one served as held and no longer waited for,
-- so its order is the tickets sorted by priority (higher first), then
-- the user's holdings counting those served before (fewer first), then
-- the tickets left to it (fewer first; all alike in the previous
-- release's order), then arrival.
local function ticketRank(q, user, prio, before)
  if q.previous then
    return prio, (q.held[user] or 0) + before, 0
  end
  return prio, (q.held[user] or 0) + before, (q.waiting[user] or 0) - before
end

-- servedFirst(pa, ha, wa, pb, hb, wb): whether a ticket ranked (pa, ha,
-- wa) is served before one ranked (pb, hb, wb), leaving arrival aside.
local function servedFirst(pa, ha, wa, pb, hb, wb)
  if pa ~= pb then
    return pa > pb
  end
  if ha ~= hb then
    return ha < hb
  end
  return wa < wb
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
-- The last is the one owed would serve last (see ticketRank). The new
-- ticket goes before it when it would be served before it were that one to
-- arrive again after it: strictly, so that two users' tickets never
-- displace each other in turn.
local function displace(q, queue, expiry, recs, id, prio, user)
  -- The last, found again only after a swap: a call whose new tickets
  -- displace none reads the queue's tickets once.
  local last = q.last
  if not last then
    local seen, lp, lh, lw = {}
    for k, t in ipairs(q.tickets) do
      if not t.gone then
        -- Its user's of a higher priority, and those of its own that
        -- came before it.
        local s = seen[t.user] or {}
        local before = aheadOf(q, t.user, t.prio) - q.count[t.user][t.prio] + (s[t.prio] or 0)
        s[t.prio] = (s[t.prio] or 0) + 1
        seen[t.user] = s
        local p, h, w = ticketRank(q, t.user, t.prio, before)
        -- In arrival order: a later ticket of the same rank is later served.
        if not last or not servedFirst(p, h, w, lp, lh, lw) then
          last, lp, lh, lw = k, p, h, w
        end
      end
    end
    q.last = last
  end
  if not last or q.tickets[last].user == user and q.tickets[last].prio >= prio then
    return nil
  end
  local l = q.tickets[last]
  -- The new ticket counted among its user's, and the last as though it
  -- arrived again, after the others of its user and priority.
  local np, nh, nw = ticketRank(q, user, prio, aheadOf(q, user, prio))
  nw = nw + 1
  local lp, lh, lw = ticketRank(q, l.user, l.prio, aheadOf(q, l.user, l.prio) - 1)
  if servedFirst(np, nh, nw, lp, lh, lw) then
    dropTicket(queue, expiry, recs, l.id)
    l.gone, q.last = true, nil
    q.waiting[l.user] = q.waiting[l.user] - 1
    q.count[l.user][l.prio] = q.count[l.user][l.prio] - 1
    q.tickets[#q.tickets + 1] = {id = id, prio = prio, user = user}
    q.waiting[user] = (q.waiting[user] or 0) + 1
    local c = q.count[user] or {}
    c[prio] = (c[prio] or 0) + 1
    q.count[user] = c
    return l.id
  end
  return nil
end
