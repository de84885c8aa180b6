-- release_all: drop every slot of one user (support's "unlock this account").
--
-- KEYS[1] -> <prefix>{<user id>}       sorted set: member = stream id, score = expiry (Redis ms)
-- KEYS[2] -> <prefix>{<user id>}:meta  hash: field = stream id, value = the slot's record
-- returns {pruned, {stream ids}}
--   pruned: slots that had already expired unreleased
--   stream ids: the live slots released, in expiry order
--   Both keys are deleted: every slot and every record.
local key = KEYS[1]
local meta = KEYS[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local pruned = redis.call('ZCOUNT', key, '-inf', now)
local ids = redis.call('ZRANGEBYSCORE', key, '(' .. now, '+inf')
redis.call('DEL', key, meta)
return {pruned, ids}
