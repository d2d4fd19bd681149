-- Read a buyer's counters together with every live lease, at one instant, for reconciliation.
-- Lease hashes are named from the zset's members rather than passed as KEYS: there can be
-- thousands, and they carry the buyer's hash tag, so they live in the same cluster slot as
-- the declared keys.
-- KEYS[1]    ready     fg:{b:<id>}:ready
-- KEYS[2]    leases    fg:{b:<id>}:leases
-- KEYS[3..]  counters  fg:{b:<id>}:cap:<cap>:<window>
-- ARGV[1]    lease key prefix, fg:{b:<id>}:lease:
-- Returns {"not_ready"} |
--   {"ok", now (unix us), value of each counter, then per live lease: id, its amount per counter}
if redis.call('EXISTS', KEYS[1]) == 0 then return {'not_ready'} end
local t = redis.call('TIME')
local out = {'ok', string.format('%s%06d', t[1], tonumber(t[2]))}
for i = 3, #KEYS do out[#out + 1] = redis.call('GET', KEYS[i]) or '0' end
for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  local lease = ARGV[1] .. id
  if redis.call('EXISTS', lease) == 1 then
    out[#out + 1] = id
    for i = 3, #KEYS do out[#out + 1] = redis.call('HGET', lease, KEYS[i]) or '0' end
  else
    redis.call('ZREM', KEYS[2], id)  -- expired without being finished
  end
end
return out
