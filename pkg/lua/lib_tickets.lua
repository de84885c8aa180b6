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

-- liveTickets(queue, expiry, recs, slots): the live tickets, in arrival
-- order, each {id, limit, prio, user, plan} as its record names them
-- (ticketOf), read a hundred at a time; whether any names a user (a pool
-- key's queue); and the oldest order they name, the one to serve them in
-- (see queueOrder). With slots, those whose stream holds a slot of it
-- are left out: they wait for none (see owed).
local function liveTickets(queue, expiry, recs, slots)
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
    local held = {}
    if slots then
      held = redis.call('ZMSCORE', slots, unpack(ids))
    end
    for i, id in ipairs(ids) do
      if live[i] and not held[i] then
        local limit, prio, user, plan, order = ticketOf(rec[i])
        tickets[#tickets + 1] = {id = id, limit = limit, prio = prio, user = user, plan = plan, order = order}
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
-- user holds (a pool key's members are '<stream id> <user id>'), and
-- returns true; counts none and returns false when slots holds more than
-- heldCounted (holdings are not weighed), unless all.
local function heldBy(slots, count, all)
  if not all and redis.call('ZCARD', slots) > heldCounted then
    return false
  end
  for _, member in ipairs(redis.call('ZRANGE', slots, 0, -1)) do
    local user = string.match(member, ' (.*)$')
    if user then
      count[user] = (count[user] or 0) + 1
    end
  end
  return true
end

-- orderOf(slots, users, oldest, held): what the order of a queue weighs
-- (see ticketRank) whose live tickets name users (a pool key's queue) and
-- oldest as the oldest order (see queueOrder), counting into held the
-- members of slots each user holds when it weighs them. This release's
-- weighs the waiting, and holdings on a key of at most heldCounted; the
-- previous release's holdings on any key, not the waiting.
local function orderOf(slots, users, oldest, held)
  local order = {weighHeld = true, weighWaiting = oldest >= queueOrder}
  if users then
    order.weighHeld = heldBy(slots, held, not order.weighWaiting)
  end
  return order
end

-- ticketRank(r, order, prio, at, held, waiting, before, above, first):
-- gives r (and returns it) the place in a queue's order (see owed) of a
-- ticket of priority prio that arrived at (later arrivals greater), whose
-- user holds held members and waits for waiting tickets: before of them
-- served before it (those of a higher priority, and its earlier ones of
-- prio), above of a higher priority, the first of prio arrived at
-- first. What the order weighs is order's: weighHeld, the users'
-- holdings (a pool key of at most heldCounted members), and weighWaiting,
-- how many tickets each waits for. servedFirst compares two places.
local function ticketRank(r, order, prio, at, held, waiting, before, above, first)
  r.prio, r.held, r.waiting, r.lead, r.at = prio, 0, 0, at, at
  if order.weighHeld then
    r.held = held + before
    if order.weighWaiting then
      r.waiting = waiting - before
    end
  elseif order.weighWaiting then
    -- Unweighed holdings: a user's tickets of one priority are served
    -- together (see owed), as its first of them arrived.
    r.waiting, r.lead = waiting - above, first
  end
  return r
end

-- servedFirst(a, b): whether the ticket of place a (see ticketRank) is
-- served before the one of place b; servedLast(a, b), after it.
local function servedFirst(a, b)
  if a.prio ~= b.prio then
    return a.prio > b.prio
  end
  if a.held ~= b.held then
    return a.held < b.held
  end
  if a.waiting ~= b.waiting then
    return a.waiting < b.waiting
  end
  if a.lead ~= b.lead then
    return a.lead < b.lead
  end
  return a.at < b.at
end

local function servedLast(a, b)
  return servedFirst(b, a)
end

-- heapDown(h, k, above): restores the heap h (no entry under one that
-- above says belongs below it) from its k-th entry down. heapPop(h,
-- above): takes h's top out, and returns it.
local function heapDown(h, k, above)
  local n = #h
  while true do
    local top, l = k, 2 * k
    if l <= n and above(h[l], h[top]) then
      top = l
    end
    if l < n and above(h[l + 1], h[top]) then
      top = l + 1
    end
    if top == k then
      return
    end
    h[top], h[k] = h[k], h[top]
    k = top
  end
end

local function heapPop(h, above)
  local top = h[1]
  h[1] = h[#h]
  h[#h] = nil
  heapDown(h, 1, above)
  return top
end

-- ranked(tickets, held, order): gives each of tickets (in arrival order,
-- each {user, prio}; held, by user, the members each user holds) its
-- place in order (see ticketRank).
local function ranked(tickets, held, order)
  local waiting, count = {}, {}
  for _, t in ipairs(tickets) do
    waiting[t.user] = (waiting[t.user] or 0) + 1
  end
  -- By priority, the tickets of each user of more than one.
  for _, t in ipairs(tickets) do
    if waiting[t.user] > 1 then
      local c = count[t.user] or {}
      c[t.prio] = (c[t.prio] or 0) + 1
      count[t.user] = c
    end
  end
  local seen, first = {}, {}
  for i, t in ipairs(tickets) do
    local w, above, earlier, lead = waiting[t.user], 0, 0, i
    if w > 1 then
      for p, n in pairs(count[t.user]) do
        if p > t.prio then
          above = above + n
        end
      end
      local s, f = seen[t.user] or {}, first[t.user] or {}
      earlier, lead = s[t.prio] or 0, f[t.prio] or i
      s[t.prio], f[t.prio] = earlier + 1, lead
      seen[t.user], first[t.user] = s, f
    end
    ticketRank(t, order, t.prio, i, held[t.user] or 0, w, above + earlier, above, lead)
  end
end

-- owed(queue, expiry, recs, used, override, stop, slots, cap, plan): the live
-- tickets owed a slot, in the order they are served; the slots taken then
-- (used plus them); and each owed ticket's slack: how many more slots may
-- be granted ahead of it before it no longer fits under its own limit.
--
-- The order (DESIGN §17): the highest priority first; within one, the
-- ticket whose user holds the fewest members of slots (a pool key's
-- members are '<stream id> <user id>'; not weighed, nor counted, on a
-- key of more than heldCounted), counting those owed to the tickets
-- served before it; then the one whose user waits for the fewest,
-- counting those no longer waited for; then arrival. Without the
-- waiting, a key whose streams end before the next place frees would
-- serve one user's many waiters all before the users behind them with
-- one each: each time, that user would again hold none. A user's own
-- queue has no user in its tickets, so there it is priority, then
-- arrival. While a live ticket is the previous release's, the order is
-- that release's (see queueOrder and orderOf): holdings weighed on any
-- key, the waiting not weighed.
--
-- That order is greedy: each place to the best ticket as the places
-- handed out so far leave its user's holdings and waiting. It is the
-- tickets sorted by their places (ticketRank). One user's tickets go in
-- their own order, priority then arrival (being the same user's, they
-- compare alike in all else), so when one is served its user was handed
-- exactly the before of it, and the greedy choice is the best of the
-- users' next tickets, ranked as ticketRank ranks them. And a user's next
-- ranks before its later ones: with holdings weighed, held + before
-- grows along its order; unweighed, a user served within a priority
-- stays the one waiting for the fewest until its tickets of that
-- priority are served, so they go together, all ranked by what it waited
-- for as the priority began (waiting - above) and its first one's
-- arrival. So the best of the users' next tickets is the best of all.
-- The places are taken from a heap rather than sorted: a call that
-- hands out one place costs a pass over the tickets, not a sort.
--
-- A ticket is owed a slot while its stream holds none, and fewer slots
-- than its own limit (override, when one is in force, else its record's)
-- are taken, counting those owed to the tickets served before it. When
-- the caller knows the limit of the scope as it is now (cap >= 0), it
-- holds at once for the tickets it bounds, rather than the one recorded
-- when they queued, so that a limit lowered or raised meanwhile, or a
-- scope put in shadow mode (a cap no ticket reaches), holds for them: a
-- pool key's tickets (those naming a user) all wait for the key's one
-- cap, and a user's own tickets of plan, the caller's, for that plan's
-- limit. A ticket whose limit is reached is passed over: it holds no
-- place against an acquire it could not itself be granted the slot of, so
-- a waiter of one plan never blocks the user's acquires under a larger
-- one. Passed over, it is not served, yet its user's later tickets are
-- ranked as if it were; where users are weighed that never changes the
-- order: a pool key's tickets share the key's one cap, so once one is
-- passed over all are (release, which does not know the cap, reads only
-- the first owed). A user's own queue weighs no users. The selection ends
-- once stop slots are taken (math.huge: never): a caller that only needs
-- to know whether a slot is left over.
local function owed(queue, expiry, recs, used, override, stop, slots, cap, plan)
  local out, slack, taken = {}, {}, used
  if taken >= stop then
    return out, taken, slack
  end
  -- Every live ticket: the order depends on all of them. But one whose
  -- stream holds its slot already (another request of it took it) waits
  -- for none, and is not ranked: its server's call shares that slot, or
  -- answers that another caller holds it (see wait), and its user's
  -- holdings count the slot.
  local tickets, users, oldest = liveTickets(queue, expiry, recs, slots)
  local most = 0 -- the largest limit: no ticket is owed a slot past it
  for _, t in ipairs(tickets) do
    if cap >= 0 and (t.user ~= '' or (plan ~= '' and t.plan == plan)) then
      t.limit = cap
    end
    if override >= 0 then
      t.limit = override
    end
    most = math.max(most, t.limit)
  end
  -- How many members each user holds, when the tickets name users.
  local held = {}
  local order = orderOf(slots, users, oldest, held)
  ranked(tickets, held, order)
  for k = math.floor(#tickets / 2), 1, -1 do
    heapDown(tickets, k, servedFirst)
  end
  while taken < stop and taken < most and #tickets > 0 do
    local t = heapPop(tickets, servedFirst)
    if taken < t.limit then
      taken = taken + 1
      out[#out + 1] = t.id
      slack[#slack + 1] = t.limit - taken
    end
  end
  return out, taken, slack
end

-- lastOf(q, user): the place (see ticketRank) of user's ticket served
-- last in the full queue q, with the ticket ({id, at}) and its user; nil
-- when user has none. A user's tickets are served in their own order
-- (see owed): its last is its latest of its lowest priority.
local function lastOf(q, user)
  local low
  for p in pairs(q.byPrio[user] or {}) do
    if not low or p < low then
      low = p
    end
  end
  if not low then
    return nil
  end
  local s, w = q.byPrio[user][low], q.waiting[user]
  local r = ticketRank({}, q.order, low, s[#s].at, q.held[user] or 0, w, w - 1, w - #s, s[1].at)
  r.ticket, r.user = s[#s], user
  return r
end

-- reweigh(q, user): user's tickets in q changed: its last goes in the heap
-- of the users' lasts, and its earlier entries no longer count (their
-- version is past).
local function reweigh(q, user)
  q.version[user] = (q.version[user] or 0) + 1
  local r = lastOf(q, user)
  if r then
    r.version = q.version[user]
    local h = q.heap
    h[#h + 1] = r
    local k = #h
    while k > 1 and servedLast(h[k], h[math.floor(k / 2)]) do
      local up = math.floor(k / 2)
      h[up], h[k] = h[k], h[up]
      k = up
    end
  end
end

-- fullQueue(queue, expiry, recs, slots, named): what displace weighs,
-- read once per call that finds the queue full (named: the call's own
-- tickets name users, a pool key's, whose holdings are weighed even when
-- none of the tickets read does), then kept as the call's tickets
-- join and leave it (joinFull, leaveFull): each user's holdings (held),
-- tickets (waiting) and tickets by priority (byPrio), each in arrival
-- order ({id, at}), as the order weighs them; the heap of the users'
-- lasts (see displace); how many of its tickets are the previous
-- release's (old), whose order serves it while any is (see queueOrder).
-- As owed, it leaves out the tickets whose stream holds a slot: they wait
-- for none, and are not weighed (each keeps its place, of the queue's
-- bound, until its server's call shares the slot or its ticket lapses).
local function fullQueue(queue, expiry, recs, slots, named)
  local tickets, users, oldest = liveTickets(queue, expiry, recs, slots)
  users = users or named
  local q = {held = {}, waiting = {}, byPrio = {}, of = {}, version = {}, heap = {}, at = #tickets,
    slots = slots, users = users, old = 0}
  q.order = orderOf(slots, users, oldest, q.held)
  for i, t in ipairs(tickets) do
    if t.order < queueOrder then
      q.old = q.old + 1
    end
    local b = q.byPrio[t.user] or {}
    local s = b[t.prio] or {}
    s[#s + 1] = {id = t.id, at = i}
    b[t.prio], q.byPrio[t.user] = s, b
    q.waiting[t.user] = (q.waiting[t.user] or 0) + 1
    q.of[t.id] = t
  end
  for user in pairs(q.waiting) do
    local r = lastOf(q, user)
    r.version, q.version[user] = 1, 1
    q.heap[#q.heap + 1] = r
  end
  for k = math.floor(#q.heap / 2), 1, -1 do
    heapDown(q.heap, k, servedLast)
  end
  return q
end

-- joinFull(q, id, prio, user): a ticket of user's, of priority prio,
-- joins the full queue q, arriving last.
local function joinFull(q, id, prio, user)
  local b = q.byPrio[user] or {}
  local s = b[prio] or {}
  q.at = q.at + 1
  s[#s + 1] = {id = id, at = q.at}
  b[prio], q.byPrio[user] = s, b
  q.waiting[user] = (q.waiting[user] or 0) + 1
  q.of[id] = {user = user, prio = prio}
  reweigh(q, user)
end

-- leaveFull(q, id): ticket id leaves the full queue q (if it is in it).
local function leaveFull(q, id)
  local t = q.of[id]
  if not t then
    return
  end
  local user, prio = t.user, t.prio
  local s = q.byPrio[user][prio]
  for k, e in ipairs(s) do
    if e.id == id then
      table.remove(s, k)
      break
    end
  end
  if #s == 0 then
    q.byPrio[user][prio] = nil
  end
  q.waiting[user], q.of[id] = q.waiting[user] - 1, nil
  if t.order and t.order < queueOrder then
    q.old = q.old - 1
    if q.old == 0 then
      -- The previous release's last ticket gone, this release's order
      -- serves the queue (see queueOrder): weighed anew, every user's
      -- last pushed again.
      q.held, q.heap = {}, {}
      q.order = orderOf(q.slots, q.users, queueOrder, q.held)
      for u in pairs(q.waiting) do
        reweigh(q, u)
      end
      return
    end
  end
  reweigh(q, user)
end

-- displace(q, queue, expiry, recs, id, prio, user): for a full queue (q,
-- see fullQueue) and a new ticket id of priority prio and user's: the
-- new ticket is weighed with the others, arriving last, and the one then
-- served last (see owed) is taken out: the new one, which is not queued
-- (nil is returned), or another, whose id is returned, the new one
-- queued in its place. So a full queue holds the tickets served first,
-- and one user's many tickets do not shut out a user with none (DESIGN
-- §17), nor lower priorities a higher one. A ticket taken out that
-- comes back to the full queue arrives last again, all else as before:
-- it is again the last, and refused, so two users' tickets never
-- displace each other in turn.
--
-- The last is the last of the users' lasts, kept in a heap (q.heap),
-- each user's pushed anew whenever its tickets change (the entry it had
-- is left behind by its version, and dropped when it comes on top): so
-- a call's new tickets cost a heap's steps each, not a pass over the
-- queue.
local function displace(q, queue, expiry, recs, id, prio, user)
  joinFull(q, id, prio, user)
  local last
  repeat
    last = heapPop(q.heap, servedLast)
  until last.version == q.version[last.user]
  leaveFull(q, last.ticket.id)
  if last.ticket.id == id then
    return nil
  end
  dropTicket(queue, expiry, recs, last.ticket.id)
  return last.ticket.id
end
