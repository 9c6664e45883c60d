-- bench_batching.lua — continuous batching (policies/default.lua) versus
-- static batching (policies/static.lua) on one mixed workload, side by side
-- in one run. Prints throughput of each and the ratios.
--
-- Static batching is run two ways:
--   static        a batch is formed only when the previous one has drained,
--                 and a member that finishes leaves the batch (its slot
--                 idles). This is the strong baseline.
--   static padded the classic request-level batching of HF generate() and
--                 FasterTransformer that the literature's 3-5x is measured
--                 against: every member of a batch computes until the batch's
--                 longest member finishes (padding), and the tokens past a
--                 member's own length are thrown away. It is run for real:
--                 each member's max_tokens is raised to its batch's longest,
--                 and only the tokens each request asked for count.
--
--   ./build/luainfer run bench/bench_batching.lua [N_REQUESTS] [MAX_NUM_SEQS[,...]] [SPREAD]
--                                                 [--device cpu|cuda] [--json FILE] [--plot FILE]
--
-- A comma list of batch sizes (e.g. 4,8,16,32) runs the comparison at each;
-- --plot draws throughput against batch size, continuous against static.
--
-- Workload: N requests (default 200) arriving at once, prompts of 8-120
-- words, output lengths over 16..512 (ignore_eos, greedy), spread either
--   uniform     evenly over 16..512 (mean 264), or
--   loguniform  evenly in log space over 16..512 (mean 143): most answers
--               short, a few long, the shape of chat traffic (ShareGPT-like).
-- Every run sees the same requests in the same order.
local luainfer = require("luainfer")
local bench = require("luainfer.bench")
local DEVICE = bench.take_flags(arg, { ["--device"] = "value" })["--device"]
local opts = bench.options(arg)
local root = opts.root
local N = tonumber(arg[1]) or 200
local SEQS_LIST = {}
for v in tostring(arg[2] or "32"):gmatch("[^,]+") do
  SEQS_LIST[#SEQS_LIST + 1] = assert(tonumber(v), "MAX_NUM_SEQS must be a number or a comma list of numbers")
end
local SEQS
local SPREAD = arg[3] or "uniform"
assert(SPREAD == "uniform" or SPREAD == "loguniform", "SPREAD must be uniform or loguniform")

-- output length of request i of N: the i-th quantile of the spread
local function out_len(i)
  local q = (i - 1) / math.max(N - 1, 1)
  if SPREAD == "uniform" then return 16 + math.floor(q * (512 - 16)) end
  return math.floor(16 * 32 ^ q + 0.5)
end

local words = { "data", "engine", "river", "policy", "cache", "block", "stream", "token", "lua", "kernel",
                "batch", "queue", "model", "vector", "prefix", "server" }
local function make_requests()
  local reqs, seed = {}, 12345
  local function rnd(n) seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n end
  for i = 1, N do
    local t = {}
    for k = 1, 8 + rnd(112) do t[k] = words[rnd(#words) + 1] end
    reqs[i] = { prompt = table.concat(t, " "), max_tokens = out_len(i),
                temperature = 0, ignore_eos = true }
  end
  -- shuffle so long and short outputs mix in arrival order
  for i = N, 2, -1 do local j = rnd(i) + 1; reqs[i], reqs[j] = reqs[j], reqs[i] end
  return reqs
end

-- padded: raise every member of each static batch (arrival order, SEQS at a
-- time, as static.lua forms them) to the batch's longest output; returns
-- each request's own length
local function pad(reqs)
  local useful = {}
  for b = 1, #reqs, SEQS do
    local mx = 0
    for i = b, math.min(b + SEQS - 1, #reqs) do mx = math.max(mx, reqs[i].max_tokens) end
    for i = b, math.min(b + SEQS - 1, #reqs) do useful[i] = reqs[i].max_tokens; reqs[i].max_tokens = mx end
  end
  return useful
end

local function run(policy, padded)
  local e = luainfer.engine{ policy = root .. "/policies/" .. policy .. ".lua", max_num_seqs = SEQS,
                             max_batched_tokens = 512, kv_memory = 512 * 1024 * 1024, device = DEVICE }
  local reqs = make_requests()
  local useful = padded and pad(reqs) or {}
  local ids = {}
  local t0 = os.clock()
  local wall0 = os.time()
  for i, r in ipairs(reqs) do ids[i] = e:add(r) end
  e:run()
  local s = e:stats()
  local gen = 0
  for i, id in ipairs(ids) do
    local n = #e:result(id).tokens
    gen = gen + (useful[i] and math.min(n, useful[i]) or n)
  end
  local secs = s.time_total
  e:close()
  return { gen = gen, secs = secs, tput = gen / secs, steps = s.steps, tokens = s.tokens_computed,
           policy = s.time_policy, wall = os.time() - wall0, cpu = os.clock() - t0 }
end

local rows = {}
local progress = bench.progress(3 * #SEQS_LIST, "batching runs")
for _, seqs in ipairs(SEQS_LIST) do
  SEQS = seqs
  print(("workload: %d requests, outputs 16..512 tokens (%s), max_num_seqs %d, device %s")
    :format(N, SPREAD, SEQS, DEVICE or "cpu"))
  local c = run("default")
  progress:step()
  print(("continuous (default.lua): %d tokens in %.1f s = %.1f tok/s, %d steps, policy %.2f%% of step time")
    :format(c.gen, c.secs, c.tput, c.steps, 100 * c.policy / c.secs))
  local s = run("static")
  progress:step()
  print(("static     (static.lua):  %d tokens in %.1f s = %.1f tok/s, %d steps, policy %.2f%% of step time")
    :format(s.gen, s.secs, s.tput, s.steps, 100 * s.policy / s.secs))
  local p = run("static", true)
  progress:step()
  print(("static padded (static.lua, members padded to the batch's longest): %d useful tokens in %.1f s = %.1f tok/s, %d steps")
    :format(p.gen, p.secs, p.tput, p.steps))
  print(("throughput ratio continuous/static: %.2fx"):format(c.tput / s.tput))
  print(("throughput ratio continuous/static padded: %.2fx"):format(c.tput / p.tput))
  -- where a step costs the same whatever its batch (a memory-bound GPU), the
  -- throughput ratio to static batching is this ratio of step counts
  print(("steps static / continuous: %.2fx"):format(s.steps / c.steps))
  rows[#rows + 1] = { max_num_seqs = SEQS, continuous = c.tput, static = s.tput, static_padded = p.tput,
                      steps_continuous = c.steps, steps_static = s.steps, tokens = c.gen }
end
progress:done()
bench.finish(opts, { bench = "batching", n_requests = N, spread = SPREAD, rows = rows })
