-- test_policy_clock.lua — the replay's model clock (engine.h, li_step_cost):
--  * a step advances the engine clock by exactly a + b*prefill_tokens +
--    c*decode_rows + d*context; first_scheduled is stamped at the step's
--    start, first_token at its end; advance_clock only moves forward; back
--    to wall time the clock goes on from where the model left it;
--  * `bench replay --clock model` gives the same TTFT/TPOT/queue/goodput
--    numbers on two runs (they depend on trace, policy and cost model only),
--    for default.lua and slo.lua (whose step-time estimate reads the clock);
--  * bad set_clock arguments and a bad cost file are one-line errors.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local H = require("harness")
local luainfer = require("luainfer")
local json = require("luainfer.json")
local root = H.repo_root()

local function near(x, want) return math.abs(x - want) <= 1e-9 * math.max(1, math.abs(want)) end
local function toks(seed, n)
  local t = {}
  for k = 1, n do t[k] = 1000 + (seed * 7919 + k * 104729) % 30000 end
  return t
end

-- ---- the cost of a step, exactly -------------------------------------------------
do
  local cost = { a = 0.01, b = 0.001, c = 0.002, d = 1e-6, start = 0 }
  local e = luainfer.engine{ policy = root .. "/policies/default.lua", max_num_seqs = 4 }
  e:set_clock(cost)
  H.check(e:now() == 0, "the model clock starts at 0, got %g", e:now())
  local id = e:add{ tokens = toks(1, 20), max_tokens = 3, temperature = 0, ignore_eos = true }
  e:step() -- prefill of 20 tokens: context 1 + 2 + ... + 20
  local t1 = 0.01 + 0.001 * 20 + 1e-6 * 210
  H.check(near(e:now(), t1), "after the prefill: %.9f, want %.9f", e:now(), t1)
  local r = e:result(id)
  H.check(r.first_scheduled_time == 0, "first scheduled at the step's start, got %g", r.first_scheduled_time)
  H.check(near(r.first_token_time, t1), "first token at the step's end, got %g", r.first_token_time)
  e:step() -- one decode row at position 20: attends to 21
  local t2 = t1 + 0.01 + 0.002 + 1e-6 * 21
  H.check(near(e:now(), t2), "after a decode: %.9f, want %.9f", e:now(), t2)
  e:advance_clock(5)
  H.check(e:now() == 5, "advance_clock(5): %g", e:now())
  e:advance_clock(1)
  H.check(e:now() == 5, "advance_clock never goes back: %g", e:now())
  e:set_clock(nil)
  local w = e:now()
  H.check(w >= 5 and w < 6, "wall time goes on from the model clock: %g", w)
  H.check(not pcall(e.set_clock, e, { a = -1 }), "a negative cost is an error")
  H.check(not pcall(e.set_clock, e, { b = "x" }), "a non-number cost is an error")
  e:run()
  e:close()
end

-- ---- two replays, the same numbers ----------------------------------------------
local trace = os.tmpname()
H.temp_files = { trace }
do
  local f = assert(io.open(trace, "w"))
  local rows = {
    { t = 0.0, prompt = "The capital of France is", max_tokens = 6 },
    { t = 0.01, prompt_len = 40, max_tokens = 5, slo_ttft_ms = 100 },
    { t = 0.02, prompt = "Once upon a time", max_tokens = 7, slo_tpot_ms = 5000 },
    { t = 0.5, prompt_len = 24, max_tokens = 4 },
    { t = 3.0, prompt = "Later on", max_tokens = 3 },
  }
  for _, r in ipairs(rows) do f:write(json.encode(r), "\n") end
  f:close()
end

local function replay(extra)
  local out = os.tmpname()
  H.temp_files[#H.temp_files + 1] = out
  local args = { [0] = root .. "/bench/bench_replay.lua", trace, "--policy", root .. "/policies/default.lua",
                 "--policy", root .. "/policies/slo.lua", "--rate-scale", "1,4", "--json", out }
  for _, a in ipairs(extra) do args[#args + 1] = a end
  local saved = arg
  arg = args
  local ok, err = pcall(dofile, root .. "/bench/bench_replay.lua")
  arg = saved
  if not ok then return nil, err end
  local f = assert(io.open(out))
  local res = json.decode(f:read("*a"))
  f:close()
  return res
end

local keys = { "ttft_p50", "ttft_p99", "ttft_max", "tpot_p50", "tpot_max", "queue_p99", "goodput", "makespan_s",
               "throughput", "steps", "preemptions" }
local r1 = assert(replay({ "--clock", "model" }))
local r2 = assert(replay({ "--clock", "model" }))
H.check(#r1.runs == 4 and #r2.runs == 4, "four runs each")
for i, a in ipairs(r1.runs) do
  local b = r2.runs[i]
  for _, k in ipairs(keys) do
    H.check(a[k] == b[k], "%s x%g %s: %s then %s", a.policy, a.rate_scale, k, tostring(a[k]), tostring(b[k]))
  end
  H.check(H.eq_list(a.ttft_ms, b.ttft_ms), "%s x%g: per-request TTFTs differ", a.policy, a.rate_scale)
  H.check(a.ttft_max >= a.ttft_p99 and a.ttft_p99 >= a.ttft_p50, "%s: max >= p99 >= p50", a.policy)
end
H.check(r1.clock == "model" and r1.step_cost and r1.step_cost.a > 0, "the JSON says which clock and cost")
-- x4 compresses the arrivals: the virtual times see it (more queueing)
H.check(r1.runs[1].makespan_s > r1.runs[3].makespan_s, "scale 4 ends sooner on the model clock")

local _, err = replay({ "--clock", "model:/nonexistent/cost.json" })
H.check(err and err:find("cannot read /nonexistent/cost.json", 1, true), "a missing cost file: %s", tostring(err))
_, err = replay({ "--clock", "sundial" })
H.check(err and err:find("--clock: want wall or model", 1, true), "a bad clock: %s", tostring(err))

H.finish("test_policy_clock")
