-- slots: list one user's live slots, their records, the user's override
-- and the acquires waiting in the user's queue; or the same of one pool
-- key (<prefix>pool:{<pool>=<key>} for <prefix>{<user id>} below, each
-- member "<stream id> <user id>"). Reads only.
--
-- KEYS[1] -> <prefix>{<user id>}           sorted set: member = stream id, score = expiry (Redis ms)
-- KEYS[2] -> <prefix>{<user id>}:meta      hash: field = stream id, value = the slot's record
-- KEYS[3] -> <prefix>{<user id>}:override  hash: support's override (see set_override)
-- KEYS[4] -> <prefix>{<user id>}:q         sorted set of waiting acquires' tickets (see wait)
-- KEYS[5] -> <prefix>{<user id>}:q:expiry  sorted set: member = stream id, score = ticket expiry (Redis ms)
-- KEYS[6] -> <prefix>{<user id>}:q:rec     hash: field = stream id, value = the ticket's record (see wait)
-- ARGV[1] -> the most slots to list (> 0)
-- returns {now_ms, {stream_id_1, expires_at_ms_1, ...}, {record_1, ...}, override,
--          {stream_id_1, arrival_us_1, ticket_expires_at_ms_1, ticket_record_1, ...},
--          used, {user_1, held_1, ...}}
--   only slots whose expiry is after now, in expiry order, the first
--   ARGV[1] of them: a pool key may hold 100,000, whose records the
--   script would read and answer for seconds, Redis doing nothing else
--   record_i: the i-th slot's record, '' when it has none
--   used: the slots whose expiry is after now, all of them
--   override: {limit, expires_at_ms, set_at_ms, actor, reason} when one is
--   in force, else {}
--   tickets: only those whose expiry is after now and whose stream holds
--   no live slot (one that does waits for none: its server's next call
--   shares the slot, see wait), in arrival order, each
--   with its record ('' when it has none): the caller orders them as the
--   wait script serves them (priority, then the user holding fewest,
--   then the user waiting for fewest, then arrival; or the previous
--   release's order while a ticket names no order: see queueOrder)
--   held: of a pool key whose tickets name users, each of those users
--   and how many of the key's live members it holds (all of them, not
--   only those listed), which the order needs; else {}, and {} too when
--   the key holds more than heldCounted (the order weighs no holdings),
--   unless a ticket is the previous release's
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local most = tonumber(ARGV[1])
local used = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
local slots = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, most)

local records = {}
local n = #slots / 2
-- In chunks: unpack is bounded by the Lua stack.
for i = 1, n, 1000 do
  local ids = {}
  for j = i, math.min(i + 999, n) do
    ids[#ids + 1] = slots[2 * j - 1]
  end
  for _, r in ipairs(redis.call('HMGET', KEYS[2], unpack(ids))) do
    records[#records + 1] = r or ''
  end
end

local override = {}
local o = redis.call('HMGET', KEYS[3], 'limit', 'expires_at', 'set_at', 'actor', 'reason')
if o[1] and o[2] and tonumber(o[2]) > now then
  override = {o[1], o[2], o[3] or '0', o[4] or '', o[5] or ''}
end

local tickets = {}
local queued = redis.call('ZRANGE', KEYS[4], 0, -1, 'WITHSCORES')
for i = 1, #queued, 2 do
  local at = redis.call('ZSCORE', KEYS[5], queued[i])
  local slot = redis.call('ZSCORE', KEYS[1], queued[i])
  if at and tonumber(at) > now and not (slot and tonumber(slot) > now) then
    tickets[#tickets + 1] = queued[i]
    tickets[#tickets + 1] = queued[i + 1]
    tickets[#tickets + 1] = at
    tickets[#tickets + 1] = redis.call('HGET', KEYS[6], queued[i]) or ''
  end
end

-- The users a pool key's tickets name (its members are '<stream id>
-- <user id>'), and what each holds.
local held, users, oldest = {}, {}, queueOrder
for i = 4, #tickets, 4 do
  local _, _, user, _, order = ticketOf(tickets[i])
  if user ~= '' then
    users[user] = 0
  end
  oldest = math.min(oldest, order)
end
if next(users) and (used <= heldCounted or oldest < queueOrder) then
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')) do
    local user = string.match(member, ' (.*)$')
    if user and users[user] then
      users[user] = users[user] + 1
    end
  end
  for user, count in pairs(users) do
    held[#held + 1] = user
    held[#held + 1] = tostring(count)
  end
end

return {now, slots, records, override, tickets, used, held}
