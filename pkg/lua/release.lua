-- release: give a slot back. Releasing a missing slot is not an error.
--
-- KEYS[1] -> <prefix>{<user id>}  sorted set: member = stream id, score = expiry (Redis ms)
-- ARGV[1] -> stream id
-- returns released (0|1)
return redis.call('ZREM', KEYS[1], ARGV[1])
