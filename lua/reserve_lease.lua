-- Reserve one lead under every cap of a buyer, all or nothing, and open a lease recording
-- exactly what was incremented. Also refuses a consumer the buyer already bought (dedupe
-- keys, same hash tag), gates on the buyer's circuit breaker (one probe when half-open) and
-- on the counters being trustworthy (the ready key; absent after data loss).
-- KEYS[1]         ready     fg:{b:<id>}:ready
-- KEYS[2]         breaker   fg:{b:<id>}:breaker       hash: failures, open_until, probe_until (ms)
-- KEYS[3]         lease     fg:{b:<id>}:lease:<lease> hash: <key> -> amount | "dedupe", state, probe
-- KEYS[4]         leases    fg:{b:<id>}:leases        zset: lease id -> reserved at (unix us)
-- KEYS[5..4+n]    counters  fg:{b:<id>}:cap:<cap>:<window>
-- KEYS[5+n..]     dedupe    fg:{b:<id>}:dedupe:<field>:<digest> of this lead's consumer
-- ARGV[1]         lease id
-- ARGV[2]         lease ttl (ms)
-- ARGV[3]         half-open probe ttl (ms)
-- ARGV[4]         n, the number of counters
-- ARGV[5..4+3n]   per counter: limit, amount, expire-at (unix s)
-- ARGV[5+3n]      how long a sold consumer is remembered (ms): its keys live as long as the
--                 lease until lua/finish_lease.lua confirms the sale
-- ARGV[6+3n]      the key of the attempt note the caller writes beside the reservation ("":
--                 none), kept in the lease so that the abandoned-lead sweep can find the
--                 lead of a held lease (webhooks/leads/recovery.py)
-- Returns {"ok", probe 0|1, reserved at (unix us)} | {"full", counter index} | {"duplicate"}
--         | {"circuit_open"} | {"not_ready"}
if redis.call('EXISTS', KEYS[1]) == 0 then return {'not_ready'} end
local n = tonumber(ARGV[4])
for i = 5 + n, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then return {'duplicate'} end
end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
for i = 1, n do
  local limit, amount = tonumber(ARGV[2 + 3 * i]), tonumber(ARGV[3 + 3 * i])
  if tonumber(redis.call('GET', KEYS[4 + i]) or '0') + amount > limit then return {'full', i} end
end
local probe = 0
local open_until = tonumber(redis.call('HGET', KEYS[2], 'open_until') or '0')
if open_until > 0 then
  if now < open_until then return {'circuit_open'} end
  if tonumber(redis.call('HGET', KEYS[2], 'probe_until') or '0') > now then return {'circuit_open'} end
  redis.call('HSET', KEYS[2], 'probe_until', now + tonumber(ARGV[3]))
  probe = 1
end
for i = 1, n do
  local amount = tonumber(ARGV[3 + 3 * i])
  redis.call('INCRBY', KEYS[4 + i], amount)
  redis.call('EXPIREAT', KEYS[4 + i], ARGV[4 + 3 * i])
  redis.call('HSET', KEYS[3], KEYS[4 + i], amount)
end
for i = 5 + n, #KEYS do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
  redis.call('HSET', KEYS[3], KEYS[i], 'dedupe')
end
redis.call('HSET', KEYS[3], 'state', 'held', 'probe', probe, 'dedupe_ms', ARGV[5 + 3 * n])
if ARGV[6 + 3 * n] and ARGV[6 + 3 * n] ~= '' then redis.call('HSET', KEYS[3], 'note', ARGV[6 + 3 * n]) end
redis.call('PEXPIRE', KEYS[3], ARGV[2])
redis.call('ZADD', KEYS[4], now_us, ARGV[1])
return {'ok', probe, string.format('%s%06d', t[1], tonumber(t[2]))}
