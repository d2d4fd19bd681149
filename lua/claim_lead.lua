-- Claim a lead id for one request, and in the same step note the buyer it is about to be
-- offered to (see webhooks/leads/path/intake.py): SET NX PX on the claim; when taken, the attempt
-- note a dead request left is returned untouched, else this request's note is written.
-- It also reads the publisher's replay memory mark (keys.lead_memory): the time from which
-- this Redis remembers every answer it gave that publisher ("0": since the publisher was
-- made). A missing mark means the memory was lost; it is set anew to ARGV[5], and the
-- caller asks the ledger about leads whose claim it does not find. For one claim's life
-- after the mark (ARGV[2]) a lead whose claim holds no answer is not claimed at all: a
-- request that claimed it before the loss may still be offering it, and will write its
-- answer into the empty claim when it ends.
-- KEYS[1]  the lead claim   fg:{p:<publisher>}:lead:<lead_id>
-- KEYS[2]  its attempt note fg:{p:<publisher>}:lead:<lead_id>:attempt
-- KEYS[3]  the mark         fg:{p:<publisher>}:memory
-- First, when asked (ARGV[6] > 0), it takes the lead's token from the publisher's bucket
-- (lua/bucket.lua); an empty bucket refuses the lead before anything else is read or written.
-- KEYS[4]  the publisher's token bucket fg:{p:<publisher>}:bucket
-- KEYS[5..] (optional) the publisher's cap counters of the current windows
--           fg:{p:<publisher>}:cap:<hourly|daily>:<window start>: a lead this request claims
--           afresh counts in each, or is refused when one is full (a replay, a held claim or
--           a dead request's lead, counted when first claimed, is not counted again)
-- ARGV[1]  the claimer's token
-- ARGV[2]  claim ttl (ms)
-- ARGV[3]  this request's note ("" when it has none yet)
-- ARGV[4]  note ttl (ms)
-- ARGV[5]  now (ms since the epoch)
-- ARGV[6]  the bucket's per_second (0: take no token), ARGV[7] its burst
-- ARGV[8..] per counter of KEYS[5..]: its limit, then its ttl (s)
-- Returns {code, value, mark, tokens}: tokens is the whole tokens the bucket has left (-1 when
-- none was taken); {1, false, ...} when claimed, {1, old note, ...} when claimed after a dead
-- request, {0, current value, ...} when another request holds the claim or it holds an
-- answer, {2, false, ...} when it must wait (the mark is that young), {3, i, ...} when the
-- publisher's cap counter KEYS[4 + i] is full (nothing set), {4, ms until the next token,
-- "0", -1} when the bucket is empty (nothing read or set)
--#include bucket
local tokens = -1
if tonumber(ARGV[6]) > 0 then
  local taken, value = take_token(KEYS[4], ARGV[6], ARGV[7])
  if not taken then return {4, value, '0', -1} end
  tokens = value
end
local mark = redis.call('GET', KEYS[3])
if not mark then
  mark = ARGV[5]
  redis.call('SET', KEYS[3], mark)
end
local held = redis.call('GET', KEYS[1])
if held then return {0, held, mark, tokens} end
if mark ~= '0' and tonumber(ARGV[5]) - tonumber(mark) < tonumber(ARGV[2]) then
  return {2, false, mark, tokens}
end
local old = redis.call('GET', KEYS[2])
if not old then
  for i = 5, #KEYS do
    if tonumber(redis.call('GET', KEYS[i]) or '0') >= tonumber(ARGV[2 * i - 2]) then
      return {3, i - 4, mark, tokens}
    end
  end
  for i = 5, #KEYS do
    if redis.call('INCR', KEYS[i]) == 1 then redis.call('EXPIRE', KEYS[i], ARGV[2 * i - 1]) end
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if old then return {1, old, mark, tokens} end
if ARGV[3] ~= '' then redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4]) end
return {1, false, mark, tokens}
