-- The Redis front of a payment (or refund) delivery, in one round trip (see
-- webhooks/payments/gate.py): a repeat of what was already credited is a duplicate; else the
-- delivery claims the reference, or finds it claimed (in flight). A delivery that changes
-- nothing has its audit row queued here too, for the settlement drain to write in a batch,
-- when the queue lives on this Redis (KEYS[3], KEYS[4]; a cluster queues it apart).
-- KEYS[1]  the processed marker  fg:{pay:<provider>:<reference>}:processed
-- KEYS[2]  the claim             fg:{pay:<provider>:<reference>}:claim
-- KEYS[3]  (optional) the list of audit rows to write   fg:deliveries:pending
-- KEYS[4]  (optional) the drain's scheduled flag        fg:settle:scheduled
-- ARGV[1]  the delivery's fingerprint (amount, currency, payer)
-- ARGV[2]  the claimer's token
-- ARGV[3]  claim ttl (ms)
-- ARGV[4]  the audit row as JSON without its opening brace (the verdict is put in front)
-- ARGV[5]  the scheduled flag's ttl (ms)
-- Returns {verdict, 1 if a drain job must be enqueued else 0}; verdict: claimed, duplicate,
-- in_flight
local verdict
if redis.call('GET', KEYS[1]) == ARGV[1] then
  verdict = 'duplicate'
elseif redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', ARGV[3]) then
  return {'claimed', 0}
else
  verdict = 'in_flight'
end
if #KEYS < 4 then return {verdict, 0} end
local status = (verdict == 'duplicate') and '200' or '409'
redis.call('LPUSH', KEYS[3], '{"verdict":"' .. verdict .. '","status_code":' .. status .. ',' .. ARGV[4])
if redis.call('SET', KEYS[4], '1', 'NX', 'PX', ARGV[5]) then return {verdict, 1} end
return {verdict, 0}
