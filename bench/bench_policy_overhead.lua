-- bench_policy_overhead.lua — what a Lua policy costs per engine step with
-- 64 running requests: time in schedule() as a share of step time,
-- in-process and isolated (policy-host child over a Unix socket), side by
-- side, both with policies/default.lua.
--
--   ./build/luainfer run bench/bench_policy_overhead.lua [STEPS] [--json FILE]
local luainfer = require("luainfer")
local bench = require("luainfer.bench")
local opts = bench.options(arg)
local root = (arg[0]:match("^(.*)/bench/") or ".")
local STEPS = tonumber(arg[1]) or 100

local progress = bench.progress(2 * STEPS, "policy_overhead steps")

local function run(isolation)
  local e = luainfer.engine{ policy = root .. "/policies/default.lua", policy_isolation = isolation,
                             max_num_seqs = 64, max_batched_tokens = 512, kv_memory = 512 * 1024 * 1024 }
  for i = 1, 64 do
    e:add{ prompt = "Request " .. i .. " asks about the weather in a small town by the sea.",
           max_tokens = STEPS + 20, temperature = 0, ignore_eos = true }
  end
  -- reach steady state: every request prefilled and decoding
  while e:stats().running < 64 or e:stats().waiting > 0 do e:step() end
  e:step()
  local s0 = e:stats()
  for _ = 1, STEPS do
    e:step()
    progress:step()
  end
  local s1 = e:stats()
  e:close()
  local steps = s1.steps - s0.steps
  local total, pol = s1.time_total - s0.time_total, s1.time_policy - s0.time_policy
  return { step_ms = 1000 * total / steps, policy_us = 1e6 * pol / steps, share = pol / total,
           errors = s1.policy_errors, fallback = s1.fallback_steps }
end

local a = run("inprocess")
local b = run("process")
progress:done()
print(("64 running requests, %d decode steps each run, policies/default.lua"):format(STEPS))
print(("in-process: step %.1f ms, schedule() %.1f us/step = %.3f%% of step time (errors %d)"):format(
  a.step_ms, a.policy_us, 100 * a.share, a.errors))
print(("isolated:   step %.1f ms, schedule() %.1f us/step = %.3f%% of step time (errors %d, fallback steps %d)"):format(
  b.step_ms, b.policy_us, 100 * b.share, b.errors, b.fallback))
bench.finish(opts, { bench = "policy_overhead", steps = STEPS, running = 64, rows = {
  { isolation = "inprocess", step_ms = a.step_ms, policy_us = a.policy_us, share = a.share, errors = a.errors,
    fallback_steps = a.fallback },
  { isolation = "process", step_ms = b.step_ms, policy_us = b.policy_us, share = b.share, errors = b.errors,
    fallback_steps = b.fallback },
}, chart = { label = "isolation", values = { "policy_us" }, ylabel = "schedule() us per step",
             title = ("policies/default.lua, 64 running requests, %d steps"):format(STEPS) } })
