-- test_policy_progress.lua — the engine's progress guarantee (issue 18):
--  * a plan that preempts and runs the same request is trimmed: the request
--    runs, every output is the FCFS one, and no step is taken from the policy;
--  * plans that are valid but never progress (preempt whoever runs, run
--    someone else one token) lose steps to the built-in FCFS, counted in
--    livelock_steps, and every request finishes with the FCFS output;
--  * the same in the isolated mode.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local H = require("harness")
local luainfer = require("luainfer")
local root = H.repo_root()
local hostile = root .. "/tests/policies/hostile/"

local function run(policy, isolation)
  local e = luainfer.engine{ policy = policy, policy_isolation = policy and isolation or nil, max_num_seqs = 4 }
  local ids = {}
  for i = 1, 3 do
    ids[i] = e:add{ prompt = "Story " .. i .. ": once upon a time", max_tokens = 6, temperature = 0, ignore_eos = true }
  end
  local steps = 0
  while e:has_work() and steps < 2000 do e:step(); steps = steps + 1 end
  local out = {}
  for i, id in ipairs(ids) do out[i] = e:result(id).tokens end
  local s = e:stats()
  e:close()
  return out, s, steps
end

local ref = run(nil)
for _, iso in ipairs({ "inprocess", "process" }) do
  local out, s, steps = run(hostile .. "livelock.lua", iso)
  for i = 1, 3 do H.check(H.eq_list(out[i], ref[i]), "%s: preempt+run the same id: request %d output", iso, i) end
  H.check(s.livelock_steps == 0 and s.plans_trimmed > 0, "%s: contradiction trimmed (trimmed %d, livelock %d)", iso,
          s.plans_trimmed, s.livelock_steps)
  out, s, steps = run(hostile .. "livelock_alternate.lua", iso)
  H.check(steps < 2000, "%s: no-progress plans: everything finished (%d steps)", iso, steps)
  for i = 1, 3 do H.check(H.eq_list(out[i], ref[i]), "%s: no-progress plans: request %d output", iso, i) end
  H.check(s.livelock_steps > 0 and s.policy_errors == 0, "%s: livelock steps counted (%d)", iso, s.livelock_steps)
end
H.finish("test_policy_progress")
