-- release_all: drop every slot of one user (support's "unlock this account").
--
-- KEYS[1] -> <prefix>{<user id>}                       sorted set: member = stream id, score = expiry (Redis ms)
-- KEYS[2] -> <prefix>{<user id>}:meta                  hash: field = stream id, value = the slot's record
-- KEYS[3] -> <prefix>{<user id>}:released:<call id>    string: this call's answer, kept a while
-- ARGV[1] -> how long to keep the answer (ms, > 0)
-- returns {pruned, {stream ids}}
--   pruned: slots that had already expired unreleased
--   stream ids: the live slots released, in expiry order
--   Both keys of the user are deleted: every slot and every record.
--
-- Run again under the same KEYS[3] while its answer is kept (the Redis
-- client retrying after the connection dropped before the reply), it
-- releases nothing more and answers what the first run released: so the
-- answer, and the audit record made of it, name exactly what the call
-- released, not "nothing left".
local key = KEYS[1]
local meta = KEYS[2]
local answer = KEYS[3]

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
  return {pruned, ids}
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local pruned = redis.call('ZCOUNT', key, '-inf', now)
local ids = redis.call('ZRANGEBYSCORE', key, '(' .. now, '+inf')
redis.call('DEL', key, meta)
-- Stream ids hold no spaces: "<pruned> <id> <id> ...".
redis.call('SET', answer, pruned .. ' ' .. table.concat(ids, ' '), 'PX', ARGV[1])
return {pruned, ids}
