-- Read a buyer's counters together with every live lease, at one instant, for reconciliation.
-- The caller names the lease hashes it found in the zset just before (Redis Cluster runs a
-- script safely only on the keys it declares, e.g. while a slot migrates); if the zset's
-- members changed meanwhile the script says so and the caller reads them again.
-- KEYS[1]        ready     fg:{b:<id>}:ready
-- KEYS[2]        leases    fg:{b:<id>}:leases
-- KEYS[3..2+n]   counters  fg:{b:<id>}:cap:<cap>:<window>
-- KEYS[3+n..]    lease     fg:{b:<id>}:lease:<id>, one per id in ARGV[2..]
-- ARGV[1]        n, the number of counters
-- ARGV[2..]      the ids of the leases, in the order of their keys
-- Returns {"not_ready"} | {"changed"} |
--   {"ok", now (unix us), value of each counter, then per live lease: id, its amount per counter}
if redis.call('EXISTS', KEYS[1]) == 0 then return {'not_ready'} end
local n = tonumber(ARGV[1])
local named = {}
for i = 2, #ARGV do named[ARGV[i]] = true end
local members = redis.call('ZRANGE', KEYS[2], 0, -1)
if #members ~= #ARGV - 1 then return {'changed'} end
for _, id in ipairs(members) do
  if not named[id] then return {'changed'} end
end
local t = redis.call('TIME')
local out = {'ok', string.format('%s%06d', t[1], tonumber(t[2]))}
for i = 3, 2 + n do out[#out + 1] = redis.call('GET', KEYS[i]) or '0' end
for j = 2, #ARGV do
  local lease = KEYS[1 + n + j]
  if redis.call('EXISTS', lease) == 1 then
    out[#out + 1] = ARGV[j]
    for i = 3, 2 + n do out[#out + 1] = redis.call('HGET', lease, KEYS[i]) or '0' end
  else
    redis.call('ZREM', KEYS[2], ARGV[j])  -- expired without being finished
  end
end
return out
