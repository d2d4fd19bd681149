-- Take a batch of pending settlements for one job. A job that was killed and is run again
-- gets back the batch it had taken (its processing list), topped up to the batch size, so
-- nothing is lost or skipped.
-- KEYS[1]  pending list      fg:settle:pending
-- KEYS[2]  processing list   fg:settle:processing:<job id>
-- ARGV[1]  batch size
-- Returns the batch (oldest first)
for _ = redis.call('LLEN', KEYS[2]) + 1, tonumber(ARGV[1]) do
  if not redis.call('LMOVE', KEYS[1], KEYS[2], 'RIGHT', 'LEFT') then break end
end
return redis.call('LRANGE', KEYS[2], 0, -1)
