-- bench_kv_dtype.lua — KV cache dtypes f16 vs fp8 vs int8 at the same KV
-- byte budget, side by side in one run.
--
--   ./build/luainfer run bench/bench_kv_dtype.lua [N_REQUESTS] [OUTPUT_TOKENS] [BUDGET_MIB] [REPEATS]
--                                                 [--json FILE] [--plot FILE]
--
-- 1. capacity: bytes per token (scales included) and the tokens that fit in
--    the budget (kv_total_blocks x block_size), for f32, f16, bf16, fp8, int8;
-- 2. a decode-heavy workload where capacity matters: N requests (default 32)
--    arriving at once, prompts of 16..48 tokens, OUTPUT_TOKENS (default 96)
--    greedy tokens each (ignore_eos), max_num_seqs = N, and a budget
--    (default 48 MiB) in which fp8/int8 hold the whole workload while f16
--    holds about half of it and has to preempt (and later recompute);
-- 3. the same workload with an ample budget (512 MiB, nothing preempted):
--    the cost of the 8-bit kernels themselves (quantizing store, decoding
--    attention) against f16.
-- Throughput = generated tokens / seconds inside li_engine_step; each
-- configuration runs REPEATS times (default 3), interleaved with the others
-- (f16, fp8, int8, f16, ...), and the fastest run counts, so a burst of
-- other load on the machine does not land on one dtype only.
local luainfer = require("luainfer")
local bench = require("luainfer.bench")
local opts = bench.options(arg)
local results = { bench = "kv_dtype", capacity = {}, rows = {} }
local N = tonumber(arg[1]) or 32
local OUT = tonumber(arg[2]) or 96
local BUDGET = math.floor((tonumber(arg[3]) or 48) * 1024 * 1024)
local REPEATS = tonumber(arg[4]) or 3
local AMPLE = 512 * 1024 * 1024

local words = { "the", "market", "of", "river", "town", "grew", "slowly", "while", "merchants", "traded",
  "grain", "and", "salt", "under", "bright", "lanterns", "every", "evening", "a", "council", "met", "to",
  "settle", "disputes", "about", "water", "rights", "bridges", "taxes", "weather", "harvest", "roads" }
local function requests()
  local seed, reqs = 4242, {}
  local function rnd(n) seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n end
  for i = 1, N do
    local t = {}
    for k = 1, 14 + rnd(30) do t[k] = words[rnd(#words) + 1] end
    reqs[i] = { prompt = table.concat(t, " "), max_tokens = OUT, temperature = 0, ignore_eos = true }
  end
  return reqs
end

local function run(dtype, budget)
  local e = luainfer.engine{ kv_dtype = dtype, kv_memory = budget, max_num_seqs = N, max_batched_tokens = 512 }
  local ids, prompt_tokens = {}, 0
  for i, r in ipairs(requests()) do ids[i] = e:add(r) end
  local max_running, sum_running = 0, 0
  while e:has_work() do
    e:step()
    local s = e:stats()
    max_running = math.max(max_running, s.running)
    sum_running = sum_running + s.running
  end
  local s = e:stats()
  local gen = 0
  for _, id in ipairs(ids) do
    local r = e:result(id)
    gen = gen + #r.tokens
    prompt_tokens = prompt_tokens + r.prompt_tokens
  end
  e:close()
  return { gen = gen, secs = s.time_total, tput = gen / s.time_total, steps = s.steps, preempt = s.preemptions,
           computed = s.tokens_computed, max_running = max_running,
           mean_running = sum_running / s.steps, tokens = s.kv_total_blocks * s.block_size,
           bpt = s.kv_bytes_per_token, blocks = s.kv_total_blocks, outputs = ids }
end

-- 1. capacity (engines only sized, nothing run)
print(("capacity in a %.0f MiB KV budget (block size 16):"):format(BUDGET / 1048576))
local f16_tokens
for _, dt in ipairs({ "f32", "f16", "bf16", "fp8", "int8" }) do
  local e = luainfer.engine{ kv_dtype = dt, kv_memory = BUDGET, max_num_seqs = 1 }
  local s = e:stats()
  e:close()
  local tokens = s.kv_total_blocks * s.block_size
  if dt == "f16" then f16_tokens = tokens end
  results.capacity[#results.capacity + 1] = { dtype = dt, bytes_per_token = s.kv_bytes_per_token, tokens = tokens }
  print(("  %-5s %6d bytes/token  %6d tokens  %s"):format(dt, s.kv_bytes_per_token, tokens,
    f16_tokens and ("(%.2fx f16)"):format(tokens / f16_tokens) or ""))
end

local function section(title, budget, workload)
  print(("\n%s: %d requests x %d output tokens, prompts 16..48 tokens, budget %.0f MiB, best of %d"):format(
    title, N, OUT, budget / 1048576, REPEATS))
  print(("  %-5s %7s %9s %8s %6s %8s %9s %16s %7s"):format("dtype", "tokens", "gen tok/s", "seconds", "steps",
    "preempt", "computed", "running max/mean", "vs f16"))
  local dts, best = { "f16", "fp8", "int8" }, {}
  local progress = bench.progress(REPEATS * #dts, title)
  for _ = 1, REPEATS do
    for _, dt in ipairs(dts) do
      local r = run(dt, budget)
      progress:step()
      if not best[dt] or r.secs < best[dt].secs then best[dt] = r end
    end
  end
  progress:done()
  for _, dt in ipairs(dts) do
    local r = best[dt]
    print(("  %-5s %7d %9.1f %8.2f %6d %8d %9d %9d/%6.1f %6.2fx"):format(dt, r.tokens, r.tput, r.secs, r.steps,
      r.preempt, r.computed, r.max_running, r.mean_running, r.tput / best.f16.tput))
    results.rows[#results.rows + 1] = { workload = workload, budget_mib = budget / 1048576, dtype = dt,
      tput = r.tput, seconds = r.secs, steps = r.steps, preemptions = r.preempt, computed = r.computed }
  end
end

section("decode-heavy, tight budget", BUDGET, "tight")
section("same workload, ample budget", AMPLE, "ample")
results.budget_mib, results.n_requests, results.output_tokens = BUDGET / 1048576, N, OUT
bench.finish(opts, results)
