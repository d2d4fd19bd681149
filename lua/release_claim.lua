-- Token-safe release: delete the claim only if it still holds our token (a plain DEL could
-- remove a claim that expired and was taken by another request).
-- KEYS[1]  the claim key
-- ARGV[1]  our token
-- Returns 1 when released, 0 when the claim was not ours
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
