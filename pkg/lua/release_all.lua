-- release_all: drop every slot of one user (support's "unlock this account").
--
-- KEYS[1] -> <prefix>{<user id>}                       sorted set: member = stream id, score = expiry (Redis ms)
-- KEYS[2] -> <prefix>{<user id>}:meta                  hash: field = stream id, value = the slot's record
-- KEYS[3] -> <prefix>{<user id>}:released:<call id>    string: this call's answer, kept a while
-- KEYS[4] -> <prefix>{<user id>}:q                     sorted set of waiting acquires' tickets (see wait)
-- KEYS[5] -> <prefix>{<user id>}:q:expiry              sorted set: member = stream id, score = ticket expiry (Redis ms)
-- ARGV[1] -> how long to keep the answer (ms, > 0)
-- returns {pruned, {stream ids}, head, {records}}
--   pruned: slots that had already expired unreleased
--   stream ids: the live slots released, in expiry order
--   records: the record of each of them, '' when it had none: the caller
--   drops the pool memberships they name (see acquire)
--   head: the stream id of the acquire at the head of the user's queue,
--   '' when none waits: the caller wakes it (see wait and release)
--   Both keys of the user's slots are deleted: every slot and every
--   record. Waiting acquires keep their places, and the free slots go to
--   them.
--
-- Run again under the same KEYS[3] while its answer is kept (the Redis
-- client retrying after the connection dropped before the reply), it
-- releases nothing more and answers what the first run released: so the
-- answer, and the audit record made of it, name exactly what the call
-- released, not "nothing left".
local key = KEYS[1]
local meta = KEYS[2]
local answer = KEYS[3]
local queue = KEYS[4]
local expiry = KEYS[5]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- The first live ticket: one whose expiry is still ahead.
local function head()
  for _, id in ipairs(redis.call('ZRANGE', queue, 0, 9)) do
    local at = redis.call('ZSCORE', expiry, id)
    if at and tonumber(at) > now then
      return id
    end
  end
  return ''
end

-- The answer kept reads "<pruned>\n<id> <record>\n...": neither stream
-- ids nor records hold a space or a line break before the record's label
-- and user, which hold no line break. (An answer kept by a version that
-- recorded no records reads "<pruned> <id> <id> ..." on its first line.)
local kept = redis.call('GET', answer)
if kept then
  local pruned, ids, recs = nil, {}, {}
  for line in string.gmatch(kept, '[^\n]+') do
    if pruned then
      local id, rec = string.match(line, '^(%S+) ?(.*)$')
      ids[#ids + 1], recs[#recs + 1] = id, rec
    else
      for word in string.gmatch(line, '%S+') do
        if pruned then
          ids[#ids + 1], recs[#recs + 1] = word, ''
        else
          pruned = tonumber(word)
        end
      end
    end
  end
  return {pruned, ids, head(), recs}
end

local pruned = redis.call('ZCOUNT', key, '-inf', now)
local ids = redis.call('ZRANGEBYSCORE', key, '(' .. now, '+inf')
local recs, lines = {}, {pruned}
for i, id in ipairs(ids) do
  recs[i] = redis.call('HGET', meta, id) or ''
  lines[i + 1] = id .. ' ' .. recs[i]
end
redis.call('DEL', key, meta)
redis.call('SET', answer, table.concat(lines, '\n'), 'PX', ARGV[1])
return {pruned, ids, head(), recs}
