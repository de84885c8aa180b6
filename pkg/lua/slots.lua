-- slots: list one user's live slots. Reads only.
--
-- KEYS[1] -> <prefix>{<user id>}  sorted set: member = stream id, score = expiry (Redis ms)
-- returns {now_ms, {stream_id_1, expires_at_ms_1, stream_id_2, expires_at_ms_2, ...}}
--   only slots whose expiry is after now, in expiry order
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {now, redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')}
