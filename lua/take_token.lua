-- Take one token from a publisher's bucket (docs/api.md "rate_limit"): `burst` leads at once,
-- refilled at `per_second`. The time is Redis's own, so web processes whose clocks disagree
-- share one bucket exactly. Tokens are counted in millionths, so every value is an integer
-- below 2^53 (exact in Lua's doubles): a full bucket admits exactly `burst` leads at once.
-- KEYS[1]  bucket  fg:{p:<id>}:bucket  hash: tokens (millionths left), at (Redis time, unix us);
--                  it expires when it would be full again, so an idle publisher leaves nothing
-- ARGV[1]  per_second, integer >= 1 (also the refill in millionths per microsecond)
-- ARGV[2]  burst, integer >= 1
-- Returns {1, 0} when a token was taken, {0, ms until the next token} when none is left (a
-- refusal writes nothing)
local rate, full = tonumber(ARGV[1]), tonumber(ARGV[2]) * 1000000
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = full
if state[1] and state[2] then
  local elapsed = math.max(0, now - tonumber(state[2]))  -- 0: a promoted replica's clock is behind
  tokens = math.min(full, tonumber(state[1]) + elapsed * rate)
end
if tokens < 1000000 then
  return {0, math.ceil((1000000 - tokens) / rate / 1000)}
end
tokens = tokens - 1000000
redis.call('HSET', KEYS[1], 'tokens', string.format('%.0f', tokens), 'at', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], math.ceil((full - tokens) / rate / 1000) + 1)
return {1, 0}
