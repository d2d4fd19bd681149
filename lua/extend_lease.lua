-- Take over the lease of a routing whose process died, to offer its lead to the same buyer
-- again on the same reservation: a held lease gets a new expiry; nothing else changes.
-- KEYS[1]  lease   fg:{b:<id>}:lease:<lease>
-- KEYS[2]  leases  fg:{b:<id>}:leases
-- KEYS[3..] the consumer's dedupe keys the lease set (they live as long as it)
-- ARGV[1]  new ttl of a held lease (ms)
-- ARGV[2]  lease id
-- Returns {state, reserved at (unix us)}: state held | confirmed; {"gone"} when the lease was
-- refunded or has expired
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {'gone'} end
if state == 'held' then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  for i = 3, #KEYS do
    if redis.call('GET', KEYS[i]) == ARGV[2] then redis.call('PEXPIRE', KEYS[i], ARGV[1]) end
  end
end
return {state, redis.call('ZSCORE', KEYS[2], ARGV[2]) or '0'}
