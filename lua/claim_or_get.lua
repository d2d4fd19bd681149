-- Claim a key for one request, or say who has it: SET NX PX, else the current value.
-- KEYS[1]  the claim key
-- ARGV[1]  value to set (the claimer's token)
-- ARGV[2]  ttl (ms)
-- Returns {1} when claimed, {0, current value} otherwise
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1} end
return {0, redis.call('GET', KEYS[1])}
