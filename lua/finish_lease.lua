-- Finish a lease after the delivery: confirm it (accepted) or refund it (anything else), and
-- feed the buyer's circuits (docs/leads.md "Circuit breakers"). A lease is refunded at most
-- once, only by the counters it recorded, and never after it was confirmed, even when its
-- window has rolled over. A refund also forgets the consumer the lease remembered (its dedupe
-- keys, if still its own), and gives the price it held back to the balance it was held
-- against (its `bkey`: the wallet's, shared by the wallet's buyers, even when the buyer has been
-- billed from another wallet since); a confirmed lease keeps it held until its settlement is
-- in the ledger (lua/sync_balance.lua).
-- KEYS[1]   lease      fg:{b:<id>}:lease:<lease>
-- KEYS[2]   breaker    fg:{b:<id>}:breaker                 the buyer's circuit, for everyone
-- KEYS[3]   leases     fg:{b:<id>}:leases
-- KEYS[4]   pbreaker   fg:{b:<id>}:breaker:p:<publisher>   its circuit for the lead's publisher
-- KEYS[5]   publishers fg:{b:<id>}:breaker:publishers      zset: publisher -> open_until (ms)
-- KEYS[6]   balance    fg:{b:<id>}:balance                 the buyer's own balance key: on a
--                      cluster the one its leases hold against (their `bkey`); on one Redis
--                      only a lease without `bkey` holds against it, the others name their
--                      wallet's fg:{w:...}:balance (one Redis serves every slot)
-- KEYS[7..] the counters the lease incremented, then its dedupe keys
-- ARGV[1]   outcome: accepted | rejected | error (a reply that failed: maybe the lead's doing)
--           | unreachable (no reply: a connection error or the deadline) | withdrawn (refund;
--           the buyer was not called, so the circuits are left as they are)
-- ARGV[2]   failures that open a circuit
-- ARGV[3]   circuit cool-down (ms)
-- ARGV[4]   ttl of a confirmed lease until its settlement deletes it (ms)
-- ARGV[5]   lease id
-- ARGV[6]   the lead's publisher ("": unknown, its failed replies count for the buyer's circuit)
-- ARGV[7]   publishers whose circuits, open within a cool-down of each other, open the buyer's
-- ARGV[8]   how long a publisher's circuit is remembered after it last changed (ms)
-- Returns 1 when the lease changed state, 0 when it was already finished or has expired
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local outcome, publisher, cooldown = ARGV[1], ARGV[6], tonumber(ARGV[3])
local state = redis.call('HGET', KEYS[1], 'state')
local probe = redis.call('HMGET', KEYS[1], 'probe', 'pprobe')
local bprobe, pprobe = probe[1] == '1', probe[2] == '1'
local function fail(key, is_probe) -- one more failure in a row: whether it opened the circuit
  if redis.call('HINCRBY', key, 'failures', 1) < tonumber(ARGV[2]) and not is_probe then return false end
  redis.call('HSET', key, 'open_until', now + cooldown)
  redis.call('HDEL', key, 'probe_until')
  return true
end
if outcome == 'accepted' or outcome == 'rejected' then
  -- the buyer answered: close both circuits (unless this only repeats an accept already
  -- confirmed, by a routing that died before it could settle: old news)
  if state ~= 'confirmed' then
    redis.call('DEL', KEYS[2], KEYS[4])
    redis.call('ZREM', KEYS[5], publisher)
  end
elseif outcome == 'withdrawn' then
  -- the buyer was not called: a probe the lease was frees its slot for the next lead
  if bprobe then redis.call('HDEL', KEYS[2], 'probe_until') end
  if pprobe then redis.call('HDEL', KEYS[4], 'probe_until') end
elseif outcome == 'unreachable' or publisher == '' then
  -- not about one publisher's leads: the buyer's own circuit counts it
  if pprobe then redis.call('HDEL', KEYS[4], 'probe_until') end
  fail(KEYS[2], bprobe)
else
  -- a failed reply may be about this publisher's leads: its circuit counts it. The buyer's
  -- opens when the circuits of several publishers opened within a cool-down of each other.
  if bprobe then redis.call('HDEL', KEYS[2], 'probe_until') end
  local opened = fail(KEYS[4], pprobe)
  redis.call('PEXPIRE', KEYS[4], ARGV[8])
  if opened then
    redis.call('ZADD', KEYS[5], now + cooldown, publisher)
    redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now - tonumber(ARGV[8]))
  end
  if (opened or bprobe) and redis.call('ZCOUNT', KEYS[5], now - cooldown, '+inf') >= tonumber(ARGV[7]) then
    redis.call('HSET', KEYS[2], 'open_until', now + cooldown)
  end
end
if state ~= 'held' then return 0 end
if outcome == 'accepted' then
  redis.call('HSET', KEYS[1], 'state', 'confirmed')
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  -- the consumer is bought: remember it for the buyer's dedupe days, not the lease's life
  local dedupe_ms = redis.call('HGET', KEYS[1], 'dedupe_ms')
  for i = 7, #KEYS do
    if redis.call('HGET', KEYS[1], KEYS[i]) == 'dedupe' and redis.call('GET', KEYS[i]) == ARGV[5] then
      redis.call('PEXPIRE', KEYS[i], dedupe_ms)
    end
  end
  return 1
end
local hold = redis.call('HMGET', KEYS[1], 'balance', 'bkey')
local held, bkey = tonumber(hold[1] or '0'), hold[2] or KEYS[6]
if held > 0 and redis.call('HINCRBY', bkey, 'held', -held) < 0 then redis.call('HSET', bkey, 'held', 0) end
for i = 7, #KEYS do
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
