-- A publisher's token bucket (docs/leads.md "Rate limits"): `burst` leads at once, refilled at
-- `per_second`. Not a script of its own: lua/take_token.lua and lua/claim_lead.lua include it
-- where they say `--#include bucket` (lua/__init__.py). The time is Redis's own, so web
-- processes whose clocks disagree share one bucket exactly. Tokens are counted in millionths,
-- so every value is an integer below 2^53 (exact in Lua's doubles): a full bucket admits
-- exactly `burst` leads at once.
-- The bucket  fg:{p:<id>}:bucket  hash: tokens (millionths left), at (Redis time, unix us);
--             it expires when it would be full again, so an idle publisher leaves no key
-- take_token(key, per_second, burst), each an integer >= 1 (per_second is also the refill in
-- millionths per microsecond): true and the whole tokens left when one was taken, or false
-- and the ms until the next token (a refusal writes nothing)
local function take_token(key, per_second, burst)
  local rate, full = tonumber(per_second), tonumber(burst) * 1000000
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local state = redis.call('HMGET', key, 'tokens', 'at')
  local tokens = full
  if state[1] and state[2] then
    local elapsed = math.max(0, now - tonumber(state[2]))  -- 0: a promoted replica's clock is behind
    tokens = math.min(full, tonumber(state[1]) + elapsed * rate)
  end
  if tokens < 1000000 then
    return false, math.ceil((1000000 - tokens) / rate / 1000)
  end
  tokens = tokens - 1000000
  redis.call('HSET', key, 'tokens', string.format('%.0f', tokens), 'at', string.format('%.0f', now))
  redis.call('PEXPIRE', key, math.ceil((full - tokens) / rate / 1000) + 1)
  return true, math.floor(tokens / 1000000)
end
