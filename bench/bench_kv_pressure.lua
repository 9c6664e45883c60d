-- bench_kv_pressure.lua — scheduling under a KV budget too small for the
-- batch (issue 18, "graceful under KV pressure"), side by side in one run.
--
--   ./build/luainfer run bench/bench_kv_pressure.lua [N] [BUDGETS_MIB] [SWEEP] [LIMIT_S] [--rounds R]
--                       [--trace FILE] [--json FILE] [--plot FILE]
--
-- Workload: N requests (default 64) arriving at once, prompts of 8-40
-- words, outputs evenly over 16..192 tokens (ignore_eos, greedy), shuffled.
-- For each KV budget (default "4,8" MiB) it runs, at max_num_seqs 16:
--   new     the engine's built-in FCFS (core/policy/fcfs.c: projected-block
--           admission, resume only when a request can finish)
--   lua     policies/default.lua (policy.fcfs, the same plans in Lua)
--   old     the FCFS of before (policy.greedy with no projection: admit
--           what fits this step, preempt the latest-arrived when short)
-- and the old FCFS at each fixed max_num_seqs of SWEEP (default "1,2,3,4,6,8"),
-- the tuning a user would otherwise have to do by hand. One unconstrained
-- run (512 MiB, max_num_seqs 16) is the reference: every output must equal
-- its output, token for token, and the ratio tokens computed / tokens
-- computed without pressure is printed for each run.
-- A run that has not finished after LIMIT_S seconds (default 120) stops and
-- counts its unfinished requests.
--
-- --rounds R (default 1) runs every configuration R times, round-robin over
-- all of them, the starting configuration rotated each round (so none always
-- runs first or right after the same one), and reports the median wall s and
-- tok/s of each; the ratios new / best fixed and lua / best fixed are taken
-- of those medians. What does not depend on the machine (tokens computed,
-- preemptions, steps, outputs) must be the same every round: a line says so
-- when it is not. Beside wall time, every run also keeps the engine's model
-- clock (bench/traces/step_cost.json, bench_step_cost.lua --fit: each step
-- charged a + b*prefill + c*decode rows + d*context), which does not depend
-- on the load either: `model s` and its ratios show what the plans alone cost.
-- `batch` is the mean number of sequences per step, `tok/step` the mean
-- tokens computed per step.
--
-- --trace FILE writes one JSON line per step of each configuration's first
-- round (name, step, running, queued, tokens computed, preemptions so far,
-- free blocks, model-clock step cost), for the per-step breakdown.
local luainfer = require("luainfer")
local bench = require("luainfer.bench")
local json = require("luainfer.json")
local bopts = bench.options(arg)
local flags = bench.take_flags(arg, { ["--rounds"] = "count", ["--trace"] = "file" })  -- this bench's own
local ROUNDS = flags["--rounds"] or 1
io.stdout:setvbuf("line")
local root = (arg[0]:match("^(.*)/bench/") or ".")
local N = tonumber(arg[1]) or 64
local function list(s, d, what)
  local t, msg = bench.number_list(s, d, what, function(n) return n > 0 end, "positive numbers")
  if not t then error("bench kv-pressure: " .. msg, 0) end
  return t
end
local BUDGETS = list(arg[2], "4,8", "BUDGETS_MIB")
local SWEEP = list(arg[3], "1,2,3,4,6,8", "SWEEP")
local LIMIT = tonumber(arg[4]) or 120
local SEQS = 16

local words = { "data", "engine", "river", "policy", "cache", "block", "stream", "token", "lua", "kernel",
                "batch", "queue", "model", "vector", "prefix", "server" }
