-- remove_override: end one user's override now; the plan's limit applies
-- again from the next acquire.
--
-- KEYS[1] -> <prefix>{<user id>}:override  hash: the override
-- returns removed (0|1)
--   removed 0: no override was in force (never set, removed, or expired)
--
-- Not safe to run twice: a second run answers 0 for the override the
-- first removed, so a lost reply is reported as such, not as "none".
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expires = redis.call('HGET', KEYS[1], 'expires_at')
redis.call('DEL', KEYS[1])
if expires and tonumber(expires) > now then
  return 1
end
return 0
