-- release_all: drop every slot of one user (support's "unlock this account").
--
-- KEYS[1] -> <prefix>{<user id>}                       sorted set: member = stream id, score = expiry (Redis ms)
-- KEYS[2] -> <prefix>{<user id>}:meta                  hash: field = stream id, value = the slot's record
-- KEYS[3] -> <prefix>{<user id>}:released:<call id>    string: this call's answer, kept a while
-- KEYS[4] -> <prefix>{<user id>}:q                     sorted set of waiting acquires' tickets (see wait)
-- KEYS[5] -> <prefix>{<user id>}:q:expiry              sorted set: member = stream id, score = ticket expiry (Redis ms)
-- ARGV[1] -> how long to keep the answer (ms, > 0)
-- returns {pruned, {stream ids}, head}
--   pruned: slots that had already expired unreleased
--   stream ids: the live slots released, in expiry order
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

local kept = redis.call('GET', answer)
if kept then
  local pruned, ids = nil, {}
  for word in string.gmatch(kept, '%S+') do
    if pruned then
      ids[#ids + 1] = word
    else
      pruned = tonumber(word)
    end
  end
  return {pruned, ids, head()}
end

local pruned = redis.call('ZCOUNT', key, '-inf', now)
local ids = redis.call('ZRANGEBYSCORE', key, '(' .. now, '+inf')
redis.call('DEL', key, meta)
-- Stream ids hold no spaces: "<pruned> <id> <id> ...".
redis.call('SET', answer, pruned .. ' ' .. table.concat(ids, ' '), 'PX', ARGV[1])
return {pruned, ids, head()}
