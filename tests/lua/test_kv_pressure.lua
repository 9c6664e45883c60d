-- test_kv_pressure.lua — scheduling under a KV budget far too small for the
-- batch (issue 18, "graceful under KV pressure"), on the real model:
--  * every request finishes, with exactly the output of an unconstrained run
--    (greedy, ignore_eos: the same tokens whatever the batch);
--  * the recompute thrash is gone: tokens computed stay within 1.5x of the
--    unconstrained run's, for the built-in FCFS (core/policy/fcfs.c),
--    policies/default.lua in-process and the same file isolated;
--  * the state hands policies projected_blocks and kv.running_need, and
--    policy.peak_fits (the projected peak FCFS admits against) says what it
--    should on a few fixed requests.
-- Before projected admission the built-in FCFS computed ~4x the tokens here
-- (requests admitted and resumed that the budget could not carry to the end
-- preempted each other over and over).
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local H = require("harness")
local luainfer = require("luainfer")
local root = H.repo_root()

local words = { "data", "engine", "river", "policy", "cache", "block", "stream", "token" }
local N = 10
local function workload()
  local reqs, seed = {}, 99
  local function rnd(n) seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n end
  for i = 1, N do
    local t = {}
    for k = 1, 3 + rnd(6) do t[k] = words[rnd(#words) + 1] end
    reqs[i] = { prompt = table.concat(t, " "), max_tokens = 24 + (i * 13) % 41, temperature = 0, ignore_eos = true }
  end
  return reqs
end

local function run(opts)
  opts.max_num_seqs = opts.max_num_seqs or 8
  opts.block_size = 8
  local e = luainfer.engine(opts)
  local ids, out = {}, {}
  for i, r in ipairs(workload()) do ids[i] = e:add(r) end
  local steps = 0
  while e:has_work() and steps < 20000 do e:step(); steps = steps + 1 end
  local unfinished = 0
  for i, id in ipairs(ids) do
    local res = e:result(id)
    out[i] = res.tokens
    if not res.finished or res.finish_reason ~= "length" then unfinished = unfinished + 1 end
  end
  local s = e:stats()
  e:close()
  return out, s, unfinished
end

local ref, rs = run({ kv_memory = 64 * 1024 * 1024 })
H.check(rs.preemptions == 0, "the reference run preempts nothing (%d)", rs.preemptions)
-- 10 blocks of 8 tokens: the largest request (about 10 + 64 tokens) fits
-- alone, two of them at once do not
local kv = 10 * 8 * 23040

local cases = {
  { "built-in FCFS", { kv_memory = kv } },
  { "default.lua", { kv_memory = kv, policy = root .. "/policies/default.lua" } },
  -- a generous deadline: a loaded machine must not turn a slow reply into a fallback step
  { "default.lua isolated", { kv_memory = kv, policy = root .. "/policies/default.lua", policy_isolation = "process",
                              policy_deadline_ms = 20000 } },
}
for _, c in ipairs(cases) do
  local out, s, unfinished = run(c[2])
  H.check(unfinished == 0, "%s: %d requests did not finish with their full length", c[1], unfinished)
  local diff = 0
  for i = 1, N do if not H.eq_list(out[i], ref[i]) then diff = diff + 1 end end
  H.check(diff == 0, "%s: %d outputs differ from the unconstrained run", c[1], diff)
  local ratio = s.tokens_computed / rs.tokens_computed
  H.check(ratio <= 1.5, "%s: %.2fx the tokens computed without pressure (%d / %d, %d preemptions)", c[1], ratio,
          s.tokens_computed, rs.tokens_computed, s.preemptions)
  H.check(s.fallback_steps == 0 and s.policy_errors == 0, "%s: no fallback (%d) or policy error (%d)", c[1],
          s.fallback_steps, s.policy_errors)
  print(("%s: %.2fx tokens computed, %d preemptions"):format(c[1], ratio, s.preemptions))
end

-- a request longer than the whole pool stops there ("length"), as at the
-- context's end, instead of preempting itself and everyone else for ever
do
  local long = { prompt = "data engine river policy", max_tokens = 200, temperature = 0, ignore_eos = true }
  local short = workload()[1]
  short.max_tokens = 8
  local e = luainfer.engine({ kv_memory = 64 * 1024 * 1024, block_size = 8 })
  local _, full = luainfer.generate(e, long.prompt, long)
  e:close()
  e = luainfer.engine({ kv_memory = 5 * 8 * 23040, block_size = 8, max_num_seqs = 4 })
  local a, b = e:add(long), e:add(short)
  local steps = 0
  while e:has_work() and steps < 5000 do e:step(); steps = steps + 1 end
  local ra, rb = e:result(a), e:result(b)
  local cap = 5 * 8 - ra.prompt_tokens
  H.check(ra.finished and ra.finish_reason == "length" and #ra.tokens == cap, "the long request stops at the pool's end: %s, %d tokens (want %d)",
          tostring(ra.finish_reason), #ra.tokens, cap)
  local prefix = {}
  for i = 1, cap do prefix[i] = full.tokens[i] end
  H.check(H.eq_list(ra.tokens, prefix), "its tokens are the unconstrained run's first %d", cap)
  local ref8 = {}
  for i = 1, 8 do ref8[i] = ref[1][i] end
  H.check(rb.finished and rb.finish_reason == "length" and H.eq_list(rb.tokens, ref8),
          "the short request beside it finishes whole")
  e:close()
end

-- the fields a policy needs to do the same
local seen = {}
local src = [[
local policy = require("luainfer.policy")
return { schedule = function(s)
  local need = 0
  for _, r in ipairs(s.running) do need = need + r.projected_blocks end
  assert(s.kv.running_need == need, "running_need " .. tostring(s.kv.running_need) .. " ~= " .. need)
  for _, r in ipairs(s.requests) do
    local bs = s.kv.block_size
    local want = math.ceil((r.prompt_len + r.max_tokens - 1) / bs) - r.blocks
    assert(r.projected_blocks == math.max(want, 0), "projected_blocks of " .. r.id)
  end
  return policy.fcfs(s)
end }
]]
local _, s = run({ kv_memory = kv, policy_source = src })
H.check(s.policy_errors == 0, "projected_blocks and kv.running_need as documented (%d policy errors)", s.policy_errors)

-- policy.peak_fits, the projected peak FCFS admits against: a running request
-- 9 blocks from its end (145 steps) and one that needs 4 and ends after 37
-- steps need 9 at once at most (7 when the second ends), though their
-- projections add up to 13
do
  local policy = require("luainfer.policy")
  local running = { { num_tokens = 15, prompt_len = 10, max_tokens = 150, blocks = 1, projected_blocks = 9 } }
  local short = { num_tokens = 23, prompt_len = 20, max_tokens = 40, blocks = 0, projected_blocks = 4 }
  local long = { num_tokens = 23, prompt_len = 20, max_tokens = 160, blocks = 0, projected_blocks = 11 }
  H.check(policy.peak_fits(short, running, 10, 16), "peak_fits: a request that ends first fits in 10 blocks")
  H.check(not policy.peak_fits(short, running, 8, 16), "peak_fits: not in 8 (the running one alone needs 9)")
  H.check(not policy.peak_fits(long, running, 10, 16), "peak_fits: one that outlives it does not fit in 10")
  H.check(policy.peak_fits(long, {}, 11, 16) and not policy.peak_fits(long, {}, 10, 16),
          "peak_fits: alone, a request needs its projection")
end
H.finish("test_kv_pressure")
