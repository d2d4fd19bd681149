-- After a delivery's transaction: set the processed marker (when it committed a change or
-- found one committed) and release the claim token-safely, in one round trip.
-- KEYS[1]  the processed marker
-- KEYS[2]  the claim
-- ARGV[1]  the fingerprint to mark ("" to leave the marker alone)
-- ARGV[2]  the marker's ttl (s)
-- ARGV[3]  the claimer's token
if ARGV[1] ~= '' then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) end
if redis.call('GET', KEYS[2]) == ARGV[3] then redis.call('DEL', KEYS[2]) end
return 1
