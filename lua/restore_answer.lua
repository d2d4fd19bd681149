-- Put back the answer a lead was given, after Redis lost it (see
-- webhooks/leads/path/settlement.py Journal): set unless the claim holds an answer already. A
-- routing claim is replaced: that request routes a lead already answered, and it cannot
-- sell it while the caps are rebuilt; its release, token-checked, leaves the answer.
-- KEYS[1]  the lead claim
-- ARGV[1]  the answer (JSON)
-- ARGV[2]  its ttl (s)
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, 8) ~= 'routing:' then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return 1
