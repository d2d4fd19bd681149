-- wrk script: POST a lead with a unique lead_id, then print the latency distribution as JSON.
local counter = 0
local threads = {}
local prefix = ""

function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  prefix = (args[1] or "run") .. "-" .. id .. "-"
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = "Bearer " .. (args[2] or "pk_bench_0123456789abcdef")
end

function request()
  counter = counter + 1
  local body = '{"lead_id":"' .. prefix .. counter .. '","state":"TX","email":"ada@example.com","phone":"+15125550100"}'
  return wrk.format(nil, "/v1/leads", nil, body)
end

function done(summary, latency, requests)
  io.write(string.format(
    'JSON {"requests": %d, "duration_us": %d, "errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, "p50_us": %d, "p95_us": %d, "p99_us": %d, "max_us": %d}\n',
    summary.requests, summary.duration, summary.errors.connect, summary.errors.read,
    summary.errors.write, summary.errors.status, summary.errors.timeout,
    latency:percentile(50), latency:percentile(95), latency:percentile(99), latency.max))
end
