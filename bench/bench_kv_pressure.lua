-- bench_kv_pressure.lua — scheduling under a KV budget too small for the
-- batch (issue 18, "graceful under KV pressure"), side by side in one run.
--
--   ./build/luainfer run bench/bench_kv_pressure.lua [N] [BUDGETS_MIB] [SWEEP] [LIMIT_S] [--json FILE] [--plot FILE]
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
local luainfer = require("luainfer")
local bench = require("luainfer.bench")
local bopts = bench.options(arg)
io.stdout:setvbuf("line")
local root = (arg[0]:match("^(.*)/bench/") or ".")
local N = tonumber(arg[1]) or 64
local function list(s, d)
  local t = {}
  for x in (s or d):gmatch("[^,]+") do t[#t + 1] = tonumber(x) end
  return t
end
local BUDGETS = list(arg[2], "4,8")
local SWEEP = list(arg[3], "1,2,3,4,6,8")
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


local function run(kv_mib, seqs, how)
  local opts = { max_num_seqs = seqs, max_batched_tokens = 512, kv_memory = math.floor(kv_mib * 1024 * 1024) }
  if how == "old" then opts.policy_source = OLD
  elseif how == "lua" then opts.policy = root .. "/policies/default.lua" end
  local e = luainfer.engine(opts)
  local ids, outs = {}, {}
  for i, r in ipairs(make_requests()) do ids[i] = e:add(r) end
  local unfinished = 0
  while e:has_work() do
    e:step()
    if e:stats().time_total > LIMIT then break end
  end
  local s = e:stats()
  local kept = 0
  for i, id in ipairs(ids) do
    local res = e:result(id)
    outs[i] = res.tokens
    if not res.finished then unfinished = unfinished + 1 end
    kept = kept + #res.tokens
  end
  e:close()
  return { outs = outs, secs = s.time_total, computed = s.tokens_computed, kept = kept,
           preempt = s.preemptions, steps = s.steps, unfinished = unfinished, blocks = s.kv_total_blocks }
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

print(("workload: %d requests, prompts 8-40 words, outputs 16..192 tokens (ignore_eos, greedy), max_batched_tokens 512")
  :format(N))
local progress = bench.progress(1 + #BUDGETS * (3 + #SWEEP), "kv_pressure runs")
local rows = {}
local ref = run(512, SEQS, "new")
print(("%-22s %7s %9s %7s %5s %8s %8s %7s %9s %6s"):format("run", "blocks", "computed", "kept", "x ref",
  "preempt", "wall s", "tok/s", "unfinish", "diffs"))
local function line(name, r)
  progress:step()
  local diffs = same(r.outs, ref.outs)
  print(("%-22s %7d %9d %7d %5.2f %8d %8.1f %7.1f %9d %6d"):format(name, r.blocks, r.computed, r.kept,
    r.computed / ref.computed, r.preempt, r.secs, r.kept / r.secs, r.unfinished, diffs))
  rows[#rows + 1] = { name = name, blocks = r.blocks, computed = r.computed, kept = r.kept,
                      x_ref = r.computed / ref.computed, preemptions = r.preempt, wall_s = r.secs,
                      tokens_per_s = r.kept / r.secs, unfinished = r.unfinished, outputs_differing = diffs }
end
line("unconstrained 512MiB", ref)
for _, mib in ipairs(BUDGETS) do
  local new = run(mib, SEQS, "new")
  line(("%gMiB new seqs %d"):format(mib, SEQS), new)
  line(("%gMiB lua seqs %d"):format(mib, SEQS), run(mib, SEQS, "lua"))
  line(("%gMiB old seqs %d"):format(mib, SEQS), run(mib, SEQS, "old"))
  local best
  for _, k in ipairs(SWEEP) do
    local r = run(mib, k, "old")
    line(("%gMiB old seqs %d"):format(mib, k), r)
    if r.unfinished == 0 and (not best or r.kept / r.secs > best.kept / best.secs) then best = r; best.k = k end
  end
  if best then
    print(("%gMiB: new / best fixed (old, seqs %d) throughput %.2fx; tokens computed %.2fx of unconstrained")
      :format(mib, best.k, (new.kept / new.secs) / (best.kept / best.secs), new.computed / ref.computed))
  end
end
progress:done()
bench.finish(bopts, { bench = "kv_pressure", requests = N, max_num_seqs = SEQS, rows = rows,
                      chart = { label = "name", values = { "x_ref" },
                                ylabel = "tokens computed / tokens computed unconstrained",
                                title = ("%d requests under KV budgets (outputs 16..192 tokens)"):format(N) } })
