-- Give a returned lead's slot (and budget) back to the counters of windows still current,
-- unless a reconciliation of the buyer is under way: it read (or will read) the ledger after
-- taking its lock, so it counts the return itself; decrementing too would count it twice.
-- KEYS[1]   reconciling  fg:{b:<id>}:reconciling
-- KEYS[2..] counters     fg:{b:<id>}:cap:<cap>:<window>
-- ARGV[i]   per counter: amount to give back
-- Returns 1 when given back, 0 when left to the reconciliation
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
for i = 2, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 and redis.call('DECRBY', KEYS[i], ARGV[i - 1]) < 0 then
    redis.call('SET', KEYS[i], 0, 'KEEPTTL')
  end
end
return 1
