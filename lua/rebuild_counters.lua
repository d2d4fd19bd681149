-- Restore a buyer's counters of the current windows from the ledger after Redis lost data,
-- and, for a billed buyer, its wallet's balance (the wallet, and the prices held of the sales
-- of every buyer of that wallet the ledger does not have yet), then mark them trustworthy
-- again. A balance that another buyer of the wallet rebuilt since the loss (`rebuilt`) is left
-- as it is: that rebuild counted this buyer's queued sales too, and holds taken since. Only the
-- holder of the rebuild lock may do it.
-- KEYS[1]   ready     fg:{b:<id>}:ready
-- KEYS[2]   lock      fg:{b:<id>}:rebuild
-- KEYS[3]   balance   keys.balance_of: fg:{w:<wallet>}:balance (one Redis), fg:{b:<id>}:balance
-- KEYS[4..] counters  fg:{b:<id>}:cap:<cap>:<window>
-- ARGV[1]   lock token
-- ARGV[2]   "<account>|<currency>" of a billed buyer's wallet ("": not billed)
-- ARGV[3]   its balance in the ledger, ARGV[4] its version, ARGV[5] the unsettled sales' prices
-- ARGV[6..] per counter: value, expire-at (unix s)
-- Returns 1 when rebuilt, 0 when the lock was not ours
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
if ARGV[2] ~= '' then
  local b = redis.call('HMGET', KEYS[3], 'version', 'held', 'account', 'rebuilt')
  if b[4] ~= '1' or b[3] ~= ARGV[2] then
    -- what live leases hold now was reserved after the data loss: kept on top of the ledger's
    local live = 0
    if b[1] and b[3] == ARGV[2] then live = math.max(0, tonumber(b[2] or '0')) end
    redis.call('HSET', KEYS[3], 'account', ARGV[2], 'wallet', ARGV[3], 'version', ARGV[4],
      'held', tonumber(ARGV[5]) + live, 'rebuilt', '1')
  end
end
for i = 4, #KEYS do
  local value, expire_at = tonumber(ARGV[2 * i - 2]), ARGV[2 * i - 1]
  if value > tonumber(redis.call('GET', KEYS[i]) or '0') then
    redis.call('SET', KEYS[i], value)
    redis.call('EXPIREAT', KEYS[i], expire_at)
  end
end
redis.call('SET', KEYS[1], '1')
redis.call('DEL', KEYS[2])
return 1
