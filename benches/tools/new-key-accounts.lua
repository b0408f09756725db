-- wrk script: like new-key.lua, but every request goes to one of 64 accounts in turn
-- (API keys bench-key-0 .. bench-key-63, as benches/pg_speed.sh configures the server).
local counter = 0
local prefix = ""
local body = '{"amount": 100.00, "currency": "BRL"}'

-- Each wrk thread runs this script in a Lua state of its own: `setup` numbers the threads so two
-- threads of one wrk process never draw the same keys.
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("thread_id", threads)
end

function init(args)
  prefix = string.format("%s-%d-t%d", args[1] or "k", os.time(), thread_id or 0)
end

function request()
  counter = counter + 1
  return wrk.format("POST", "/payments", {
    ["Authorization"] = "Bearer bench-key-" .. (counter % 64),
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = prefix .. "-" .. counter,
  }, body)
end

function done(summary, latency, requests)
  io.write(string.format("RESULT requests=%d duration_s=%.3f non2xx=%d errors=%d p50_ms=%.3f p99_ms=%.3f\n",
    summary.requests, summary.duration / 1e6, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
