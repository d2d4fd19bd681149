-- Remember a lead's answer for replays and forget its attempt note, only while the claim is
-- this request's (or expired with nobody after it): a request that outlived its claim (a
-- stalled process) must not write over the answer or the note of the request that holds it
-- now (see webhooks/leads/path/intake.py).
-- KEYS[1]  the lead claim   fg:{p:<publisher>}:lead:<lead_id>
-- KEYS[2]  its attempt note
-- ARGV[1]  the claimer's token
-- ARGV[2]  the answer (JSON)
-- ARGV[3]  its ttl (s)
-- Returns 1 when written, else what the claim holds
local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[1] then return held end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
redis.call('DEL', KEYS[2])
return 1
