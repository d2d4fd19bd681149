-- Bring a wallet's balance in Redis up to the ledger's wallet, once per change: the
-- wallet's figure is taken only with a newer version than the one held (versions count the
-- wallet's changes in the ledger, so a late or repeated sync changes nothing), and each sale
-- now in the ledger gives back the price its confirmed lease held against this balance (once:
-- the lease forgets it; a lease that held against another wallet's is left to the
-- reconciliation of that one). The ledger is read after its commit, so a newer figure includes every older change.
-- The balance's `cycle` starts again (takes the figure's version) when a newer figure leaves
-- more to spend (wallet - held) than before the sync: a top-up, or any other credit (a
-- return, a reinstated dispute); a sale's debit and the release of its hold cancel out. The
-- buyer's balance events go out once per cycle (docs/buyers.md "Balances").
-- KEYS[1]   balance   keys.balance_of: fg:{w:<wallet>}:balance (one Redis) or fg:{b:<id>}:balance
--                     (cluster); hash: account, wallet, version, held, cycle
-- KEYS[2..] leases    fg:{b:<id>}:lease:<id> of sales the ledger now has (their charge debited)
-- ARGV[1]   the wallet's account and currency ("<account>|<currency>")
-- ARGV[2]   the wallet's balance in the ledger (minor units)
-- ARGV[3]   the wallet's version in the ledger
-- ARGV[4]   "init": the buyer was just billed (or billed from another wallet): take the figure
--           whatever the version, keeping what live leases hold, and start a cycle; "": a
--           change of the ledger, taken only when the balance is known already (else the
--           rebuild reads the ledger)
-- Returns {wallet, held, cycle} after the sync ({} when the balance is not known)
local b = redis.call('HMGET', KEYS[1], 'account', 'wallet', 'version', 'held')
local taken = false
if ARGV[4] == 'init' and (b[1] ~= ARGV[1] or not b[2]) then
  redis.call('HSET', KEYS[1], 'account', ARGV[1], 'wallet', ARGV[2], 'version', ARGV[3], 'cycle', ARGV[3])
  redis.call('HSETNX', KEYS[1], 'held', 0)
elseif b[2] and b[1] == ARGV[1] and tonumber(ARGV[3]) > tonumber(b[3] or '-1') then
  redis.call('HSET', KEYS[1], 'wallet', ARGV[2], 'version', ARGV[3])
  taken = true
end
for i = 2, #KEYS do
  local lease = redis.call('HMGET', KEYS[i], 'balance', 'bkey')
  local held = tonumber(lease[1] or '0')
  if held > 0 and lease[2] == KEYS[1] then
    redis.call('HDEL', KEYS[i], 'balance')
    if redis.call('HINCRBY', KEYS[1], 'held', -held) < 0 then redis.call('HSET', KEYS[1], 'held', 0) end
  end
end
local after = redis.call('HMGET', KEYS[1], 'wallet', 'held', 'version')
if not after[1] then return {} end
if taken and tonumber(after[1]) - tonumber(after[2] or '0') > tonumber(b[2]) - tonumber(b[4] or '0') then
  redis.call('HSET', KEYS[1], 'cycle', ARGV[3])
end
-- a balance rebuilt after a data loss has no cycle: it starts one at its version
redis.call('HSETNX', KEYS[1], 'cycle', after[3] or '0')
local cycle = redis.call('HGET', KEYS[1], 'cycle')
return {tonumber(after[1]), tonumber(after[2] or '0'), tonumber(cycle)}
