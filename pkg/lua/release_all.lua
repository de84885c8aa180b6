-- release_all: drop every slot of one user (support's "unlock this account").
--
-- KEYS[1] -> <prefix>{<user id>}  sorted set: member = stream id, score = expiry (Redis ms)
-- returns {pruned, {stream ids}}
--   pruned: slots that had already expired unreleased
--   stream ids: the live slots released, in expiry order
local key = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local pruned = redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
local ids = redis.call('ZRANGE', key, 0, -1)
redis.call('DEL', key)
return {pruned, ids}
