-- slots: list one user's live slots, their records and the user's
-- override. Reads only.
--
-- KEYS[1] -> <prefix>{<user id>}           sorted set: member = stream id, score = expiry (Redis ms)
-- KEYS[2] -> <prefix>{<user id>}:meta      hash: field = stream id, value = the slot's record
-- KEYS[3] -> <prefix>{<user id>}:override  hash: support's override (see set_override)
-- returns {now_ms, {stream_id_1, expires_at_ms_1, ...}, {record_1, ...}, override}
--   only slots whose expiry is after now, in expiry order
--   record_i: the i-th slot's record, '' when it has none
--   override: {limit, expires_at_ms, set_at_ms, actor, reason} when one is
--   in force, else {}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local slots = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')

local records = {}
local n = #slots / 2
-- In chunks: unpack is bounded by the Lua stack.
for i = 1, n, 1000 do
  local ids = {}
  for j = i, math.min(i + 999, n) do
    ids[#ids + 1] = slots[2 * j - 1]
  end
  for _, r in ipairs(redis.call('HMGET', KEYS[2], unpack(ids))) do
    records[#records + 1] = r or ''
  end
end

local override = {}
local o = redis.call('HMGET', KEYS[3], 'limit', 'expires_at', 'set_at', 'actor', 'reason')
if o[1] and o[2] and tonumber(o[2]) > now then
  override = {o[1], o[2], o[3] or '0', o[4] or '', o[5] or ''}
end

return {now, slots, records, override}
