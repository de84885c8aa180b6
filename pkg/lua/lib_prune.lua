-- prune(key, meta, now): removes the members of the sorted set key whose
-- score (expiry, Redis ms) is at or before now, with their records in the
-- hash meta; returns how many. A slot that expired unreleased is counted
-- here: the leak signal. (A script that extends members must prune first:
-- ZADD XX would extend an expired one.)
local function prune(key, meta, now)
  local at = string.format('%d', now)
  local expired = redis.call('ZRANGEBYSCORE', key, '-inf', at)
  local n = #expired
  if n > 0 then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', at)
    -- In chunks: unpack is bounded by the Lua stack.
    for i = 1, n, 1000 do
      redis.call('HDEL', meta, unpack(expired, i, math.min(i + 999, n)))
    end
  end
  return n
end
