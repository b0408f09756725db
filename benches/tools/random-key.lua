-- wrk script: POST /payments with a new random, UUID-shaped Idempotency-Key on every request, the
-- way most clients draw them (new-key.lua's keys are a prefix and a counter, so they land at one end
-- of a B-tree index; these land all over it).
--   wrk -t2 -c64 -d8s -s benches/tools/random-key.lua http://127.0.0.1:8080
local threads = 0
function setup(thread) threads = threads + 1; thread:set("thread_id", threads) end
function init(args) math.randomseed(os.time() * 1000 + (thread_id or 0) * 7919 + os.clock() * 1e6) end
local function hex(n) local t = {} for i = 1, n do t[i] = string.format("%x", math.random(0, 15)) end return table.concat(t) end
function request()
  local key = hex(8) .. "-" .. hex(4) .. "-4" .. hex(3) .. "-a" .. hex(3) .. "-" .. hex(12)
  return wrk.format("POST", "/payments", {
    ["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer sk_test_alpha",
    ["Idempotency-Key"] = key,
  }, '{"amount": 100.00, "currency": "BRL"}')
end
function done(summary, latency, requests)
  io.write(string.format("non2xx=%d\n", summary.errors.status))
end
