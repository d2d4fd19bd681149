-- The Redis front of a payment (or refund) delivery, in one round trip (see
-- webhooks/payments/gate.py): a repeat of what was already credited is a duplicate; else the
-- delivery claims the reference, or finds it claimed (in flight). A delivery that changes
-- nothing has its audit row handed over once per body and verdict (KEYS[3] remembers which
-- were): queued here for the settlement drain to write in a batch when the queue lives on this
-- Redis (KEYS[4], KEYS[5]), else by the caller (a cluster queues it apart).
-- KEYS[1]  the processed marker   fg:{pay:<provider>:<reference>}:processed
-- KEYS[2]  the claim              fg:{pay:<provider>:<reference>}:claim
-- KEYS[3]  audit rows handed over fg:{pay:<provider>:<reference>}:audited (a set of verdict:sha)
-- KEYS[4]  (optional) the list of audit rows to write   fg:deliveries:pending
-- KEYS[5]  (optional) the drain's scheduled flag        fg:settle:scheduled
-- ARGV[1]  the delivery's fingerprint (amount, currency, payer)
-- ARGV[2]  the claimer's token
-- ARGV[3]  claim ttl (ms)
-- ARGV[4]  the audit row as JSON without its opening brace (the verdict is put in front)
-- ARGV[5]  the scheduled flag's ttl (ms)
-- ARGV[6]  the body's SHA-256 (hex)
-- ARGV[7]  how long KEYS[3] remembers (ms)
-- Returns {verdict, 1 if a drain job must be enqueued else 0, 1 if the row must be queued
-- (by the caller, without KEYS[4]) else 0}; verdict: claimed, duplicate, in_flight
local verdict
if redis.call('GET', KEYS[1]) == ARGV[1] then
  verdict = 'duplicate'
elseif redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', ARGV[3]) then
  return {'claimed', 0, 0}
else
  verdict = 'in_flight'
end
-- the same bytes under the same verdict: its row is already queued or written
if redis.call('SADD', KEYS[3], verdict .. ':' .. ARGV[6]) == 0 then return {verdict, 0, 0} end
redis.call('PEXPIRE', KEYS[3], ARGV[7])
if #KEYS < 5 then return {verdict, 0, 1} end
local status = (verdict == 'duplicate') and '200' or '409'
redis.call('LPUSH', KEYS[4], '{"verdict":"' .. verdict .. '","status_code":' .. status .. ',' .. ARGV[4])
if redis.call('SET', KEYS[5], '1', 'NX', 'PX', ARGV[5]) then return {verdict, 1, 0} end
return {verdict, 0, 0}
