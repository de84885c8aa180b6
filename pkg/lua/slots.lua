-- slots: list one user's live slots and waiting acquires. Reads only.
--
-- KEYS[1] -> <prefix>{<user id>}           sorted set: member = stream id, score = expiry (Redis ms)
-- KEYS[2] -> <prefix>{<user id>}:q         sorted set of waiting acquires' tickets (see wait)
-- KEYS[3] -> <prefix>{<user id>}:q:expiry  sorted set: member = stream id, score = ticket expiry (Redis ms)
-- returns {now_ms, {stream_id_1, expires_at_ms_1, ...}, {stream_id_1, arrival_us_1, ticket_expires_at_ms_1, ...}}
--   only slots whose expiry is after now, in expiry order; only tickets
--   whose expiry is after now, in queue order (first = next served)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tickets = {}
if KEYS[2] then
  local queued = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  for i = 1, #queued, 2 do
    local at = redis.call('ZSCORE', KEYS[3], queued[i])
    if at and tonumber(at) > now then
      tickets[#tickets + 1] = queued[i]
      tickets[#tickets + 1] = queued[i + 1]
      tickets[#tickets + 1] = at
    end
  end
end
return {now, redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES'), tickets}
