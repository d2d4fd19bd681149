-- Finish a lease after the delivery: confirm it (accepted) or refund it (anything else), and
-- feed the buyer's circuit breaker. A lease is refunded at most once, only by the counters it
-- recorded, and never after it was confirmed, even when its window has rolled over. A refund
-- also forgets the consumer the lease remembered (its dedupe keys, if still its own).
-- KEYS[1]   lease     fg:{b:<id>}:lease:<lease>
-- KEYS[2]   breaker   fg:{b:<id>}:breaker
-- KEYS[3]   leases    fg:{b:<id>}:leases
-- KEYS[4..] the counters the lease incremented, then its dedupe keys
-- ARGV[1]   outcome: accepted | rejected | error | timeout | withdrawn (refund; the buyer was
--           not called, so the breaker is left as it is)
-- ARGV[2]   failures that open the breaker
-- ARGV[3]   breaker cool-down (ms)
-- ARGV[4]   ttl of a confirmed lease until its settlement deletes it (ms)
-- ARGV[5]   lease id
-- Returns 1 when the lease changed state, 0 when it was already finished or has expired
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local outcome = ARGV[1]
local state = redis.call('HGET', KEYS[1], 'state')
if outcome == 'accepted' or outcome == 'rejected' then
  -- the buyer answered: close the breaker (unless this only repeats an accept already
  -- confirmed, by a routing that died before it could settle: old news)
  if state ~= 'confirmed' then redis.call('DEL', KEYS[2]) end
elseif outcome == 'withdrawn' then
  -- the buyer was not called: a probe it was to be frees the probe slot for the next lead
  if redis.call('HGET', KEYS[1], 'probe') == '1' then redis.call('HDEL', KEYS[2], 'probe_until') end
else
  local failures = redis.call('HINCRBY', KEYS[2], 'failures', 1)
  if redis.call('HGET', KEYS[1], 'probe') == '1' or failures >= tonumber(ARGV[2]) then
    redis.call('HSET', KEYS[2], 'open_until', now + tonumber(ARGV[3]))
    redis.call('HDEL', KEYS[2], 'probe_until')
  end
end
if state ~= 'held' then return 0 end
if outcome == 'accepted' then
  redis.call('HSET', KEYS[1], 'state', 'confirmed')
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  -- the consumer is bought: remember it for the buyer's dedupe days, not the lease's life
  local dedupe_ms = redis.call('HGET', KEYS[1], 'dedupe_ms')
  for i = 4, #KEYS do
    if redis.call('HGET', KEYS[1], KEYS[i]) == 'dedupe' and redis.call('GET', KEYS[i]) == ARGV[5] then
      redis.call('PEXPIRE', KEYS[i], dedupe_ms)
    end
  end
  return 1
end
for i = 4, #KEYS do
  local recorded = redis.call('HGET', KEYS[1], KEYS[i])
  if recorded == 'dedupe' then
    if redis.call('GET', KEYS[i]) == ARGV[5] then redis.call('DEL', KEYS[i]) end
  else
    local amount = tonumber(recorded or '0')
    if amount > 0 and redis.call('EXISTS', KEYS[i]) == 1 then
      if redis.call('DECRBY', KEYS[i], amount) < 0 then redis.call('SET', KEYS[i], 0, 'KEEPTTL') end
    end
  end
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[3], ARGV[5])
return 1
