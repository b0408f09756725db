-- wrk script for run_proxy_bench.sh: every request a POST with a new Idempotency-Key, body fixed.
-- Env: PROXY_PATH (request path; idempotent-proxy-server needs /URL_<NAME>), KEY_PREFIX (unique per
-- wrk invocation, so that no key of a run was seen before by a proxy that keeps state).
-- done() prints non2xx (wrk counts responses with status > 399 in errors.status; a full per-response
-- status check would run a Lua callback per response and slow the client down for every candidate;
-- the harness checks one response of every candidate with curl before its window), and p50/p99 in µs.
local path = os.getenv("PROXY_PATH") or "/payments"
local prefix = os.getenv("KEY_PREFIX") or "k"
-- NO_KEY=1: no Idempotency-Key at all (a pass-through request for a proxy; diagnostic only)
local no_key = os.getenv("NO_KEY") == "1"
local body = '{"amount": 100.00, "currency": "BRL"}'
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("thread_id", threads)
end
local counter = 0
function request()
  counter = counter + 1
  if no_key then
    return wrk.format("POST", path, { ["Content-Type"] = "application/json" }, body)
  end
  return wrk.format("POST", path, {
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = string.format("%s-%d-%d", prefix, thread_id, counter),
  }, body)
end
function done(summary, latency, requests)
  io.write(string.format("non2xx=%d\n", summary.errors.status))
  io.write(string.format("sockerr=%d\n", summary.errors.connect + summary.errors.read
    + summary.errors.write + summary.errors.timeout))
  io.write(string.format("p50_us=%d\np99_us=%d\n", latency:percentile(50), latency:percentile(99)))
end
