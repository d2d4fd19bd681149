-- Correct a counter by the drift reconciliation measured, relative to its current value so
-- that reservations made meanwhile are kept; never below zero.
-- KEYS[1]  counter  fg:{b:<id>}:cap:<cap>:<window>
-- ARGV[1]  delta (may be negative)
-- ARGV[2]  expire-at (unix s), for a counter that did not exist
-- Returns the new value
local value = redis.call('INCRBY', KEYS[1], ARGV[1])
if value < 0 then
  redis.call('SET', KEYS[1], 0, 'KEEPTTL')
  value = 0
end
if redis.call('TTL', KEYS[1]) == -1 then redis.call('EXPIREAT', KEYS[1], ARGV[2]) end
return value