local function make_requests()
  local reqs, seed = {}, 4242
  local function rnd(n) seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n end
  for i = 1, N do
    local t = {}
    for k = 1, 8 + rnd(33) do t[k] = words[rnd(#words) + 1] end
    local q = (i - 1) / math.max(N - 1, 1)
    reqs[i] = { prompt = table.concat(t, " "), max_tokens = 16 + math.floor(q * (192 - 16)),
                temperature = 0, ignore_eos = true }
  end
  for i = N, 2, -1 do local j = rnd(i) + 1; reqs[i], reqs[j] = reqs[j], reqs[i] end
  return reqs
end

local OLD = [[
local policy = require("luainfer.policy")
return { schedule = function(s) return policy.greedy(s, policy.concat(s.running, s.preempted, s.waiting)) end }
]]



-- the model clock's step cost (load-independent seconds beside wall time)
local COST
do
  local path = root .. "/bench/traces/step_cost.json"
  local f, err = io.open(path, "r")
  if not f then error(("cannot read %s: %s"):format(path, err), 0) end
  local c, derr = json.decode(f:read("*a"))
  f:close()
  if type(c) ~= "table" then error(("%s: %s"):format(path, derr or "not a JSON object"), 0) end
  for _, k in ipairs({ "a", "b", "c", "d" }) do
    if type(c[k]) ~= "number" or c[k] < 0 or c[k] ~= c[k] then
      error(("%s: '%s' must be a number >= 0"):format(path, k), 0)
    end
  end
  COST = { a = c.a, b = c.b, c = c.c, d = c.d, policy_scale = 0, start = 0 }
end

local trace_f
if flags["--trace"] then
  local err
  trace_f, err = io.open(flags["--trace"] .. ".tmp", "w")
  if not trace_f then error(("cannot write %s: %s"):format(flags["--trace"], err), 0) end
end

local function run(kv_mib, seqs, how, trace_name)
  local opts = { max_num_seqs = seqs, max_batched_tokens = 512, kv_memory = math.floor(kv_mib * 1024 * 1024) }
  if how == "old" then opts.policy_source = OLD
  elseif how == "lua" then opts.policy = root .. "/policies/default.lua" end
  local e = luainfer.engine(opts)
  e:set_clock(COST)
  local ids, outs = {}, {}
  for i, r in ipairs(make_requests()) do ids[i] = e:add(r) end
  local unfinished, rows, step, t_prev, computed_prev = 0, 0, 0, 0, 0
  while e:has_work() do
    e:step()
    local s = e:stats()
    step, rows = step + 1, rows + s.running
    if trace_f and trace_name then
      local t = e:now()
      trace_f:write(json.encode({ name = trace_name, step = step, running = s.running,
        queued = s.waiting + s.preempted, tokens = s.tokens_computed - computed_prev, preemptions = s.preemptions,
        free_blocks = s.kv_free_blocks, model_s = t - t_prev }), "\n")
      t_prev = t
    end
    computed_prev = s.tokens_computed
    if s.time_total > LIMIT then break end
  end
  local s = e:stats()
  local kept = 0
  for i, id in ipairs(ids) do
    local res = e:result(id)
    outs[i] = res.tokens
    if not res.finished then unfinished = unfinished + 1 end
    kept = kept + #res.tokens
  end
  local model_s = e:now()
  e:close()
  return { outs = outs, secs = s.time_total, model_s = model_s, computed = s.tokens_computed, kept = kept,
           preempt = s.preemptions, steps = s.steps, batch = rows / math.max(step, 1), unfinished = unfinished,
           blocks = s.kv_total_blocks }
end

local function same(a, b)
  local bad = 0
  for i = 1, #a do
    local x, y = a[i], b[i]
    local ok = #x == #y
    for k = 1, #x do if not ok then break end ok = x[k] == y[k] end
    if not ok then bad = bad + 1 end
  end
  return bad
end

local median, loadavg = bench.median, bench.loadavg

-- ---- the configurations, run round-robin --------------------------------------
local configs = { { name = "unconstrained 512MiB", mib = 512, seqs = SEQS, how = "new" } }
for _, mib in ipairs(BUDGETS) do
  for _, how in ipairs({ "new", "lua", "old" }) do
    configs[#configs + 1] = { name = ("%gMiB %s seqs %d"):format(mib, how, SEQS), mib = mib, seqs = SEQS, how = how,
                              budget = mib, role = how == "old" and "old16" or how }
  end
  for _, k in ipairs(SWEEP) do
    configs[#configs + 1] = { name = ("%gMiB old seqs %d"):format(mib, k), mib = mib, seqs = k, how = "old",
                              budget = mib, role = "fixed", k = k }
  end
end
for _, c in ipairs(configs) do c.secs, c.tps, c.model_s = {}, {}, {} end

print(("workload: %d requests, prompts 8-40 words, outputs 16..192 tokens (ignore_eos, greedy), max_batched_tokens 512")
  :format(N))
print(("rounds %d, %d configurations; load average at start %s"):format(ROUNDS, #configs, loadavg()))
local progress = bench.progress(ROUNDS * #configs, "kv_pressure runs")
local mismatches = 0
for round = 1, ROUNDS do
  for j = 0, #configs - 1 do
    local c = configs[(j + round - 1) % #configs + 1]
    local r = run(c.mib, c.seqs, c.how, round == 1 and c.name or nil)
    progress:step()
    c.secs[#c.secs + 1], c.tps[#c.tps + 1], c.model_s[#c.model_s + 1] = r.secs, r.kept / r.secs, r.model_s
    if not c.first then
      c.first = r
    else
      local f = c.first
      local diffs = same(r.outs, f.outs)
      if r.computed ~= f.computed or r.preempt ~= f.preempt or r.steps ~= f.steps or r.unfinished ~= f.unfinished
        or diffs > 0 then
        mismatches = mismatches + 1
        print(("%s: round %d differs from round 1: computed %d vs %d, preemptions %d vs %d, steps %d vs %d, "
          .. "unfinished %d vs %d, %d outputs differ"):format(c.name, round, r.computed, f.computed, r.preempt,
          f.preempt, r.steps, f.steps, r.unfinished, f.unfinished, diffs))
      end
    end
  end
end
progress:done()
if trace_f then
  trace_f:close()
  local ok, err = os.rename(flags["--trace"] .. ".tmp", flags["--trace"])
  if not ok then error(("cannot write %s: %s"):format(flags["--trace"], err), 0) end
end

local ref = configs[1].first
print(("%-22s %6s %8s %6s %5s %7s %6s %7s %7s %8s %7s %7s %6s %5s"):format("run", "blocks", "computed", "kept",
  "x ref", "preempt", "steps", "batch", "tok/stp", "model s", "wall s", "tok/s", "unfin", "diffs"))
local rows = {}
for _, c in ipairs(configs) do
  local r = c.first
  c.med_secs, c.med_model = median(c.secs), median(c.model_s)
  c.med_tps = r.kept / c.med_secs
  local diffs = same(r.outs, ref.outs)
  print(("%-22s %6d %8d %6d %5.2f %7d %6d %7.2f %7.2f %8.2f %7.2f %7.1f %6d %5d"):format(c.name, r.blocks, r.computed,
    r.kept, r.computed / ref.computed, r.preempt, r.steps, r.batch, r.computed / r.steps, c.med_model, c.med_secs,
    c.med_tps, r.unfinished, diffs))
  rows[#rows + 1] = { name = c.name, blocks = r.blocks, computed = r.computed, kept = r.kept,
                      x_ref = r.computed / ref.computed, preemptions = r.preempt, steps = r.steps,
                      mean_batch = r.batch, model_s = c.med_model, wall_s = c.med_secs, tokens_per_s = c.med_tps,
                      rounds_wall_s = c.secs, unfinished = r.unfinished, outputs_differing = diffs }
end
local summary = {}
for _, mib in ipairs(BUDGETS) do
  local best, best_m, by = nil, nil, {}
  for _, c in ipairs(configs) do
    if c.budget == mib then
      by[c.role] = c
      if c.role == "fixed" and c.first.unfinished == 0 then
        if not best or c.med_tps > best.med_tps then best = c end
        if not best_m or c.med_model < best_m.med_model then best_m = c end
      end
    end
  end
  if best then
    local s = { budget_mib = mib, best_fixed_seqs = best.k, new_over_best = by.new.med_tps / best.med_tps,
                lua_over_best = by.lua.med_tps / best.med_tps, best_fixed_seqs_model = best_m.k,
                new_over_best_model = best_m.med_model / by.new.med_model,
                lua_over_best_model = best_m.med_model / by.lua.med_model,
                x_ref = by.new.first.computed / ref.computed }
    summary[#summary + 1] = s
    print(("%gMiB: new / best fixed (old, seqs %d) throughput %.2fx, lua %.2fx (medians of %d); model clock: "
      .. "best fixed seqs %d, new %.2fx, lua %.2fx; tokens computed %.2fx of unconstrained")
      :format(mib, best.k, s.new_over_best, s.lua_over_best, ROUNDS, best_m.k, s.new_over_best_model,
              s.lua_over_best_model, s.x_ref))
  end
end
if mismatches > 0 then print(("%d runs differed from their first round in counts or outputs"):format(mismatches)) end
print(("load average at end %s"):format(loadavg()))
bench.finish(bopts, { bench = "kv_pressure", requests = N, max_num_seqs = SEQS, rounds = ROUNDS, rows = rows,
                      summary = summary, mismatches = mismatches,
                      chart = { label = "name", values = { "x_ref" },
                                ylabel = "tokens computed / tokens computed unconstrained",
                                title = ("%d requests under KV budgets (outputs 16..192 tokens)"):format(N) } })
