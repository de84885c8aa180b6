-- wait: one server's turn at one user's queue. It grants the waiting
-- acquires the server holds that have reached the head of the queue while
-- a slot is free, queues the others (a new one at the tail) and refreshes
-- their tickets, and drops those that gave up.
--
-- KEYS[1] -> <prefix>{<user id>}           sorted set: member = stream id, score = slot expiry (Redis ms)
-- KEYS[2] -> <prefix>{<user id>}:meta      hash: field = stream id, value = the slot's record
-- KEYS[3] -> <prefix>{<user id>}:override  hash: support's override of the limit (see set_override)
-- KEYS[4] -> <prefix>{<user id>}:q         sorted set of tickets: member = stream id, score = arrival (Redis µs)
-- KEYS[5] -> <prefix>{<user id>}:q:expiry  sorted set: member = stream id, score = ticket expiry (Redis ms)
-- KEYS[6] -> <prefix>{<user id>}:q:rec     hash: field = stream id, value = the ticket's record:
--            its limit (ARGV[1]), then the fields of its slot's record,
--            this release's order after the caller (see ticketRecord)
-- ARGV[1] -> limit (max concurrent streams, >= 0): the plan's as it is
--            now (the call's tickets are all of one plan, the one their
--            records name); an override in force replaces it, unless
--            it is 2147483647 (2^31-1): a scope in shadow mode, which
--            refuses none, its override included
-- ARGV[2] -> slot ttl (ms, > 0, decimal digits): a new slot's; a held
--            slot is extended by the TTL its record keeps, as acquire
--            extends it
-- ARGV[3] -> ticket ttl (ms, > 0)
-- ARGV[4] -> the most tickets the queue may hold (> 0; in shadow mode a
--            new ticket queues past it)
-- ARGV[5] -> n, the number of tickets that follow (>= 1)
-- ARGV[3+3i], ARGV[4+3i], ARGV[5+3i] (i = 1..n) -> the i-th ticket:
--            stream id; 'w' (waits on), 'r' (waits on, for another request
--            of its stream, while one gives up: retry_after_ms is due) or
--            'l' (leaves the queue); the rest of its slot's record ('' or
--            ';name=value' fields)
-- ARGV[6+3n] -> in shadow mode (ARGV[1] 2147483647): the limit the scope
--            would enforce, its plan's or its key's as it is now (>= 0;
--            an override in force replaces it): a ticket granted a new
--            slot past it is marked over it in the slot's record (see
--            overLimit), as acquire marks one (optional: absent marks
--            none)
-- returns {used, override, pruned, next_ms, retry_after_ms, {wake ids}, state_1, value_1, share_1, started_1, used_1, record_1, over_1, ..., state_n, value_n, share_n, started_n, used_n, record_n, over_n}
--   used       slots held after the call
--   override   the override's limit when one was in force (and so
--              applied instead of ARGV[1], unless shadow mode), else -1
--   pruned     slots that had expired unreleased, removed now with their
--              records
--   next_ms    ms until the answer may change by time alone (the earliest
--              slot or ticket expiry), when a ticket of the call still
--              waits; -1 otherwise
--   retry_after_ms  when a ticket of the call left, was not queued or
--              lost a request ('r'),
--              what a denial answers (as acquire's): until enough slots
--              expire for one to be free; until the earliest slot expires
--              when slots are free but owed to the queue; the ticket ttl
--              when no slot is held. 0 otherwise.
--   wake ids   tickets of other callers now owed a free slot: the caller
--              wakes them (their servers call this script for them)
--   state 1    granted: the stream holds a slot; value = its expires_at_ms
--   state 2    granted, the stream held its slot already (another request
--              of the stream, a retry, took it): extended, counting one
--              more extension in its record (see acquire); value = its
--              expires_at_ms
--   state 0    queued; value = its place in the queue by arrival (1 =
--              first; the order it is served in is owed's)
--   state -1   left the queue (or was not in it); value 0
--   state -2   not queued: the queue holds its most tickets, each
--              served before it would be (never in shadow mode, which
--              refuses none: the ticket queues past the bound); value 0. A new ticket that
--              would be served before the last takes its place (see
--              displace): that one's next call finds it not queued, and
--              queues it again if the queue has room, else answers -2;
--              one of this call's, queued before the new one in it, is
--              answered -2
--   state -3   the stream (held, or queued) is another caller's: nothing
--              changed for it; value 0
--   share      of a granted ticket: its share of the slot (0 when the
--              call took it, n when it counted the n-th extension), which
--              a request that gives up leaves (see release); else 0
--   started    of a granted ticket: the slot's start (Redis ms); else 0
--   used_i     of a granted ticket: the slots held as it was granted,
--              its own counted (of an extension, which adds none, those
--              held then): each of the call's grants is judged by its
--              own count (over), not by the call's last (used); else 0
--   record     of a ticket granted state 2: the held slot's record, as
--              kept (the caller compares the pools and the plan it names
--              with its own, as acquire's caller does); else ''
--   over       of a granted ticket: 1 when shadow mode let its new slot in
--              over the limit of ARGV[6+3n] (its record marked so); of one
--              whose stream held its slot (an extension, or the ticket's
--              own grant asked again), the verdict that slot's record
--              keeps (see wasOverLimit), which an extension answers as
--              acquire's does; else 0
--
-- The order is the queue's alone: a slot goes to the first ticket owed
-- one (see owed: by priority, then the fewest members of its user, then
-- the fewest tickets of its user, then arrival, or the previous release's
-- order while it queues too; passing over a ticket whose own limit is reached), whichever
-- server holds it, so tickets are granted in that order across servers,
-- and a ticket of a plan whose limit is reached blocks no other. A ticket stops counting at its expiry unless its server
-- refreshes it (a server that died), and is removed by the first call to
-- see it expired. Arrival is the Redis time, raised above the last
-- ticket's score when the clock did not move (or went back, after a
-- failover), so arrival order is total. Idempotent: a ticket already
-- queued keeps its place (a retry under the same stream id), one already
-- granted is granted again and its slot extended (or, asked again by the
-- same request, whose reply was lost, answered as it was: see
-- extendHeld), and a ticket that left is not queued.
local slots, meta, queue, expiry, recs = KEYS[1], KEYS[2], KEYS[4], KEYS[5], KEYS[6]
local limit = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local ticketTTL = tonumber(ARGV[3])
local maxQueue = tonumber(ARGV[4])
local n = tonumber(ARGV[5])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nowUs = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- A support override in force replaces the plan's limit; not in shadow
-- mode, which refuses none.
local shadow = limit >= 2147483647
local override = -1
local o = redis.call('HMGET', KEYS[3], 'limit', 'expires_at')
if o[1] and o[2] and tonumber(o[2]) > now then
  override = tonumber(o[1])
  if not shadow then
    limit = override
  end
end
-- In shadow mode, the limit a new slot is judged by, as acquire judges
-- one (the override in force replaces the scope's): past it, shadow mode
-- let the slot in, and its record says so. Nil: none is judged.
local judgedBy = shadow and tonumber(ARGV[6 + 3 * n] or '')
if judgedBy and override >= 0 then
  judgedBy = override
end

-- Scores above 10^14 need all their digits: tostring keeps 14.
local function digits(x) return string.format('%.0f', x) end

-- Slots expired by now go, with their records; so do tickets expired by
-- now: their servers stopped refreshing them.
local pruned = prune(slots, meta, now)
dropDead(queue, expiry, recs, now)

local ids, records, waiting = {}, {}, {}
local states, values, shares, starts, kepts, useds, overs = {}, {}, {}, {}, {}, {}, {}
local granted = false -- a slot was granted or extended
local denied = false  -- a ticket left or was not queued: retry_after_ms is due
local prefix = ARGV[2] .. ';started=' .. string.format('%d', now)
-- The longest TTL of the slots this call granted or extended: the slots'
-- keys outlive the latest slot by it (see the end).
local keepFor = 0

-- extendHeld(i, id): ticket i's stream holds its slot already (another
-- request of it took it): the slot is extended (never shortened) as
-- acquire extends it, counting one more extension in its record, and the
-- ticket is answered granted with its share (state 2).
local function extendHeld(i, id)
  local kept = redis.call('HGET', meta, id)
  local mine = tokenOf(records[i])
  local n = kept and ownedShare(kept, mine)
  -- The slot moves by the TTL its record keeps, as acquire extends it.
  local own = ownTTL(kept, ttl)
  keepFor = math.max(keepFor, own)
  if n then
    -- The ticket's own grant, by this call asked again after its reply
    -- was lost: answered as it was, nothing counted twice. (The latest
    -- eight requests are named, as in acquire.)
    values[i] = tonumber(redis.call('ZSCORE', slots, id))
    shares[i], starts[i] = n, tonumber(startedAt(kept)) or 0
    useds[i] = redis.call('ZCARD', slots)
    if wasOverLimit(kept) then
      overs[i] = 1
    end
    if n == 0 then
      states[i], kepts[i] = 1, ''
    else
      states[i], kepts[i] = 2, kept
    end
    return
  end
  local score = tonumber(redis.call('ZSCORE', slots, id))
  if now + own > score then
    redis.call('ZADD', slots, 'GT', now + own, id)
  else
    -- Held as late or later by another request of the stream, which
    -- gives its time back if it gives up (see release): one ms more makes
    -- the expiry answered this ticket's own, as acquire's extend does.
    redis.call('ZADD', slots, 'XX', string.format('%d', score + 1), id)
  end
  if kept then
    kept = extended(kept, mine)
  else
    kept = records[i]
  end
  redis.call('HSET', meta, id, kept)
  states[i], values[i] = 2, tonumber(redis.call('ZSCORE', slots, id))
  shares[i], starts[i], kepts[i] = again(kept), tonumber(startedAt(kept)) or 0, kept
  useds[i] = redis.call('ZCARD', slots)
  if wasOverLimit(kept) then
    overs[i] = 1
  end
end
for i = 1, n do
  ids[i] = ARGV[3 + 3 * i]
end
-- Which of the call's tickets are queued, read at once, then kept as the
-- loop below queues and drops them; whose streams hold a slot, read at
-- once too (the loop adds none); and the tickets it refreshes, whose
-- expiries are written at once after it.
local queued, held, refresh = {}, {}, {}
for from = 1, n, 1000 do
  local chunk = {unpack(ids, from, math.min(from + 999, n))}
  for k, score in ipairs(redis.call('ZMSCORE', queue, unpack(chunk))) do
    if score then
      queued[chunk[k]] = true
    end
  end
  for k, score in ipairs(redis.call('ZMSCORE', slots, unpack(chunk))) do
    if score then
      held[chunk[k]] = true
    end
  end
end
-- A call's tickets are all of its scope: a pool key's name their users,
-- and all wait for its one cap.
local _, _, poolUser, callPlan = ticketOf(ARGV[1] .. (ARGV[8] or ''))
-- displaces(i): whether the call's i-th ticket, new to a full queue,
-- takes the place of the ticket that would be served last (displace).
-- The queue is read once, at the first such ticket of the call, then
-- kept as the call's tickets leave it and join it. The tickets this call
-- queued before it (added, in order, to queuedNow) have no expiry yet
-- (written after the loop), so the read leaves them out: they join it
-- as they arrived, last, and are weighed with the others.
local full
local queuedNow = {}
local function displaces(i)
  local _, prio, user = ticketOf(ARGV[1] .. ARGV[5 + 3 * i])
  if not full then
    full = fullQueue(queue, expiry, recs, slots, poolUser ~= '')
    for _, j in ipairs(queuedNow) do
      if queued[ids[j]] and not full.of[ids[j]] then
        local _, p, u = ticketOf(ARGV[1] .. ARGV[5 + 3 * j])
        joinFull(full, ids[j], p, u)
      end
    end
  end
  local out = displace(full, queue, expiry, recs, ids[i], prio, user)
  if out then
    queued[out], refresh[out] = nil, nil -- one of this call's: no expiry left behind
    local k = waiting[out]
    if k then
      -- One of this call's, queued (by an earlier call, or earlier in
      -- this one): refused now, as its next call would find it, not
      -- answered as one that left.
      states[k], values[k], waiting[out], denied = -2, 0, nil, true
    end
  end
  return out ~= nil
end
for i = 1, n do
  local id, action = ids[i], ARGV[4 + 3 * i]
  if action == 'r' then
    denied = true -- the request that gives up is answered a denial's retry
  end
  records[i] = prefix .. ARGV[5 + 3 * i]
  states[i], values[i], shares[i], starts[i], kepts[i], useds[i], overs[i] = -1, 0, 0, 0, '', 0, 0
  local caller = holder(records[i])
  local ticket = false
  if caller ~= '' then -- an open API's calls are nobody's: nothing to read
    ticket = redis.call('HGET', recs, id)
  end
  if caller ~= '' and (foreign(ticket, caller) or (not ticket and foreign(redis.call('HGET', meta, id), caller))) then
    -- Another caller's ticket or slot: not this call's to take over,
    -- refresh or withdraw.
    states[i] = -3
    denied = true
  elseif action == 'l' then
    dropTicket(queue, expiry, recs, id)
    queued[id], refresh[id] = nil, nil
    if full then
      leaveFull(full, id)
    end
    denied = true
  elseif held[id] then
    -- Held already (granted to a call whose answer was lost, or to
    -- another request of the stream, queued or not: it needs no free
    -- slot, and is owed none): extend it, as acquire does. Unless another
    -- caller took a slot for the queued stream while the ticket waited
    -- (an acquire of the previous release, which read no ticket): not
    -- this call's to extend; the ticket leaves the queue.
    dropTicket(queue, expiry, recs, id)
    queued[id], refresh[id] = nil, nil
    if full then
      leaveFull(full, id)
    end
    if foreign(redis.call('HGET', meta, id), caller) then
      states[i] = -3
      denied = true
    else
      extendHeld(i, id)
      granted = true
    end
  -- A full queue takes a new ticket only in the place of one served after
  -- it (displaces); in shadow mode, which refuses none, the ticket queues
  -- past the bound, taking no one's place, and is served below.
  elseif not shadow and not queued[id] and redis.call('ZCARD', queue) >= maxQueue and not displaces(i) then
    states[i] = -2
    denied = true
  else
    if not queued[id] then
      local arrival = nowUs
      local last = redis.call('ZRANGE', queue, -1, -1, 'WITHSCORES')
      if last[2] then
        arrival = math.max(arrival, tonumber(last[2]) + 1)
      end
      redis.call('ZADD', queue, digits(arrival), id)
      queued[id] = true
      queuedNow[#queuedNow + 1] = i
      if full and not full.of[id] then
        -- Queued in the room a ticket of the call left: the full queue
        -- the call's next new tickets are weighed against holds it.
        local _, prio, user = ticketOf(ARGV[1] .. ARGV[5 + 3 * i])
        joinFull(full, id, prio, user)
      end
      -- A ticket's record is written once, with its plan's limit as
      -- it queued: a call of its plan holds the plan's limit as it is
      -- then for it instead, and an override is applied when it is read
      -- (see owed). After the limit come the fields of its slot's
      -- record: who asks, the plan, the priority and the user that
      -- order the queue; and the order this release serves it in, which
      -- the other tickets are served in once all name it.
      redis.call('HSET', recs, id, ticketRecord(ARGV[1], ARGV[5 + 3 * i]))
    end
    refresh[id] = true
    waiting[id] = i
    states[i] = 0
  end
end
-- The refreshed tickets' expiries, in one command per thousand.
local expiries = {}
for id in pairs(refresh) do
  expiries[#expiries + 1] = now + ticketTTL
  expiries[#expiries + 1] = id
end
for from = 1, #expiries, 2000 do
  redis.call('ZADD', expiry, 'GT', unpack(expiries, from, math.min(from + 1999, #expiries)))
end

-- The free slots go to the tickets owed them, in order: this call's
-- tickets are granted, the others' servers are woken.
local used = redis.call('ZCARD', slots)
local wake = {}
-- With this call's limit reached, none of its tickets can be granted, and
-- the tickets of larger plans owed a slot are served by their own
-- servers' calls (each walks the queue), not woken by this one. But a
-- ticket's record holds its plan's limit as it queued, by which release
-- and the other plans' calls serve the queue: a plan's limit changed
-- since would have them wake a ticket for a free slot it cannot take
-- (lowered), while one of a larger plan behind it waits for a poll it
-- makes only as the one served next, or pass over one that may take it
-- now (raised). So a call of a user's own queue at its limit writes the
-- limit in force into the records of every ticket of its plan (the
-- previous release's too, which reads them alike), and, when one held
-- another, hands the free slots on as release would have (owed, woken).
-- Its server calls at once when it finds the limit changed (see
-- pkg/limiter's round).
local rewritten = false
if used >= limit and poolUser == '' and callPlan ~= '' then
  local all = redis.call('HGETALL', recs)
  for k = 1, #all, 2 do
    local rec = all[k + 1]
    local was = string.match(rec, '^%d+')
    if was and was ~= ARGV[1] and planOf(rec) == callPlan then
      redis.call('HSET', recs, all[k], ARGV[1] .. string.sub(rec, #was + 1))
      rewritten = true
    end
  end
end
local due, slack = {}, {}
if used < limit or rewritten then
  local taken -- unused
  local applied = override
  if shadow then
    applied = -1 -- the tickets' limit is the call's, unbounded
  end
  due, taken, slack = owed(queue, expiry, recs, used, applied, math.huge, slots, limit, planOf(ARGV[8]))
end
-- A ticket of this call behind others' tickets owed a slot is granted
-- before them only while each of them keeps room under its own limit
-- (room: the least slack among them, less this call's grants so far),
-- and none once this call's limit is reached.
local room = math.huge
for k, head in ipairs(due) do
  local i = waiting[head]
  if i and (room < 1 or used >= limit) then
    i = nil -- its turn comes when those ahead are served
  elseif not i then
    room = math.min(room, slack[k])
  end
  if i then
    room = room - 1
    dropTicket(queue, expiry, recs, head)
    waiting[head] = nil
    -- (Its stream holds no slot: one that does is owed none, and was
    -- served above.)
    used = used + 1
    if judgedBy and used > judgedBy then
      -- Let in by shadow mode: for its call asked again, and its
      -- extensions, to say so too.
      records[i], overs[i] = overLimit(records[i]), 1
    end
    redis.call('ZADD', slots, now + ttl, head)
    redis.call('HSET', meta, head, records[i])
    keepFor = math.max(keepFor, ttl)
    states[i], values[i] = 1, now + ttl
    starts[i] = now
    useds[i] = used
    granted = true
  elseif not waiting[head] then
    wake[#wake + 1] = head
  end
end
local nextMs = -1
for id, i in pairs(waiting) do
  local rank = redis.call('ZRANK', queue, id)
  if rank then
    values[i] = rank + 1
    nextMs = 0
  else
    states[i] = -1
  end
end
if nextMs == 0 then
  -- The earliest a slot or a ticket may expire: the answer may change
  -- then without anyone calling.
  local first = redis.call('ZRANGE', slots, 0, 0, 'WITHSCORES')
  local ticket = redis.call('ZRANGE', expiry, 0, 0, 'WITHSCORES')
  nextMs = ticketTTL
  if first[2] then
    nextMs = math.min(nextMs, tonumber(first[2]) - now)
  end
  if ticket[2] then
    nextMs = math.min(nextMs, tonumber(ticket[2]) - now)
  end
  nextMs = math.max(nextMs, 1)
end

local retry = 0
if denied then
  retry = ticketTTL
  if limit > 0 and used >= limit then
    local nth = redis.call('ZRANGE', slots, used - limit, used - limit, 'WITHSCORES')
    retry = tonumber(nth[2]) - now
  elseif used > 0 then
    local first = redis.call('ZRANGE', slots, 0, 0, 'WITHSCORES')
    retry = tonumber(first[2]) - now
  end
end

-- The slots outlive their longest one by at least one TTL (its own, or
-- the longest of those this call granted or extended), as acquire leaves
-- them; never sooner than they were set to (a slot of a longer TTL than
-- those this call moved may be the latest).
if granted then
  local last = redis.call('ZRANGE', slots, -1, -1, 'WITHSCORES')
  local lastTTL = ownTTL(redis.call('HGET', meta, last[1]), ttl)
  local at = math.max(tonumber(last[2]) + math.max(keepFor, lastTTL), redis.call('PEXPIRETIME', slots))
  local keep = string.format('%d', at)
  redis.call('PEXPIREAT', slots, keep)
  redis.call('PEXPIREAT', meta, keep)
end
-- The queue's keys outlive its latest ticket by at least one ticket TTL:
-- moved, two TTLs on, only when a refresh took a ticket past that, so
-- most calls write the tickets alone.
local latest = redis.call('ZRANGE', expiry, -1, -1, 'WITHSCORES')
if latest[2] then
  local need = tonumber(latest[2]) + ticketTTL
  if redis.call('PEXPIRETIME', queue) < need then
    local keep = digits(need + ticketTTL)
    redis.call('PEXPIREAT', queue, keep)
    redis.call('PEXPIREAT', expiry, keep)
    redis.call('PEXPIREAT', recs, keep)
  end
end

local out = {used, override, pruned, nextMs, retry, wake}
for i = 1, n do
  out[#out + 1] = states[i]
  out[#out + 1] = values[i]
  out[#out + 1] = shares[i]
  out[#out + 1] = starts[i]
  out[#out + 1] = useds[i]
  out[#out + 1] = kepts[i]
  out[#out + 1] = overs[i]
end
return out
