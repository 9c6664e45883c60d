-- bench_replay.lua — replays an arrival trace against an in-process engine
-- for one or more policies, side by side: throughput, TTFT and TPOT
-- percentiles, goodput (the share of requests meeting their SLOs),
-- queueing delay (arrival to the first step that computed the request),
-- preemptions and policy time per step.
--
--   ./build/luainfer bench replay TRACE [--policy P.lua]... [--rate-scale X[,Y,...]]
--        [--duration S] [--max-num-seqs N] [--kv-memory MIB] [--clock wall|model[:FILE]]
--        [--policy-time] [--goodput-target G] [--json FILE] [--plot FILE]
--
-- TRACE is a JSON-lines file (bench/traces/, made by tools/gen_traces.py):
-- per request the arrival time t (s), the prompt (text, or prompt_len
-- synthetic tokens), max_tokens (replayed with ignore_eos, so exact),
-- optionally tenant, priority and slo_ttft_ms / slo_tpot_ms (default 2000
-- and 200). Arrivals follow the trace on the engine's clock: a request is
-- added once its arrival time (divided by the rate scale) has passed, the
-- engine steps while it has work and sleeps until the next arrival when it
-- has none. --rate-scale 2 replays twice as fast (twice the load); a comma
-- list sweeps, and --plot then draws goodput against load beside the TTFT
-- percentiles. A sweep also prints each policy's maximum load at the SLOs:
-- the highest rate scale at which, as at every lower scale swept, at least
-- --goodput-target of the requests (default 0.9) met theirs. Policies (default policies/default.lua) run in turn on the
-- same trace, in an order that alternates between rate scales.
--
-- --clock model[:FILE] (default FILE bench/traces/step_cost.json, fitted by
-- bench_step_cost.lua --fit): the engine's clock advances by the step cost
-- model instead of wall time, and idle waits jump to the next arrival, so
-- TTFT, TPOT, queueing delay and goodput depend on the trace, the policy
-- and the cost model only: the same numbers on any machine, at any load.
-- Times are then measured from each request's virtual arrival. The
-- policy's own (wall) time per step is still reported; --policy-time adds
-- it to the model clock too (and the numbers depend on the machine again).
local luainfer = require("luainfer")
local bench = require("luainfer.bench")
local json = require("luainfer.json")

local opts = bench.options(arg)
local root = opts.root
local usage = "usage: luainfer bench replay TRACE [--policy P.lua]... [--rate-scale X[,Y...]] [--duration S] "
  .. "[--max-num-seqs N] [--kv-memory MIB] [--clock wall|model[:FILE]] [--policy-time] [--goodput-target G] "
  .. "[--json FILE] [--plot FILE]"

