-- The tickets of a queue (see wait): queue is the sorted set of tickets by
-- arrival, expiry their expiries (Redis ms), recs their records (hash:
-- field = stream id, value = '<limit>' then ';caller=<name>' when one is
-- recorded). A ticket's limit is its plan's: the most slots its acquire may
-- be granted while holding the others.

-- dropDead(queue, expiry, recs, now): removes the tickets expired by now
-- (their servers stopped refreshing them); returns how many.
local function dropDead(queue, expiry, recs, now)
  local dead = redis.call('ZRANGEBYSCORE', expiry, '-inf', string.format('%d', now))
  local n = #dead
  if n > 0 then
    redis.call('ZREMRANGEBYSCORE', expiry, '-inf', string.format('%d', now))
    for i = 1, n, 1000 do
      local chunk = {unpack(dead, i, math.min(i + 999, n))}
      redis.call('ZREM', queue, unpack(chunk))
      redis.call('HDEL', recs, unpack(chunk))
    end
  end
  return n
end

-- dropTicket(queue, expiry, recs, id): takes one ticket out of the queue.
local function dropTicket(queue, expiry, recs, id)
  redis.call('ZREM', queue, id)
  redis.call('ZREM', expiry, id)
  redis.call('HDEL', recs, id)
end

-- owed(queue, expiry, recs, used, override, stop): the live tickets owed
-- a slot, in arrival order; the slots taken then (used plus them); and
-- each owed ticket's slack: how many more slots may be granted ahead of it
-- before it no longer fits under its own limit.
--
-- Walking the queue from its head, a ticket is owed a slot while fewer
-- slots than its own limit (override, when one is in force, else its
-- plan's) are taken, counting those owed to the tickets ahead of it. A
-- ticket whose limit is reached is passed over: it holds no place against
-- an acquire it could not itself be granted the slot of, so a waiter of
-- one plan never blocks the user's acquires under a larger one. A ticket
-- with no record (queued by an earlier version) is owed a slot whenever
-- one is free. The walk ends early once stop slots are taken (math.huge:
-- never): a caller that only needs to know whether a slot is left over.
local function owed(queue, expiry, recs, used, override, stop)
  local out, slack, taken = {}, {}, used
  local from = 0
  while taken < stop do
    local ids = redis.call('ZRANGE', queue, from, from + 99)
    if #ids == 0 then
      break
    end
    from = from + #ids
    local live = redis.call('ZMSCORE', expiry, unpack(ids))
    local rec = redis.call('HMGET', recs, unpack(ids))
    for i, id in ipairs(ids) do
      if live[i] then
        local limit = override
        if limit < 0 then
          limit = tonumber(rec[i] and string.match(rec[i], '^%d+')) or math.huge
        end
        if taken < limit then
          taken = taken + 1
          out[#out + 1] = id
          slack[#slack + 1] = limit - taken
          if taken >= stop then
            break
          end
        end
      end
    end
  end
  return out, taken, slack
end
