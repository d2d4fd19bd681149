-- Take one token from a publisher's bucket (lua/bucket.lua) on its own, before the lead's body
-- is read (webhooks/leads/path/intake.py: when the claim cannot take it).
-- KEYS[1]  bucket  fg:{p:<id>}:bucket
-- ARGV[1]  per_second, integer >= 1
-- ARGV[2]  burst, integer >= 1
-- Returns {1, whole tokens left} when a token was taken, {0, ms until the next token} when none
-- is left (a refusal writes nothing)
--#include bucket
local taken, value = take_token(KEYS[1], ARGV[1], ARGV[2])
if taken then return {1, value} end
return {0, value}
