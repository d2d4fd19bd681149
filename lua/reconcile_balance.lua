-- Set a wallet's balance in Redis equal to the ledger's, at one instant: `held` becomes what
-- the live leases of every buyer billed from it hold against it (read here, from the leases
-- themselves: those whose `bkey` is this balance, or that name none) plus the prices of their
-- queued sales whose lease is gone (expired before their settlement); `wallet` takes the
-- ledger's figure if its version is newer (and the balance's events start a new cycle when it
-- leaves more to spend, as in lua/sync_balance.lua). The caller names the lease hashes it found
-- in each buyer's zset just before; if a zset's members changed meanwhile the script says so
-- and the caller reads them again (Redis Cluster runs a script safely only on the keys it
-- declares; there a wallet has one buyer, so every key is in its slot).
-- KEYS[1]            balance   keys.balance_of (fg:{w:<wallet>}:balance, or fg:{b:<id>}:balance)
-- KEYS[2..1+k]       leases    fg:{b:<id>}:leases of each of the wallet's k buyers
-- KEYS[2+k..1+k+M]   lease     fg:{b:<id>}:lease:<id>, one per id named below, buyer by buyer
-- KEYS[2+k+M..]      lease     fg:{b:<id>}:lease:<id> of each queued sale, in the order of its price
-- ARGV[1]            k
-- ARGV[2]            "<account>|<currency>"
-- ARGV[3], ARGV[4]   the wallet's balance and version in the ledger
-- ARGV[5..4+k]       m of each buyer: how many lease ids its zset had (M, their sum)
-- ARGV[5+k..4+k+M]   the lease ids, in the order of their keys
-- ARGV[5+k+M..]      each queued sale's price (minor units)
-- Returns {"unknown"} (the balance is not known: the rebuild sets it) | {"changed"} |
--   {"ok", held before, held now}
local k = tonumber(ARGV[1])
local b = redis.call('HMGET', KEYS[1], 'account', 'wallet', 'version', 'held')
if not b[2] or b[1] ~= ARGV[2] then return {'unknown'} end
local held, id = 0, 5 + k -- id: the ARGV index of the next lease id
for g = 1, k do
  local m = tonumber(ARGV[4 + g])
  local named = {}
  for i = id, id + m - 1 do named[ARGV[i]] = true end
  local members = redis.call('ZRANGE', KEYS[1 + g], 0, -1)
  if #members ~= m then return {'changed'} end
  for _, member in ipairs(members) do
    if not named[member] then return {'changed'} end
  end
  id = id + m
end
local total = id - 5 - k
for i = 2 + k, 1 + k + total do
  local lease = redis.call('HMGET', KEYS[i], 'balance', 'bkey')
  if not lease[2] or lease[2] == KEYS[1] then held = held + tonumber(lease[1] or '0') end
end
for i = 2 + k + total, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 0 then held = held + tonumber(ARGV[i + 3]) end
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
