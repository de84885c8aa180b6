-- set_override: replace one user's limit until an expiry (support's
-- "give this customer 5 streams until tomorrow").
--
-- KEYS[1] -> <prefix>{<user id>}:override  hash: the override
-- ARGV[1] -> limit (max concurrent streams, 0-1000, decimal digits)
-- ARGV[2] -> how long it stays in force (ms, > 0, decimal digits)
-- ARGV[3] -> actor: who set it (the admin token's name)
-- ARGV[4] -> reason (recorded with it, and in the audit)
-- ARGV[5] -> optional: the call's id, recorded with it ('call'), by which
--            a caller whose reply was lost tells its own set from another
-- returns {expires_at_ms, set_at_ms}
--
-- The hash replaces any override before it and expires with it; acquire
-- and slots also compare expires_at with Redis time, so a store that keeps
-- the key a little past its expiry never applies it. Run twice (a retry
-- after a lost reply), it sets the same override with a later start.
local now_t = redis.call('TIME')
local now = tonumber(now_t[1]) * 1000 + math.floor(tonumber(now_t[2]) / 1000)
local expires = now + tonumber(ARGV[2])
local at = string.format('%d', expires)

redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'limit', ARGV[1], 'expires_at', at,
  'set_at', string.format('%d', now), 'actor', ARGV[3], 'reason', ARGV[4])
if (ARGV[5] or '') ~= '' then
  redis.call('HSET', KEYS[1], 'call', ARGV[5])
end
redis.call('PEXPIREAT', KEYS[1], at)
return {expires, now}
