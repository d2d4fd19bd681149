-- Claim a key for one request, or say who has it: SET NX PX, else the current value. A lead
-- claim also returns what its lead's attempt note holds (a routing whose process died leaves
-- the buyer it was offering the lead to there; see webhooks/leads/intake.py).
-- KEYS[1]  the claim key
-- KEYS[2]  optional: a key to read when the claim is taken (the lead's attempt note)
-- ARGV[1]  value to set (the claimer's token)
-- ARGV[2]  ttl (ms)
-- Returns {1} or {1, value of KEYS[2]} when claimed, {0, current value} otherwise
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if #KEYS > 1 then return {1, redis.call('GET', KEYS[2])} end
  return {1}
end
return {0, redis.call('GET', KEYS[1])}
