-- bench_step_cost.lua — what one decode step costs as the batch grows: the
-- fact that bounds how much continuous batching can gain over static
-- batching on a machine. A step costs about f + c*n for n running
-- sequences: f is paid once per step whatever the batch (streaming the
-- weights, launching the ops), c per sequence (its share of the GEMM
-- arithmetic, attention over its context, sampling). Continuous batching
-- saves steps, so it saves only f: against static batching whose finished
-- members leave, its gain is at most (T*c + S_static*f) / (T*c + S_cont*f)
-- for T tokens computed in S steps, which nears S_static / S_cont only
-- where f dwarfs c*n (a memory-bound GPU).
--
--   ./build/luainfer run bench/bench_step_cost.lua [DECODE_STEPS] [ROUNDS] [--json FILE] [--plot FILE]
--
-- For each batch size n it prefills n short prompts, then times
-- DECODE_STEPS (default 48) decode steps of forward time, ROUNDS times
-- (default 3); prints ms per step, per token and per added sequence.
local luainfer = require("luainfer")
local bench = require("luainfer.bench")
local opts = bench.options(arg)
local root = opts.root
local STEPS = tonumber(arg[1]) or 48

local ROUNDS = tonumber(arg[2]) or 3
local sizes = { 1, 2, 4, 8, 16, 32, 64 }

local function step_ms(n)
  local e = luainfer.engine{ policy = root .. "/policies/default.lua", max_num_seqs = n,
                             max_batched_tokens = 4096, kv_memory = 256 * 1024 * 1024 }
  for i = 1, n do
    e:add{ prompt = ("Request %d: data engine river policy cache block stream"):format(i),
           max_tokens = STEPS + 1, temperature = 0, ignore_eos = true }
  end
  e:step() -- every prompt prefilled in one step
  assert(e:stats().running == n, "prefill did not fit one step")
  local s0 = e:stats()
  e:run()
  local s1 = e:stats()
  e:close()
  local steps = s1.steps - s0.steps
  assert(steps == STEPS, ("expected %d decode steps, ran %d"):format(STEPS, steps))
  return 1000 * (s1.time_forward - s0.time_forward) / steps
end

-- rounds interleave the sizes, so a slow spell of a shared machine does not
-- fall on one size; the fastest round of each size is kept
local best = {}
local progress = bench.progress(ROUNDS * #sizes, "step_cost runs")
for _ = 1, ROUNDS do
  for _, n in ipairs(sizes) do
    best[n] = math.min(best[n] or math.huge, step_ms(n))
    progress:step()
  end
end
progress:done()
print(("decode step cost vs running sequences (%d decode steps, best of %d rounds, policies/default.lua)")
  :format(STEPS, ROUNDS))
print("      n   ms/step  ms/token  marginal ms per added sequence")
for i, n in ipairs(sizes) do
  local m = i > 1 and ("%.3f (from n = %d)"):format((best[n] - best[sizes[i - 1]]) / (n - sizes[i - 1]), sizes[i - 1]) or ""
  print(("  %5d %9.2f %9.3f  %s"):format(n, best[n], best[n] / n, m))
end
-- f: what a step costs beyond its sequences' marginal cost, read at n = 1
-- with the marginal cost of the small batches
local c1 = (best[2] - best[1])
print(("per-step part f ~ %.2f ms (step at n = 1 less one sequence's marginal cost); at n = 32 it is %.0f%% of a step")
  :format(best[1] - c1, 100 * (best[1] - c1) / best[32]))
local rows = {}
for _, n in ipairs(sizes) do rows[#rows + 1] = { n = n, ms_per_step = best[n] } end
bench.finish(opts, { bench = "step_cost", decode_steps = STEPS, rounds = ROUNDS, rows = rows,
                     per_step_ms = best[1] - c1 })
