-- Take one pre-ping from a publisher's quota (webhooks/leads/rules/precheck_quota.py): at
-- most daily_floor + per_lead x the leads it posted in the last n UTC hours (this hour and
-- the n - 1 before it), counting the pre-pings of those hours. Read and taken in one step,
-- so that no number of pre-pings at once can pass the quota.
-- KEYS[1..n]     leads posted per UTC hour, this hour first  fg:{p:<publisher>}:cap:hourly:<hour>
--                (counted by lua/claim_lead.lua with each lead it claims afresh)
-- KEYS[n+1..2n]  pre-pings per UTC hour, this hour first     fg:{p:<publisher>}:precheck:<hour>
-- ARGV[1]  per_lead
-- ARGV[2]  daily_floor
-- ARGV[3]  ttl (s) of this hour's pre-ping counter (it outlives the n hours, then goes)
-- Returns {1, pre-pings of the n hours with this one, quota} when taken; {0, k, quota} when
-- the quota is used up: k hour boundaries from now (1..n) are the first at which a pre-ping
-- would fit, the hours that leave the window by then taking their leads and pre-pings with
-- them (n when none would: no floor and no leads).
local n = #KEYS / 2
local posted, used = {}, {}
local leads, prechecks = 0, 0
for i = 1, n do
  posted[i] = tonumber(redis.call('GET', KEYS[i]) or '0')
  used[i] = tonumber(redis.call('GET', KEYS[n + i]) or '0')
  leads = leads + posted[i]
  prechecks = prechecks + used[i]
end
local per_lead, floor = tonumber(ARGV[1]), tonumber(ARGV[2])
local quota = floor + per_lead * leads
if prechecks < quota then
  if redis.call('INCR', KEYS[n + 1]) == 1 then redis.call('EXPIRE', KEYS[n + 1], ARGV[3]) end
  return {1, prechecks + 1, quota}
end
for k = 1, n - 1 do
  leads = leads - posted[n - k + 1]
  prechecks = prechecks - used[n - k + 1]
  if prechecks < floor + per_lead * leads then return {0, k, quota} end
end
return {0, n, quota}
