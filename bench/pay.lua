-- wrk script: POST payment deliveries from a generated list (bench/knee.py writes it: a Lua
-- file returning {{path, {header = value, ...}, body}, ...}), each thread taking every n-th
-- one from its own offset, then print the latency distribution as JSON.
local threads = {}
local list, i, step = nil, 0, 1

function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  list = dofile(args[1])
  step = tonumber(args[2] or "1")
  i = id - step
end

function request()
  i = i + step
  if i > #list then i = ((i - 1) % #list) + 1 end  -- past the end: repeats, as a provider retries
  local d = list[i]
  return wrk.format("POST", d[1], d[2], d[3])
end

function done(summary, latency, requests)
  io.write(string.format(
    'JSON {"requests": %d, "duration_us": %d, "errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, "p50_us": %d, "p95_us": %d, "p99_us": %d, "max_us": %d}\n',
    summary.requests, summary.duration, summary.errors.connect, summary.errors.read,
    summary.errors.write, summary.errors.status, summary.errors.timeout,
    latency:percentile(50), latency:percentile(95), latency:percentile(99), latency.max))
end