-- ---- arguments ---------------------------------------------------------------
local trace_path, policies, scales, duration, max_num_seqs, kv_mib = nil, {}, { 1 }, math.huge, 16, 256
local clock, cost_path, policy_time, goodput_target = "wall", nil, false, 0.9
do
  local i = 1
  local function value(flag)
    local v = arg[i + 1]
    if v == nil then error(flag .. " needs a value\n" .. usage, 0) end
    i = i + 2
    return v
  end
  local function number(flag, v, lo)
    local n = tonumber(v)
    if not n or n ~= n or n < lo then error(("%s: want a number >= %g, got %q"):format(flag, lo, v), 0) end
    return n
  end
  while arg[i] do
    local a = arg[i]
    if a == "--policy" then policies[#policies + 1] = value(a)
    elseif a == "--rate-scale" then
      scales = {}
      for v in value(a):gmatch("[^,]+") do scales[#scales + 1] = number("--rate-scale", v, 1e-3) end
    elseif a == "--duration" then duration = number(a, value(a), 0)
    elseif a == "--max-num-seqs" then max_num_seqs = math.floor(number(a, value(a), 1))
    elseif a == "--kv-memory" then kv_mib = number(a, value(a), 1)
    elseif a == "--clock" then
      local v = value(a)
      clock, cost_path = v:match("^(%a+):?(.*)$")
      if clock ~= "wall" and clock ~= "model" or (clock == "wall" and cost_path ~= "") then
        error(("--clock: want wall or model[:FILE], got %q"):format(v), 0)
      end
      if cost_path == "" then cost_path = nil end
    elseif a == "--policy-time" then policy_time = true; i = i + 1
    elseif a == "--goodput-target" then
      goodput_target = number(a, value(a), 0)
      if goodput_target > 1 then error(("--goodput-target: want a share in [0, 1], got %g"):format(goodput_target), 0) end
    elseif a:sub(1, 2) == "--" then error(("unknown option %s\n%s"):format(a, usage), 0)
    elseif not trace_path then trace_path = a; i = i + 1
    else error(("unexpected argument %q\n%s"):format(a, usage), 0) end
  end
end
if not trace_path then error(usage, 0) end
if #policies == 0 then policies = { root .. "/policies/default.lua" } end

-- ---- the step cost model (--clock model) ---------------------------------------
local cost
if clock == "model" then
  cost_path = cost_path or root .. "/bench/traces/step_cost.json"
  local f, err = io.open(cost_path, "r")
  if not f then error(("--clock model: cannot read %s: %s"):format(cost_path, err), 0) end
  local c, derr = json.decode(f:read("*a"))
  f:close()
  if type(c) ~= "table" then error(("--clock model: %s: %s"):format(cost_path, derr or "not a JSON object"), 0) end
  for _, k in ipairs({ "a", "b", "c", "d" }) do
    if type(c[k]) ~= "number" or c[k] < 0 or c[k] ~= c[k] then
      error(("--clock model: %s: '%s' must be a number >= 0"):format(cost_path, k), 0)
    end
  end
  cost = { a = c.a, b = c.b, c = c.c, d = c.d, policy_scale = policy_time and 1 or 0, start = 0 }
elseif policy_time then
  error("--policy-time needs --clock model", 0)
end

-- ---- the trace ---------------------------------------------------------------
local function read_trace(path)
  local f, err = io.open(path, "r")
  if not f then error(("cannot read trace %s: %s"):format(path, err), 0) end
  local reqs, n, last_t = {}, 0, -math.huge
  for line in f:lines() do
    n = n + 1
    if line:match("%S") then
      local r, derr = json.decode(line)
      local function bad(what) error(("%s:%d: %s"):format(path, n, what), 0) end
      if not r then bad(derr) end
      if type(r) ~= "table" then bad("a line must be a JSON object") end
      if type(r.t) ~= "number" or r.t < 0 then bad("'t' (arrival, seconds) must be a number >= 0") end
      if r.t < last_t then bad("arrivals must be in order") end
      last_t = r.t
      if type(r.max_tokens) ~= "number" or r.max_tokens < 1 or r.max_tokens ~= math.floor(r.max_tokens) then
        bad("'max_tokens' must be an integer >= 1")
      end
      if type(r.prompt) ~= "string" and type(r.prompt_len) ~= "number" then bad("needs 'prompt' (text) or 'prompt_len'") end
      if r.prompt_len and (r.prompt_len < 1 or r.prompt_len ~= math.floor(r.prompt_len)) then
        bad("'prompt_len' must be an integer >= 1")
      end
      reqs[#reqs + 1] = r
    end
  end
  f:close()
  if #reqs == 0 then error(("trace %s has no requests"):format(path), 0) end
  return reqs
end
local trace = read_trace(trace_path)

-- synthetic prompt of n tokens: ids spread over the vocabulary, deterministic
local function synthetic(i, n)
  local t = {}
  for k = 1, n do t[k] = 1000 + (i * 7919 + k * 104729) % 30000 end
  return t
end

-- ---- one replay ----------------------------------------------------------------
local now = bench.now

local function pct(xs, p)
  if #xs == 0 then return 0 / 0 end
  local s = {}
  for i, x in ipairs(xs) do s[i] = x end
  table.sort(s)
  return s[math.max(1, math.min(#s, math.ceil(p / 100 * #s)))]
end

local function replay(policy, scale)
  local e = luainfer.engine{ policy = policy, max_num_seqs = max_num_seqs, kv_memory = math.floor(kv_mib * 1048576) }
  local reqs = {}
  for i, r in ipairs(trace) do
    if r.t / scale < duration then reqs[i] = r end
  end
  local n, ids, next_i = #reqs, {}, 1
  if n == 0 then error(("no request of the trace arrives within --duration %g s"):format(duration), 0) end
  -- the clock: wall time, or the engine's model clock from 0
  local clk, t0 = now, now()
  if cost then
    e:set_clock(cost)
    clk, t0 = function() return e:now() end, 0
  end
  while next_i <= n or e:has_work() do
    local t = clk() - t0
    while next_i <= n and reqs[next_i].t / scale <= t do
      local r = reqs[next_i]
      ids[next_i] = e:add{
        prompt = r.prompt, tokens = r.prompt == nil and synthetic(next_i, r.prompt_len) or nil,
        max_tokens = r.max_tokens, temperature = 0, ignore_eos = true,
        tenant = r.tenant, priority = r.priority,
        slo_ttft_ms = r.slo_ttft_ms or 2000, slo_tpot_ms = r.slo_tpot_ms or 200,
      }
      next_i = next_i + 1
    end
    if e:has_work() then
      e:step()
    elseif next_i <= n then -- idle until the next arrival
      if cost then e:advance_clock(reqs[next_i].t / scale)
      else bench.sleep(math.min(reqs[next_i].t / scale - (now() - t0), 0.05)) end
    end
  end
  local makespan = clk() - t0
  local s = e:stats()
  local ttft, tpot, queue, good, out_tokens, texts, per_tenant = {}, {}, {}, 0, 0, {}, {}
  for i = 1, n do
    local r, res = reqs[i], e:result(ids[i])
    local ntok = #res.tokens
    local tt, tp, qd
    if cost then -- from the virtual arrival: a request arriving mid-step is added after it
      local arr = r.t / scale
      tt = (res.first_token_time or math.huge) - arr
      qd = (res.first_scheduled_time or math.huge) - arr
      tp = ntok > 1 and (res.finish_time - res.first_token_time) / (ntok - 1) or 0
      tt, tp, qd = tt * 1e3, tp * 1e3, qd * 1e3
    else
      tt = (res.ttft or math.huge) * 1e3
      tp = ntok > 1 and ((res.latency - res.ttft) * 1e3 / (ntok - 1)) or 0
      qd = (res.queue_delay or math.huge) * 1e3
    end
    ttft[#ttft + 1], tpot[#tpot + 1] = tt, tp
    queue[#queue + 1] = qd
    out_tokens = out_tokens + ntok
    if tt <= (r.slo_ttft_ms or 2000) and tp <= (r.slo_tpot_ms or 200) then good = good + 1 end
    texts[i] = res.text
    local tn = r.tenant or ""
    per_tenant[tn] = (per_tenant[tn] or 0) + ntok
    e:release(ids[i])
  end
  e:close()
  return {
    policy = policy:match("([^/]+)%.lua$") or policy, rate_scale = scale, requests = n, makespan_s = makespan,
    throughput = out_tokens / makespan, output_tokens = out_tokens, goodput = good / n,
    ttft_p50 = pct(ttft, 50), ttft_p90 = pct(ttft, 90), ttft_p99 = pct(ttft, 99),
    tpot_p50 = pct(tpot, 50), tpot_p90 = pct(tpot, 90), tpot_p99 = pct(tpot, 99),
    queue_p50 = pct(queue, 50), queue_p90 = pct(queue, 90), queue_p99 = pct(queue, 99),
    ttft_max = pct(ttft, 100), tpot_max = pct(tpot, 100), clock = clock,
    preemptions = s.preemptions, prefix_hit_rate = s.prefix_hit_rate, steps = s.steps, policy_ms_per_step = s.steps > 0 and 1e3 * s.time_policy / s.steps or 0,
    policy_share = s.time_total > 0 and s.time_policy / s.time_total or 0, ttft_ms = ttft, tokens_per_tenant = per_tenant,
    texts = texts,
  }
end

-- ---- the runs ------------------------------------------------------------------
print(("trace %s: %d requests over %.1f s; max_num_seqs %d, KV %g MiB, greedy, ignore_eos; %s clock")
  :format(trace_path, #trace, trace[#trace].t, max_num_seqs, kv_mib, clock))
local progress = bench.progress(#policies * #scales, "replays")
local runs = {}
for si, scale in ipairs(scales) do
  local order = {}
  for k = 1, #policies do order[k] = si % 2 == 1 and k or #policies + 1 - k end
  for _, k in ipairs(order) do
    local r = replay(policies[k], scale)
    r.index = k
    runs[#runs + 1] = r
    progress:step()
  end
end
progress:done()

table.sort(runs, function(a, b)
  if a.rate_scale ~= b.rate_scale then return a.rate_scale < b.rate_scale end
  return a.index < b.index
end)
print(("\n%-14s %5s %8s %8s | %7s %7s %7s | %6s %6s %6s | %6s %6s %6s | %7s %6s | %7s %6s %8s %5s"):format("policy",
  "scale", "tok/s", "makespan", "ttft50", "ttft90", "ttft99", "tpot50", "tpot90", "tpot99", "queue50", "q90", "q99",
  "ttftmax", "tpotmx", "goodput", "preempt", "pol ms/st", "hit"))
for _, r in ipairs(runs) do
  print(("%-14s %5.2f %8.1f %7.1fs | %7.0f %7.0f %7.0f | %6.1f %6.1f %6.1f | %6.0f %6.0f %6.0f | %7.0f %6.1f | %6.0f%% %7d %8.3f %4.0f%%")
    :format(r.policy, r.rate_scale, r.throughput, r.makespan_s, r.ttft_p50, r.ttft_p90, r.ttft_p99, r.tpot_p50,
      r.tpot_p90, r.tpot_p99, r.queue_p50, r.queue_p90, r.queue_p99, r.ttft_max, r.tpot_max, 100 * r.goodput,
      r.preemptions, r.policy_ms_per_step, 100 * r.prefix_hit_rate))
end
print(("(ms on the %s clock%s; queue: arrival to the first step that computed the request; goodput: requests")
  :format(clock, cost and (" of " .. cost_path) or ""))
print(" with TTFT <= slo_ttft_ms and TPOT <= slo_tpot_ms; one greedy output per request; pol ms/st: wall time;")
print(" hit: prompt tokens served by the prefix cache)")

-- the load sweep: each policy's highest scale meeting the goodput target at
-- it and at every lower scale (a scale past the first miss does not count:
-- a lucky point above an overload is no capacity)
local max_load
if #scales > 1 then
  max_load = {}
  local line = {}
  for k, path in ipairs(policies) do
    local best, name = nil, nil
    for _, r in ipairs(runs) do
      if r.index == k then
        name = r.policy
        if r.goodput + 1e-12 < goodput_target then break end
        best = r.rate_scale
      end
    end
    max_load[name or path] = best or false
    line[#line + 1] = ("%s %s"):format(name or path, best and ("%.2f"):format(best)
      or ("below %.2f"):format(runs[1].rate_scale))
  end
  print(("max load with goodput >= %g%% (of the scales swept): %s"):format(100 * goodput_target,
    table.concat(line, ", ")))
end

-- a policy decides when, never what: every run's greedy texts are the same
local same = true
for _, r in ipairs(runs) do
  for i, text in pairs(r.texts) do
    if runs[1].texts[i] ~= nil and text ~= runs[1].texts[i] then same = false end
  end
end
print(same and "every run's outputs were identical" or "OUTPUTS DIFFER between runs")
for _, r in ipairs(runs) do r.texts = nil end
bench.finish(opts, { bench = "replay", trace = trace_path, max_num_seqs = max_num_seqs, runs = runs, clock = clock,
                     step_cost = cost, max_load = max_load, goodput_target = goodput_target })
if not same then os.exit(1) end
