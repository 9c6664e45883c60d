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
--
--   ./build/luainfer run bench/bench_step_cost.lua --fit-log FILE [--field iter_s|step_s] [--match-total] [--json OUT]
--
-- fits the same model, with the same fitter, to the steps a live server
-- logged (`luainfer serve --step-log FILE`, one JSON line per step): by
-- default to iter_s, the whole engine-thread iteration (the step, the
-- policy's round trip, posting the events, what the loop thread takes
-- from the core meanwhile), so the model clock of `bench replay --clock
-- model:OUT` runs at the live server's pace, not a bare engine's.
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

-- weighted least squares with non-negative coefficients (drop a negative one, refit);
-- `off`: coefficients held at 0 from the start (a feature no step has)
local function fit(xs, ys, off)
  local k, active = #xs[1], {}
  for j = 1, k do active[j] = not (off and off[j]) end
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

local function machine_line()
  local f = io.popen("uptime; uname -m; grep -m1 'model name' /proc/cpuinfo; nproc")
  local machine = f and f:read("*a"):gsub("%s+$", ""):gsub("\n", "; ") or "?"
  if f then f:close() end
  return machine
end

-- ---- --fit-log: the same model fitted to a server's own step log ------------------
if arg[1] == "--fit-log" then
  local json = require("luainfer.json")
  local flags = bench.take_flags(arg, { ["--field"] = "value", ["--match-total"] = "flag" })
  local path = arg[2]
  if not path or path:sub(1, 2) == "--" then error("--fit-log needs a FILE (written by luainfer serve --step-log)", 0) end
  local field = flags["--field"] or "iter_s"
  if field ~= "iter_s" and field ~= "step_s" then error(("--field: want iter_s or step_s, got %s"):format(field), 0) end
  if arg[3] then error(("--fit-log: unknown argument %s"):format(arg[3]), 0) end
  local f, ferr = io.open(path, "r")
  if not f then error(("--fit-log: cannot read %s"):format(ferr), 0) end
  local xs, ys, n_line = {}, {}, 0
  for line in f:lines() do
    n_line = n_line + 1
    if line:match("%S") then
      local ok, r, derr = pcall(json.decode, line)
      if not ok or type(r) ~= "table" then
        f:close()
        error(("%s:%d: not a JSON object (%s)"):format(path, n_line, tostring(ok and (derr or r) or r)), 0)
      end
      for _, k in ipairs({ "prefill_tokens", "decode_rows", "context", field }) do
        local v = r[k]
        if type(v) ~= "number" or v ~= v or v < 0 or v == math.huge then
          f:close()
          error(("%s:%d: '%s' must be a number >= 0, got %s"):format(path, n_line, k, tostring(v)), 0)
        end
      end
      -- a zero time cannot carry a relative error (a clock's tick); such a line is skipped
      if r[field] > 0 and r.prefill_tokens + r.decode_rows > 0 then
        xs[#xs + 1] = { 1, r.prefill_tokens, r.decode_rows, r.context }
        ys[#ys + 1] = r[field]
      end
    end
  end
  f:close()
  if #xs < 4 then error(("%s: %d usable steps, the fit needs at least 4"):format(path, #xs), 0) end
  local off, used = {}, {}
  for j = 2, 4 do
    off[j] = true
    for _, x in ipairs(xs) do if x[j] ~= 0 then off[j] = false; break end end
  end
  local c = fit(xs, ys, off)
  for j = 1, 4 do
    if c[j] ~= c[j] or c[j] == math.huge then
      error(("%s: the steps do not determine the fit (too few distinct steps)"):format(path), 0)
    end
    used[j] = not off[j]
  end
  -- Relative-error weights (1/y^2) lean on the fast steps: with a loaded
  -- machine's noise (a step now and then twice as long) the fitted clock
  -- runs short of the logged time in total, so a replay on it is faster
  -- than the server was. --match-total scales the four coefficients so the
  -- clock sums to the logged time over the log (the throughput a replay
  -- on it then assumes), keeping their proportions.
  local sum_m, sum_y = 0, 0
  for i, x in ipairs(xs) do
    sum_m, sum_y = sum_m + c[1] + c[2] * x[2] + c[3] * x[3] + c[4] * x[4], sum_y + ys[i]
  end
  local total_ratio = sum_m / sum_y
  if flags["--match-total"] then
    for j = 1, 4 do c[j] = c[j] / total_ratio end
  end
  local errs = {}
  for i, x in ipairs(xs) do
    local m = c[1] + c[2] * x[2] + c[3] * x[3] + c[4] * x[4]
    errs[i] = math.abs(m / ys[i] - 1)
  end
  table.sort(errs)
  local median, worst = errs[math.floor((#errs + 1) / 2)], errs[#errs]
  local p90 = errs[math.max(1, math.ceil(0.9 * #errs))]
  print(("step cost (s) = %.3e + %.3e * prefill_tokens + %.3e * decode_rows + %.3e * context"):format(c[1], c[2], c[3], c[4]))
  print(("fitted to %s of %d logged steps (%s)"):format(field, #xs, path))
  for j, name in ipairs({ "", "prefill_tokens", "decode_rows", "context" }) do
    if j > 1 and not used[j] then print(("no step has %s: its coefficient stays 0"):format(name)) end
  end
  print(("relative error: median %.1f%%, p90 %.1f%%, worst %.1f%%"):format(100 * median, 100 * p90, 100 * worst))
  print(("the fit sums to %.3fx the logged %s (%.2f s)%s"):format(total_ratio, field, sum_y,
    flags["--match-total"] and ": coefficients scaled by " .. ("%.3f"):format(1 / total_ratio) or ""))
  bench.finish(opts, { bench = "step_cost_fit", a = c[1], b = c[2], c = c[3], d = c[4], steps = #xs,
                       worst_error = worst, median_error = median, p90_error = p90, machine = machine_line(),
                       total_ratio = total_ratio, match_total = flags["--match-total"] or false, logged_s = sum_y,
                       fitted_to = "server_" .. field, log = path,
                       model = "step s = a + b*prefill_tokens + c*decode_rows + d*context (sum of pos+1)" })
  return
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
  local machine = machine_line()
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
