-- Claim a lead id for one request, and in the same step note the buyer it is about to be
-- offered to (see webhooks/leads/intake.py): SET NX PX on the claim; when taken, the attempt
-- note a dead request left is returned untouched, else this request's note is written.
-- KEYS[1]  the lead claim   fg:{p:<publisher>}:lead:<lead_id>
-- KEYS[2]  its attempt note fg:{p:<publisher>}:lead:<lead_id>:attempt
-- ARGV[1]  the claimer's token
-- ARGV[2]  claim ttl (ms)
-- ARGV[3]  this request's note ("" when it has none yet)
-- ARGV[4]  note ttl (ms)
-- Returns {1} when claimed, {1, old note} when claimed after a dead request,
--         {0, current value} when another request holds the claim or it holds an answer
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local old = redis.call('GET', KEYS[2])
  if old then return {1, old} end
  if ARGV[3] ~= '' then redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4]) end
  return {1}
end
return {0, redis.call('GET', KEYS[1])}
