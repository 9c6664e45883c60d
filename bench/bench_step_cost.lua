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
--
--   ./build/luainfer run bench/bench_step_cost.lua --fit [ROUNDS [--cpu]] --json bench/traces/step_cost.json
--
-- fits the replay's model clock (bench_replay.lua --clock model): the cost
-- of a whole step (less the policy's time) as
--   a + b * prefill_tokens + c * decode_rows + d * context
-- (context: the positions every computed token attends to), by least
-- squares weighted by 1/time (relative error) over designed steps: decode
-- batches of 1..16 rows at short and long context, single prefills of
-- 32..256 tokens and mixed steps; each the fastest of ROUNDS (default 3).
local luainfer = require("luainfer")
local bench = require("luainfer.bench")
local opts = bench.options(arg)
local root = opts.root

-- ---- --fit: the model clock's step cost ------------------------------------------
-- The process's CPU time (CLOCK_PROCESS_CPUTIME_ID), bench.lua's declaration
local ffi = require("ffi")
local cpu_ts = ffi.new("li_bench_timespec")
local function cpu_now()
  ffi.C.clock_gettime(2, cpu_ts)
  return tonumber(cpu_ts.tv_sec) + tonumber(cpu_ts.tv_nsec) * 1e-9
end

local function synthetic(i, n)
  local t = {}
  for k = 1, n do t[k] = 1000 + (i * 7919 + k * 104729) % 30000 end
  return t
end

-- Runs one designed step on engine e: `decodes` requests of context `ctx`
-- decoding (prefilled beforehand), plus one prefill of `prefill` tokens;
-- returns its features and seconds. Every prompt is new (seed), so the
-- prefix cache never shortens one.
local seed = 0
local function designed_step(e, decodes, ctx, prefill)
  local ids = {}
  for i = 1, decodes do
    seed = seed + 1
    ids[i] = e:add{ tokens = synthetic(seed, ctx), max_tokens = 8, temperature = 0, ignore_eos = true }
  end
  local function ready()
    for _, id in ipairs(ids) do if #e:result(id).tokens == 0 then return false end end
    return true
  end
  while not ready() do e:step() end
  seed = seed + 1
  if prefill > 0 then
    ids[#ids + 1] = e:add{ tokens = synthetic(seed, prefill), max_tokens = 1, temperature = 0, ignore_eos = true }
  end
  local s0, c0 = e:stats(), cpu_now()
  e:step()
  local c1, s1 = cpu_now(), e:stats()
  for _, id in ipairs(ids) do e:cancel(id); e:release(id) end
  -- features as the engine's clock counts them (engine.c, model_clock_step)
  local x = { 1, prefill, decodes, decodes * (ctx + 1) + prefill * (prefill + 1) / 2 }
  local wall = (s1.time_total - s0.time_total) - (s1.time_policy - s0.time_policy)
  return x, wall, c1 - c0
end

-- weighted least squares with non-negative coefficients (drop a negative one, refit)
local function fit(xs, ys)
  local k, active = #xs[1], {}
  for j = 1, k do active[j] = true end
  while true do
    local idx = {}
    for j = 1, k do if active[j] then idx[#idx + 1] = j end end
    local m = #idx
    local A, B = {}, {}
    for p = 1, m do A[p] = {}; for q = 1, m do A[p][q] = 0 end; B[p] = 0 end
    for i, x in ipairs(xs) do
      local w = 1 / (ys[i] * ys[i])
      for p = 1, m do
        B[p] = B[p] + w * x[idx[p]] * ys[i]
        for q = 1, m do A[p][q] = A[p][q] + w * x[idx[p]] * x[idx[q]] end
      end
    end
    for p = 1, m do -- Gaussian elimination with partial pivoting
      local best = p
      for r = p + 1, m do if math.abs(A[r][p]) > math.abs(A[best][p]) then best = r end end
      A[p], A[best], B[p], B[best] = A[best], A[p], B[best], B[p]
      for r = p + 1, m do
        local f = A[r][p] / A[p][p]
        for q = p, m do A[r][q] = A[r][q] - f * A[p][q] end
        B[r] = B[r] - f * B[p]
      end
    end
    local sol = {}
    for p = m, 1, -1 do
      local v = B[p]
      for q = p + 1, m do v = v - A[p][q] * sol[q] end
      sol[p] = v / A[p][p]
    end
    local coef, neg = {}, nil
    for j = 1, k do coef[j] = 0 end
    for p = 1, m do coef[idx[p]] = sol[p]; if sol[p] < 0 and (not neg or sol[p] < coef[neg]) then neg = idx[p] end end
    if not neg then return coef end
    active[neg] = false
  end
end

if arg[1] == "--fit" then
  local rounds = tonumber(arg[2]) or 3
  -- --cpu: fit the step's CPU time over the engine's threads instead of its
  -- wall time: what the step costs on idle cores if its threads keep busy;
  -- on a shared, loaded machine wall time counts the others' work too
  local use_cpu = arg[3] == "--cpu"
  local design = {}
  for _, n in ipairs({ 1, 4, 16 }) do
    design[#design + 1] = { n, 16, 0 }
    design[#design + 1] = { n, 160, 0 }
  end
  for _, p in ipairs({ 32, 128, 256 }) do design[#design + 1] = { 0, 0, p } end
  for _, m in ipairs({ { 4, 64, 128 }, { 8, 16, 64 } }) do design[#design + 1] = m end
  local e = luainfer.engine{ policy = root .. "/policies/default.lua", max_num_seqs = 64,
                             max_batched_tokens = 1024, kv_memory = 256 * 1024 * 1024 }
  local threads = e:info().threads
  local best, xs, walls = {}, {}, {}
  local progress = bench.progress(rounds * #design, "designed steps")
  for _ = 1, rounds do
    for i, d in ipairs(design) do
      local x, wall, cpu = designed_step(e, d[1], d[2], d[3])
      local t = use_cpu and cpu / threads or wall
      xs[i], best[i], walls[i] = x, math.min(best[i] or math.huge, t), math.min(walls[i] or math.huge, wall)
      progress:step()
    end
  end
  progress:done()
  e:close()
  local c = fit(xs, best)
  print(("step cost (s) = %.3e + %.3e * prefill_tokens + %.3e * decode_rows + %.3e * context"):format(c[1], c[2], c[3], c[4]))
  print(("fitted to %s, %d threads"):format(use_cpu and "CPU time / threads" or "wall time", threads))
  print("   decodes  ctx  prefill   measured ms   model ms   error   wall ms")
  local rows, worst = {}, 0
  for i, d in ipairs(design) do
    local m = c[1] + c[2] * xs[i][2] + c[3] * xs[i][3] + c[4] * xs[i][4]
    worst = math.max(worst, math.abs(m / best[i] - 1))
    print(("  %7d %5d %7d  %11.2f  %9.2f  %+5.0f%%  %8.2f"):format(d[1], d[2], d[3], 1e3 * best[i], 1e3 * m,
      100 * (m / best[i] - 1), 1e3 * walls[i]))
    rows[#rows + 1] = { decodes = d[1], context = d[2], prefill = d[3], measured_s = best[i], model_s = m,
                        wall_s = walls[i] }
  end
  print(("worst relative error %.0f%%"):format(100 * worst))
  local f = io.popen("uptime; uname -m; grep -m1 'model name' /proc/cpuinfo; nproc")
  local machine = f and f:read("*a"):gsub("%s+$", ""):gsub("\n", "; ") or "?"
  if f then f:close() end
  bench.finish(opts, { bench = "step_cost_fit", a = c[1], b = c[2], c = c[3], d = c[4], rounds = rounds,
                       worst_error = worst, machine = machine,
                       fitted_to = use_cpu and "cpu_time_per_thread" or "wall_time", threads = threads, rows = rows,
                       model = "step s = a + b*prefill_tokens + c*decode_rows + d*context (sum of pos+1)" })
  return
end
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
