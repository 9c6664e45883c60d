-- bench_batching.lua — continuous batching (policies/default.lua) versus
-- static batching (policies/static.lua) on one mixed workload, side by side
-- in one run. Prints throughput of each and the ratio.
--
--   ./build/luainfer run bench/bench_batching.lua [N_REQUESTS] [MAX_NUM_SEQS]
--
-- Workload: N requests (default 200) arriving at once, prompts of 8-120
-- tokens, output lengths spread evenly over 16..512 (ignore_eos, greedy), as
-- in the issue. Both runs see the same requests in the same order.
local luainfer = require("luainfer")
local root = (arg[0]:match("^(.*)/bench/") or ".")
local N = tonumber(arg[1]) or 200
local SEQS = tonumber(arg[2]) or 32

local words = { "data", "engine", "river", "policy", "cache", "block", "stream", "token", "lua", "kernel",
                "batch", "queue", "model", "vector", "prefix", "server" }
local function make_requests()
  local reqs, seed = {}, 12345
  local function rnd(n) seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n end
  for i = 1, N do
    local t = {}
    for k = 1, 8 + rnd(112) do t[k] = words[rnd(#words) + 1] end
    reqs[i] = { prompt = table.concat(t, " "), max_tokens = 16 + math.floor((i - 1) * (512 - 16) / math.max(N - 1, 1)),
                temperature = 0, ignore_eos = true }
  end
  -- shuffle so long and short outputs mix in arrival order
  for i = N, 2, -1 do local j = rnd(i) + 1; reqs[i], reqs[j] = reqs[j], reqs[i] end
  return reqs
end

local function run(policy)
  local e = luainfer.engine{ policy = root .. "/policies/" .. policy .. ".lua", max_num_seqs = SEQS,
                             max_batched_tokens = 512, kv_memory = 512 * 1024 * 1024 }
  local reqs = make_requests()
  local ids = {}
  local t0 = os.clock()
  local wall0 = os.time()
  for i, r in ipairs(reqs) do ids[i] = e:add(r) end
  e:run()
  local s = e:stats()
  local gen = 0
  for _, id in ipairs(ids) do gen = gen + #e:result(id).tokens end
  local secs = s.time_total
  e:close()
  return { gen = gen, secs = secs, tput = gen / secs, steps = s.steps, tokens = s.tokens_computed,
           policy = s.time_policy, wall = os.time() - wall0, cpu = os.clock() - t0 }
end

print(("workload: %d requests, outputs 16..512 tokens, max_num_seqs %d"):format(N, SEQS))
local c = run("default")
print(("continuous (default.lua): %d tokens in %.1f s = %.1f tok/s, %d steps, policy %.2f%% of step time")
  :format(c.gen, c.secs, c.tput, c.steps, 100 * c.policy / c.secs))
local s = run("static")
print(("static     (static.lua):  %d tokens in %.1f s = %.1f tok/s, %d steps, policy %.2f%% of step time")
  :format(s.gen, s.secs, s.tput, s.steps, 100 * s.policy / s.secs))
print(("throughput ratio continuous/static: %.2fx"):format(c.tput / s.tput))
