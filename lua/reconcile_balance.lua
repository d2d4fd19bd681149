-- Set a billed buyer's balance in Redis equal to the ledger's, at one instant: `held` becomes
-- what the buyer's live leases hold (read here, from the leases themselves) plus the prices of
-- its queued sales whose lease is gone (expired before their settlement); `wallet` takes the
-- ledger's figure if its version is newer (and the balance's events start a new cycle when it
-- leaves more to spend, as in lua/sync_balance.lua). The caller names the lease hashes it found in the
-- zset just before; if the zset's members changed meanwhile the script says so and the caller
-- reads them again (Redis Cluster runs a script safely only on the keys it declares).
-- KEYS[1]          balance   fg:{b:<id>}:balance
-- KEYS[2]          leases    fg:{b:<id>}:leases
-- KEYS[3..2+m]     lease     fg:{b:<id>}:lease:<id>, one per id in the zset
-- KEYS[3+m..]      lease     fg:{b:<id>}:lease:<id> of each queued sale, in the order of its price
-- ARGV[1]          m
-- ARGV[2]          "<account>|<currency>"
-- ARGV[3], ARGV[4] the wallet's balance and version in the ledger
-- ARGV[5..4+m]     the zset's lease ids, in the order of their keys
-- ARGV[5+m..]      each queued sale's price (minor units)
-- Returns {"unknown"} (the balance is not known: the rebuild sets it) | {"changed"} |
--   {"ok", held before, held now}
local m = tonumber(ARGV[1])
local b = redis.call('HMGET', KEYS[1], 'account', 'wallet', 'version', 'held')
if not b[2] or b[1] ~= ARGV[2] then return {'unknown'} end
local named = {}
for i = 5, 4 + m do named[ARGV[i]] = true end
local members = redis.call('ZRANGE', KEYS[2], 0, -1)
if #members ~= m then return {'changed'} end
for _, id in ipairs(members) do
  if not named[id] then return {'changed'} end
end
local held = 0
for i = 3, 2 + m do held = held + tonumber(redis.call('HGET', KEYS[i], 'balance') or '0') end
for i = 3 + m, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 0 then held = held + tonumber(ARGV[2 + i]) end
end
redis.call('HSET', KEYS[1], 'held', held)
if tonumber(ARGV[4]) > tonumber(b[3] or '-1') then
  redis.call('HSET', KEYS[1], 'wallet', ARGV[3], 'version', ARGV[4])
  -- a newer figure that leaves more to spend starts a cycle, as lua/sync_balance.lua does
  if tonumber(ARGV[3]) - held > tonumber(b[2]) - tonumber(b[4] or '0') then
    redis.call('HSET', KEYS[1], 'cycle', ARGV[4])
  end
end
return {'ok', tonumber(b[4] or '0'), held}
