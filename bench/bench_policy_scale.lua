-- bench_policy_scale.lua — what a policy costs per engine step with many
-- live requests (issue 17's target: under 2% of step time at 256 live,
-- in-process): N requests live (default 256), max_num_seqs of them
-- decoding (default 64), the rest queued, so the policy sorts and walks all
-- N every step. Per policy: policy µs per step, step ms, and the share,
-- policies alternating over ROUNDS rounds (drift on the machine is shared).
--
--   ./build/luainfer run bench/bench_policy_scale.lua [STEPS] [N] [MAX_NUM_SEQS] [ROUNDS] [POLICY.lua ...]
--                                                     [--json FILE] [--plot FILE]
local luainfer = require("luainfer")
local bench = require("luainfer.bench")
local opts = bench.options(arg)
local root = (arg[0]:match("^(.*)/bench/") or ".")
local STEPS, N, SEQS, ROUNDS = tonumber(arg[1]) or 20, tonumber(arg[2]) or 256, tonumber(arg[3]) or 64,
  tonumber(arg[4]) or 2
local policies = {}
for i = 5, #arg do policies[#policies + 1] = arg[i] end
if #policies == 0 then
  for _, p in ipairs({ "default", "edf", "slo" }) do policies[#policies + 1] = root .. "/policies/" .. p .. ".lua" end
end

local function run(policy)
  local e = luainfer.engine{ policy = policy, policy_isolation = "inprocess", max_num_seqs = SEQS,
                             max_batched_tokens = 512, kv_memory = 512 * 1024 * 1024 }
  for i = 1, N do
    e:add{ prompt = "Request " .. i .. " asks about the weather in a small town by the sea.",
           max_tokens = 4 * STEPS + 40, temperature = 0, ignore_eos = true,
           slo_ttft_ms = 1000 + 10 * (i % 50), slo_tpot_ms = 200 }
  end
  -- steady state: the batch full of decodes, the rest queued
  while e:stats().running < SEQS do e:step() end
  e:step()
  local s0 = e:stats()
  for _ = 1, STEPS do e:step() end
  local s1 = e:stats()
  e:close()
  local steps = s1.steps - s0.steps
  local total, pol = s1.time_total - s0.time_total, s1.time_policy - s0.time_policy
  return { step_ms = 1e3 * total / steps, policy_us = 1e6 * pol / steps, share = pol / total,
           errors = s1.policy_errors - s0.policy_errors, live = s1.running + s1.waiting + s1.preempted }
end

local acc = {}
local progress = bench.progress(ROUNDS * #policies, "policy runs")
for round = 1, ROUNDS do
  for k = 1, #policies do
    local j = round % 2 == 1 and k or #policies + 1 - k
    local r = run(policies[j])
    progress:step()
    local a = acc[j] or { step_ms = 0, policy_us = 0, share = 0, errors = 0, live = r.live }
    a.step_ms, a.policy_us, a.share = a.step_ms + r.step_ms / ROUNDS, a.policy_us + r.policy_us / ROUNDS,
      a.share + r.share / ROUNDS
    a.errors = a.errors + r.errors
    acc[j] = a
  end
end
print(("%d live requests (%d decoding), %d steps x %d rounds, in-process"):format(N, SEQS, STEPS, ROUNDS))
print(("%-14s %10s %10s %8s %7s"):format("policy", "policy us", "step ms", "share", "errors"))
local rows = {}
for j, p in ipairs(policies) do
  local a = acc[j]
  local name = p:match("([^/]+)%.lua$") or p
  print(("%-14s %10.0f %10.1f %7.2f%% %7d"):format(name, a.policy_us, a.step_ms, 100 * a.share, a.errors))
  rows[#rows + 1] = { name = name, policy_us = a.policy_us, step_ms = a.step_ms, share_pct = 100 * a.share,
                      errors = a.errors }
end
progress:done()
bench.finish(opts, { bench = "policy_scale", live = N, decoding = SEQS, steps = STEPS, rounds = ROUNDS, rows = rows,
                     chart = { label = "name", values = { "share_pct" }, ylabel = "policy time, % of step time",
                               title = ("%d live requests (%d decoding), in-process"):format(N, SEQS) } })
