-- bench_policy_modes.lua — what the policy mode costs: policies/default.lua
-- with 16, 64 and 256 live decoding requests, in-process and isolated
-- (policy-host child), alternating the modes round by round. Prints the
-- time in schedule() per step and the decode throughput of those steps
-- (generated tokens / wall time of li_engine_step, policy included), and
-- the isolated/in-process ratios.
--
--   ./build/luainfer run bench/bench_policy_modes.lua [STEPS] [ROUNDS] [SIZES]
--   e.g. ./build/luainfer run bench/bench_policy_modes.lua 20 2 16,64,256 [--json FILE] [--plot FILE]
--
-- Run it with an older binary too for the in-process JIT-compiled policy
-- code of before issue 18 (the guarded sandbox runs policy code interpreted).
local luainfer = require("luainfer")
local bench = require("luainfer.bench")
local opts = bench.options(arg)
local root = (arg[0]:match("^(.*)/bench/") or ".")
local STEPS = tonumber(arg[1]) or 20
local ROUNDS = tonumber(arg[2]) or 2
local SIZES = {}
for n in (arg[3] or "16,64,256"):gmatch("%d+") do SIZES[#SIZES + 1] = tonumber(n) end

local function run(isolation, n)
  local e = luainfer.engine{ policy = root .. "/policies/default.lua", policy_isolation = isolation,
                             max_num_seqs = n, max_batched_tokens = math.max(512, n),
                             kv_memory = 512 * 1024 * 1024 }
  for i = 1, n do
    e:add{ prompt = "Request " .. i .. " asks about the weather in a small town by the sea.",
           max_tokens = STEPS + 40, temperature = 0, ignore_eos = true }
  end
  while e:stats().running < n or e:stats().waiting > 0 do e:step() end
  e:step()
  local s0 = e:stats()
  for _ = 1, STEPS do e:step() end
  local s1 = e:stats()
  e:close()
  local steps = s1.steps - s0.steps
  return { policy_us = 1e6 * (s1.time_policy - s0.time_policy) / steps,
           tok_s = (s1.tokens_generated - s0.tokens_generated) / (s1.time_total - s0.time_total),
           errors = s1.policy_errors + s1.fallback_steps }
end

local sum = {}
for _, n in ipairs(SIZES) do sum[n] = { inprocess = { us = 0, tok = 0, err = 0 }, process = { us = 0, tok = 0, err = 0 } } end
local progress = bench.progress(ROUNDS * #SIZES * 2, "policy mode runs")
for r = 1, ROUNDS do
  for _, n in ipairs(SIZES) do
    local order = (r % 2 == 1) and { "inprocess", "process" } or { "process", "inprocess" }
    for _, mode in ipairs(order) do
      local x = run(mode, n)
      progress:step()
      local s = sum[n][mode]
      s.us, s.tok, s.err = s.us + x.policy_us / ROUNDS, s.tok + x.tok_s / ROUNDS, s.err + x.errors
    end
  end
end
progress:done()
print(("policies/default.lua, %d decode steps per run, %d rounds (modes alternating), means"):format(STEPS, ROUNDS))
print("  live | in-process us/step  tok/s | isolated us/step  tok/s | tok/s isolated/in-process")
for _, n in ipairs(SIZES) do
  local a, b = sum[n].inprocess, sum[n].process
  print(("  %4d | %18.1f %6.1f | %16.1f %6.1f | %.3f   (errors+fallbacks %d / %d)"):format(
    n, a.us, a.tok, b.us, b.tok, b.tok / a.tok, a.err, b.err))
end
local rows = {}
for _, n in ipairs(SIZES) do
  local a, b = sum[n].inprocess, sum[n].process
  rows[#rows + 1] = { name = ("%d live"):format(n), live = n, inprocess_us = a.us, isolated_us = b.us,
                      inprocess_tok_s = a.tok, isolated_tok_s = b.tok, ratio = b.tok / a.tok,
                      inprocess_errors = a.err, isolated_errors = b.err }
end
bench.finish(opts, { bench = "policy_modes", steps = STEPS, rounds = ROUNDS, rows = rows,
                     chart = { label = "name", values = { "inprocess_us", "isolated_us" }, log = true,
                               ylabel = "schedule() us per step", title = "policies/default.lua: in-process vs isolated" } })
