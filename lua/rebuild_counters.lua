-- Restore a buyer's counters of the current windows from the ledger after Redis lost data,
-- then mark them trustworthy again. Only the holder of the rebuild lock may do it.
-- KEYS[1]   ready     fg:{b:<id>}:ready
-- KEYS[2]   lock      fg:{b:<id>}:rebuild
-- KEYS[3..] counters  fg:{b:<id>}:cap:<cap>:<window>
-- ARGV[1]   lock token
-- ARGV[2..] per counter: value, expire-at (unix s)
-- Returns 1 when rebuilt, 0 when the lock was not ours
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
for i = 3, #KEYS do
  local value, expire_at = tonumber(ARGV[2 * i - 4]), ARGV[2 * i - 3]
  if value > tonumber(redis.call('GET', KEYS[i]) or '0') then
    redis.call('SET', KEYS[i], value)
    redis.call('EXPIREAT', KEYS[i], expire_at)
  end
end
redis.call('SET', KEYS[1], '1')
redis.call('DEL', KEYS[2])
return 1
