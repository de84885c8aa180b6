-- release_all: drop every slot of one user (support's "unlock this account").
--
-- KEYS[1] -> <prefix>{<user id>}  sorted set: member = stream id, score = expiry (Redis ms)
-- returns the released stream ids (expired ones included), in expiry order
local ids = redis.call('ZRANGE', KEYS[1], 0, -1)
redis.call('DEL', KEYS[1])
return ids
