-- Reserve one lead under every cap of a buyer, all or nothing, and open a lease recording
-- exactly what was incremented. Also refuses a consumer the buyer already bought (dedupe
-- keys, same hash tag), gates on the buyer's two circuits, its own and the one for this lead's
-- publisher (each lets one probe through when half-open), and on the counters being
-- trustworthy (the ready key; absent after data loss). A billed buyer's price is also held
-- against its wallet's balance, which every buyer of that wallet draws on (docs/buyers.md
-- "Balances"): no lead is reserved that would take the wallet below its floor (0, or
-- -credit_limit); the lease records which balance it holds against (`bkey`).
-- KEYS[1]         ready     fg:{b:<id>}:ready
-- KEYS[2]         breaker   fg:{b:<id>}:breaker       hash: failures, open_until, probe_until (ms)
-- KEYS[3]         pbreaker  fg:{b:<id>}:breaker:p:<publisher>  the same, for that publisher
-- KEYS[4]         lease     fg:{b:<id>}:lease:<lease> hash: <key> -> amount | "dedupe", state,
--                           probe (of the buyer's circuit), pprobe (of the publisher's)
-- KEYS[5]         leases    fg:{b:<id>}:leases        zset: lease id -> reserved at (unix us)
-- KEYS[6]         balance   fg:{w:<account>|<currency>}:balance on one Redis, fg:{b:<id>}:balance
--                           on a cluster (keys.balance_of): wallet, version, account, held
--                           (minor units; lua/sync_balance.lua, lua/rebuild_counters.lua)
-- KEYS[7..6+n]    counters  fg:{b:<id>}:cap:<cap>:<window>
-- KEYS[7+n..]     dedupe    fg:{b:<id>}:dedupe:<field>:<digest> of this lead's consumer
-- ARGV[1]         lease id
-- ARGV[2]         lease ttl (ms)
-- ARGV[3]         half-open probe ttl (ms)
-- ARGV[4]         n, the number of counters
-- ARGV[5..4+3n]   per counter: limit, amount, expire-at (unix s)
-- ARGV[5+3n]      how long a sold consumer is remembered (ms): its keys live as long as the
--                 lease until lua/finish_lease.lua confirms the sale
-- ARGV[6+3n]      the key of the attempt note the caller writes beside the reservation ("":
--                 none), kept in the lease so that the abandoned-lead sweep can find the
--                 lead of a held lease (webhooks/leads/path/recovery.py)
-- ARGV[7+3n]      the price held against the balance (minor units); 0: the buyer is not billed
-- ARGV[8+3n]      the balance's floor (0, or minus the credit limit)
-- Returns {"ok", probe 0|1, reserved at (unix us)} | {"full", counter index} | {"duplicate"}
--         | {"balance"} | {"circuit_open", "buyer" | "publisher"} | {"not_ready"}
if redis.call('EXISTS', KEYS[1]) == 0 then return {'not_ready'} end
local n = tonumber(ARGV[4])
local charge = tonumber(ARGV[7 + 3 * n])
for i = 7 + n, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then return {'duplicate'} end
end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
for i = 1, n do
  local limit, amount = tonumber(ARGV[2 + 3 * i]), tonumber(ARGV[3 + 3 * i])
  if tonumber(redis.call('GET', KEYS[6 + i]) or '0') + amount > limit then return {'full', i} end
end
if charge > 0 then
  local b = redis.call('HMGET', KEYS[6], 'wallet', 'held')
  if not b[1] then return {'not_ready'} end -- the balance is not known yet: fail closed
  if tonumber(b[1]) - tonumber(b[2] or '0') - charge < tonumber(ARGV[8 + 3 * n]) then return {'balance'} end
end
-- a circuit: 0 closed, 1 half-open with its probe slot free (this lead probes), nil open
local function gate(key)
  local c = redis.call('HMGET', key, 'open_until', 'probe_until')
  local open_until = tonumber(c[1] or '0')
  if open_until == 0 then return 0 end
  if now < open_until or tonumber(c[2] or '0') > now then return nil end
  return 1
end
local probe, pprobe = gate(KEYS[2]), gate(KEYS[3])
if probe == nil then return {'circuit_open', 'buyer'} end
if pprobe == nil then return {'circuit_open', 'publisher'} end
if probe == 1 then redis.call('HSET', KEYS[2], 'probe_until', now + tonumber(ARGV[3])) end
if pprobe == 1 then redis.call('HSET', KEYS[3], 'probe_until', now + tonumber(ARGV[3])) end
for i = 1, n do
  local amount = tonumber(ARGV[3 + 3 * i])
  redis.call('INCRBY', KEYS[6 + i], amount)
  redis.call('EXPIREAT', KEYS[6 + i], ARGV[4 + 3 * i])
  redis.call('HSET', KEYS[4], KEYS[6 + i], amount)
end
if charge > 0 then
  redis.call('HINCRBY', KEYS[6], 'held', charge)
  redis.call('HSET', KEYS[4], 'balance', charge, 'bkey', KEYS[6])
end
for i = 7 + n, #KEYS do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
  redis.call('HSET', KEYS[4], KEYS[i], 'dedupe')
end
redis.call('HSET', KEYS[4], 'state', 'held', 'probe', probe, 'pprobe', pprobe, 'dedupe_ms', ARGV[5 + 3 * n])
if ARGV[6 + 3 * n] and ARGV[6 + 3 * n] ~= '' then redis.call('HSET', KEYS[4], 'note', ARGV[6 + 3 * n]) end
redis.call('PEXPIRE', KEYS[4], ARGV[2])
redis.call('ZADD', KEYS[5], now_us, ARGV[1])
return {'ok', math.max(probe, pprobe), string.format('%s%06d', t[1], tonumber(t[2]))}
