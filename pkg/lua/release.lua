-- release: give a slot back. Releasing a missing slot is not an error.
--
-- KEYS[1] -> <prefix>{<user id>}           sorted set: member = stream id, score = expiry (Redis ms)
-- KEYS[2] -> <prefix>{<user id>}:meta      hash: field = stream id, value = the slot's record
-- KEYS[3] -> <prefix>{<user id>}:q         sorted set of waiting acquires' tickets (see wait)
-- KEYS[4] -> <prefix>{<user id>}:q:expiry  sorted set: member = stream id, score = ticket expiry (Redis ms)
-- KEYS[5] -> <prefix>{<user id>}:q:rec     hash: field = stream id, value = the ticket's record (see wait)
-- KEYS[6] -> <prefix>{<user id>}:override  hash: support's override of the limit (see set_override)
-- ARGV[1] -> stream id
-- ARGV[2] -> who releases: a caller name, '' for none (optional: absent is '')
-- ARGV[3] -> the share of the slot the request that releases it holds,
--            when that request gives up (see acquire): 0 for the acquire
--            that took it, n for its n-th extension. Several requests of
--            one stream (a client's retries) may hold it at once; each
--            that gives up leaves its share, and the slot goes with the
--            last (see lib_holder.lua's leave). Optional: absent or ''
--            releases the slot whatever its shares.
-- ARGV[4] -> with ARGV[3]: the slot's start (Redis ms) as the request
--            knew it, so that a later slot of the stream is not left
--            for it; a slot whose record has a start is not left for a
--            share without one (absent or '')
-- ARGV[5] -> with ARGV[3], of a share whose acquire moved the held slot's
--            expiry later (see acquire's extended_from_ms): the expiry
--            before it (Redis ms); ARGV[6] the one it set. A slot kept
--            for the other shares gets the former back while it has the
--            latter (no heartbeat or acquire moved it since) and no share
--            later than ARGV[3] is held (see heldAfter): a request that
--            gives up keeps alive none of what the others hold, nor a
--            slot a crashed request left, which then expires by its own
--            score. A later share's request may have been answered the
--            expiry this one set without moving it (the previous
--            release's acquire, of a shorter TTL, extends by ZADD GT
--            alone), and holds it. Optional: absent or '' gives nothing
--            back.
-- returns {released (1|0|-1|-2), pruned, head, record}
--   released 0: the slot was not held (never, already released, or expired)
--   released -1: the slot is held, live, by another caller (its record names
--   one other than ARGV[2]): nothing changed
--   released -2: another request of the stream holds a share of the slot
--   still (ARGV[3]'s left), or the slot is not the one the share was of:
--   it is kept
--   pruned: the user's slots that had expired unreleased, removed now
--   head: the stream id of the first acquire in the user's queue owed a
--   slot (see owed) when this call freed one (released or pruned), ''
--   when none is: the caller wakes it (see wait), whose server grants it
--   the slot or wakes the next ones owed one.
--   record: the released slot's record ('' when none): the pool keys it
--   names are the memberships the caller drops (see pkg/lua/records.go)
--   The slot's record goes with it, as do those of pruned slots.
local key, meta = KEYS[1], KEYS[2]
local queue, expiry, recs = KEYS[3], KEYS[4], KEYS[5]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local record = redis.call('HGET', meta, ARGV[1])
local nobodys = false
if foreign(record, ARGV[2] or '') then
  -- A slot that expired unreleased is nobody's (its holder crashed or
  -- let it lapse): it is pruned below, whoever asks, and was not held,
  -- nor is it kept for a share, which was never of it.
  local score = tonumber(redis.call('ZSCORE', key, ARGV[1]))
  if score and score > now then
    return {-1, 0, '', ''}
  end
  record, nobodys = false, true
end
if (ARGV[3] or '') ~= '' and not nobodys then
  local kept = true
  if record then
    kept = leave(record, tonumber(ARGV[3]), ARGV[4] or '')
  elseif ARGV[3] ~= '0' then
    kept = false -- an extension's share of a slot without a record
  end
  if kept ~= true then
    if kept then
      redis.call('HSET', meta, ARGV[1], kept)
      if (ARGV[5] or '') ~= '' and not heldAfter(kept, tonumber(ARGV[3]))
          and tonumber(redis.call('ZSCORE', key, ARGV[1])) == tonumber(ARGV[6]) then
        redis.call('ZADD', key, 'XX', ARGV[5], ARGV[1])
      end
    end
    return {-2, 0, '', ''}
  end
end

local pruned = prune(key, meta, now)
local released = redis.call('ZREM', key, ARGV[1])
redis.call('HDEL', meta, ARGV[1])
if released == 0 then
  record = false
end

local head = ''
if released + pruned > 0 and redis.call('EXISTS', queue) == 1 then
  local override = -1
  local o = redis.call('HMGET', KEYS[6], 'limit', 'expires_at')
  if o[1] and o[2] and tonumber(o[2]) > now then
    override = tonumber(o[1])
  end
  local used = redis.call('ZCARD', key)
  local due = owed(queue, expiry, recs, used, override, used + 1, KEYS[1], -1, '')
  head = due[1] or ''
end
return {released, pruned, head, record or ''}
