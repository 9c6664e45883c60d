-- bench_ttft_bound.lua — a lower bound on the worst TTFT any policy can give
-- a trace on the model clock (bench/traces/step_cost.json).
--
--   ./build/luainfer run bench/bench_ttft_bound.lua TRACE [--rate-scale X[,Y...]] [--duration S]
--        [--cost FILE] [--json FILE] [--plot FILE]
--
-- A request's first token needs its whole prompt computed; on the model
-- clock a prompt of p tokens costs at least b*p + d*p*(p+1)/2 (each position
-- attends to itself and all before it, whatever the chunking), plus one step
-- (a) for the step that samples. The engine computes one step at a time, so
-- for arrivals i..j (in arrival order) the last of them to get its first
-- token does so no earlier than arrival_i + work(i..j) + a, and it arrived no
-- later than arrival_j: max TTFT >= arrival_i + work(i..j) + a - arrival_j.
-- The bound is the largest such value over all windows i..j; decodes are
-- free in it (a policy could defer every one), so no schedule beats it.
-- With 96 requests or fewer p99 is the maximum, so it bounds p99 too. It
-- assumes no prefix-cache hits (the replay reports `cached`; bursty has none).
local luainfer = require("luainfer")
local bench = require("luainfer.bench")
local json = require("luainfer.json")

local opts = bench.options(arg)
local usage = "usage: luainfer run bench/bench_ttft_bound.lua TRACE [--rate-scale X[,Y...]] [--duration S] [--cost FILE] [--json FILE] [--plot FILE]"
local trace_path, scales, duration, cost_path = nil, { 1 }, math.huge, opts.root .. "/bench/traces/step_cost.json"
do
  local i = 1
  local function value(flag)
    if arg[i + 1] == nil then error(flag .. " needs a value\n" .. usage, 0) end
    i = i + 2
    return arg[i - 1]
  end
  local function number(flag, v)
    local n = tonumber(v)
    if not n or n ~= n or n <= 0 then error(("%s: want a number > 0, got %q"):format(flag, v), 0) end
    return n
  end
  while arg[i] do
    local a = arg[i]
    if a == "--rate-scale" then
      scales = {}
      for v in value(a):gmatch("[^,]+") do scales[#scales + 1] = number(a, v) end
    elseif a == "--duration" then duration = number(a, value(a))
    elseif a == "--cost" then cost_path = value(a)
    elseif a:sub(1, 2) == "--" then error(("unknown option %s\n%s"):format(a, usage), 0)
    elseif not trace_path then trace_path = a; i = i + 1
    else error(("unexpected argument %q\n%s"):format(a, usage), 0) end
  end
end
if not trace_path then error(usage, 0) end

local function read_json(path, what)
  local f, err = io.open(path, "r")
  if not f then error(("cannot read %s %s: %s"):format(what, path, err), 0) end
  local v, derr = json.decode(f:read("*a"))
  f:close()
  if type(v) ~= "table" then error(("%s %s: %s"):format(what, path, derr or "not a JSON object"), 0) end
  return v
end
local c = read_json(cost_path, "step cost")
for _, k in ipairs({ "a", "b", "d" }) do
  if type(c[k]) ~= "number" or c[k] < 0 then error(("%s: '%s' must be a number >= 0"):format(cost_path, k), 0) end
end

-- prompt lengths in tokens, as the engine counts them (its tokenizer)
local e = luainfer.engine{ max_num_seqs = 1 }
local reqs, n = {}, 0
local f, ferr = io.open(trace_path, "r")
if not f then error(("cannot read trace %s: %s"):format(trace_path, ferr), 0) end
for line in f:lines() do
  n = n + 1
  if line:match("%S") then
    local r = json.decode(line)
    if type(r) ~= "table" or type(r.t) ~= "number" then error(("%s:%d: want a JSON object with 't'"):format(trace_path, n), 0) end
    local p = r.prompt and #e:tokenize(r.prompt) or r.prompt_len
    if type(p) ~= "number" then error(("%s:%d: needs 'prompt' or 'prompt_len'"):format(trace_path, n), 0) end
    reqs[#reqs + 1] = { t = r.t, work = c.b * p + c.d * p * (p + 1) / 2, p = p }
  end
end
f:close()
e:close()

print(("trace %s: %d requests; cost %s: a %.2f ms, b %.3f ms/token, d %.2e s/context"):format(trace_path, #reqs,
  cost_path, c.a * 1e3, c.b * 1e3, c.d))
print(("%6s %8s %10s %14s %s"):format("scale", "requests", "bound ms", "prefill s", "window (requests, arrivals s)"))
local rows = {}
local progress = bench.progress(#scales, "ttft bound scales")
for _, scale in ipairs(scales) do
  local best, bi, bj, m, total = -math.huge, 1, 1, 0, 0
  for i = 1, #reqs do
    if reqs[i].t / scale < duration then m = i; total = total + reqs[i].work end
  end
  for i = 1, m do
    local w = 0
    for j = i, m do
      w = w + reqs[j].work
      local lb = reqs[i].t / scale + w + c.a - reqs[j].t / scale
      if lb > best then best, bi, bj = lb, i, j end
    end
  end
  rows[#rows + 1] = { name = ("scale %g"):format(scale), rate_scale = scale, requests = m, bound_ms = best * 1e3, prefill_s = total, first = bi, last = bj,
                      from_s = reqs[bi].t / scale, to_s = reqs[bj].t / scale }
  print(("%6.2f %8d %10.0f %14.2f %d..%d, %.2f..%.2f"):format(scale, m, best * 1e3, total, bi, bj, reqs[bi].t / scale,
    reqs[bj].t / scale))
  progress:step()
end
progress:done()
print("(bound: no policy's maximum TTFT is lower; p99 is the maximum up to 100 requests)")
bench.finish(opts, { bench = "ttft_bound", trace = trace_path, step_cost = cost_path, rows = rows,
                     chart = { label = "name", values = { "bound_ms" }, ylabel = "lower bound on max TTFT (ms)",
                               title = ("no policy's worst TTFT on %s is lower"):format(trace_path:match("[^/]*$")) } })
