-- test_policy_slo.lua — latency objectives reach policies, and the SLO
-- policies do what they promise:
--  * slo_ttft_ms / slo_tpot_ms pass engine:add's checks (negative, NaN,
--    huge, strings refused with the field's name) and reach a policy, with
--    first_scheduled / first_token, the same in-process and isolated;
--  * a result's queue_delay is arrival to first scheduled: 0 <= it <= ttft,
--    and a request queued behind another waits for it;
--  * edf.lua: queued requests start in deadline order, not arrival order;
--  * slo.lua: a decode far ahead of its TPOT objective yields its one
--    sequence slot to a newcomer with a tight TTFT objective (default.lua
--    makes it wait);
--  * slo.lua, on the model clock: while prompts are queued, a decode with
--    TPOT slack pauses (the step is all prefill), and a step past 64 prompt
--    tokens ends with the prompt it finishes; default.lua batches the decode
--    and both prompts in one step; the paused decode still meets its TPOT;
--  * neither changes a greedy output.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local H = require("harness")
local luainfer = require("luainfer")
local root = H.repo_root()

local function req(i, max_tokens, extra)
  local r = { prompt = ("Request %d: the river town grew slowly"):format(i), max_tokens = max_tokens,
              temperature = 0, ignore_eos = true }
  for k, v in pairs(extra or {}) do r[k] = v end
  return r
end

-- ---- the fields: checks ---------------------------------------------------------
do
  local e = luainfer.engine{ max_num_seqs = 1 }
  for _, bad in ipairs({ { slo_ttft_ms = -1 }, { slo_tpot_ms = 0 / 0 }, { slo_ttft_ms = 1e12 },
                         { slo_tpot_ms = "fast" }, { slo_ttft_ms = math.huge } }) do
    local ok, err = pcall(e.add, e, req(1, 2, bad))
    local key = next(bad)
    H.check(not ok and tostring(err):find(key, 1, true) and tostring(err):find("must be a number", 1, true),
      "%s = %s refused with a clear error: %s", key, tostring(bad[key]), tostring(err))
  end
  -- queue_delay: the second request waits for the first (one sequence slot)
  local a = e:add(req(1, 8, { slo_ttft_ms = 500, slo_tpot_ms = 50.5 }))
  local b = e:add(req(2, 8))
  e:run()
  local ra, rb = e:result(a), e:result(b)
  for _, r in ipairs({ ra, rb }) do
    H.check(r.queue_delay and r.queue_delay >= 0 and r.queue_delay <= r.ttft, "queue_delay %s within ttft %s",
      tostring(r.queue_delay), tostring(r.ttft))
  end
  H.check(rb.queue_delay >= ra.latency - ra.ttft, "the queued request waited for the first one's decode: %g < %g",
    rb.queue_delay, ra.latency - ra.ttft)
  e:close()
end

-- ---- the fields reach a policy, in both modes ---------------------------------------
-- admit() of a request with tenant "probe" rejects it, and its reason is
-- what the policy saw: its own objectives, and the others' times
local probe = [[
local policy = require("luainfer.policy")
local function f(x) return x == nil and "nil" or string.format("%.1f", x) end
return {
  schedule = function(state) return policy.fcfs(state) end,
  admit = function(req, state)
    if req.tenant ~= "probe" then return true end
    local s = f(req.slo_ttft_ms) .. "/" .. f(req.slo_tpot_ms) .. "/" .. f(req.first_scheduled)
    for _, r in ipairs(state.requests) do
      s = s .. string.format(" %s:%s:%s:%s", f(r.slo_ttft_ms), f(r.slo_tpot_ms),
        tostring(r.first_scheduled ~= nil and r.first_scheduled >= r.arrival),
        tostring(r.first_token ~= nil and r.first_token >= r.first_scheduled))
    end
    return false, s
  end,
}
]]
local probe_path = os.tmpname()
do
  local f = assert(io.open(probe_path, "w"))
  f:write(probe)
  f:close()
end
for _, iso in ipairs({ "inprocess", "process" }) do
  local e = luainfer.engine{ policy = probe_path, policy_isolation = iso, max_num_seqs = 1 }
  e:add(req(1, 20, { slo_ttft_ms = 1500, slo_tpot_ms = 75.5 }))
  e:add(req(2, 4))
  e:step(); e:step()
  local ok, err = pcall(e.add, e, req(3, 2, { tenant = "probe", slo_ttft_ms = 250 }))
  local want = "250.0/nil/nil 1500.0:75.5:true:true nil:nil:false:false"
  H.check(not ok and tostring(err):find(want, 1, true), "%s: the policy sees the objectives and times: %s", iso,
    tostring(err))
  e:close()
end
os.remove(probe_path)

-- ---- edf and slo ----------------------------------------------------------------------
local function engine(policy)
  return luainfer.engine{ policy = root .. "/policies/" .. policy .. ".lua", max_num_seqs = 1 }
end
local texts = {}
local function keep(policy, e, ids)
  texts[policy] = texts[policy] or {}
  for k, id in pairs(ids) do texts[policy][k] = e:result(id).text end
end

-- X runs; A then B queue behind it, B with the tighter TTFT objective
for _, case in ipairs({ { policy = "default", first = "A" }, { policy = "edf", first = "B" } }) do
  local e = engine(case.policy)
  local ids = {}
  ids.X = e:add(req(1, 6))
  e:step()
  ids.A = e:add(req(2, 6, { slo_ttft_ms = 8000 }))
  ids.B = e:add(req(3, 6, { slo_ttft_ms = 1000 }))
  e:run()
  local a, b = e:result(ids.A), e:result(ids.B)
  local first = a.finish_time < b.finish_time and "A" or "B"
  H.check(first == case.first, "%s: %s started first, want %s", case.policy, first, case.first)
  keep(case.policy, e, ids)
  e:close()
end

-- X decodes far ahead of a lax TPOT objective; Y arrives with a tight TTFT
for _, case in ipairs({ { policy = "default", overtakes = false }, { policy = "slo", overtakes = true } }) do
  local e = engine(case.policy)
  local ids = {}
  ids.X = e:add(req(4, 40, { slo_tpot_ms = 5000 }))
  for _ = 1, 4 do e:step() end
  ids.Y = e:add(req(5, 4, { slo_ttft_ms = 100 }))
  e:run()
  local x, y = e:result(ids.X), e:result(ids.Y)
  local overtakes = y.finish_time < x.finish_time
  H.check(overtakes == case.overtakes, "%s: Y finished before X: %s, want %s", case.policy, tostring(overtakes),
    tostring(case.overtakes))
  H.check(#x.tokens == 40 and #y.tokens == 4, "%s: both ran to their lengths", case.policy)
  keep(case.policy .. "2", e, ids)
  e:close()
end

-- X decodes with a lax TPOT objective; P1 (>= 64 tokens) and P2 arrive together.
-- Cost: 1 ms per prompt token, 100 ms per decode row, nothing else, so a
-- TTFT reads off which rows shared the prompt's step.
local function toks(seed, n)
  local t = {}
  for k = 1, n do t[k] = 1000 + (seed * 7919 + k * 104729) % 30000 end
  return t
end
local function near(x, want) return math.abs(x - want) <= 1e-9 end
for _, policy in ipairs({ "default", "slo" }) do
  local e = luainfer.engine{ policy = root .. "/policies/" .. policy .. ".lua", max_num_seqs = 4 }
  e:set_clock{ a = 0, b = 0.001, c = 0.1, d = 0, start = 0 }
  local ids = {}
  ids.X = e:add(req(6, 30, { slo_tpot_ms = 2000 }))
  for _ = 1, 4 do e:step() end
  ids.P1 = e:add{ tokens = toks(1, 80), max_tokens = 3, temperature = 0, ignore_eos = true, slo_tpot_ms = 2000 }
  ids.P2 = e:add{ tokens = toks(2, 20), max_tokens = 3, temperature = 0, ignore_eos = true, slo_tpot_ms = 2000 }
  e:run()
  local x, p1, p2 = e:result(ids.X), e:result(ids.P1), e:result(ids.P2)
  -- default: X's row and both prompts in one step; slo: P1 alone, then P2 alone
  local want1 = policy == "default" and 0.1 + 0.1 or 0.08
  local want2 = policy == "default" and want1 or 0.1
  H.check(near(p1.first_token_time - p1.arrival_time, want1) and near(p2.first_token_time - p2.arrival_time, want2),
    "%s: TTFTs %.4f / %.4f s, want %.4f / %.4f", policy, p1.first_token_time - p1.arrival_time,
    p2.first_token_time - p2.arrival_time, want1, want2)
  local tpot = (x.finish_time - x.first_token_time) / (#x.tokens - 1)
  H.check(#x.tokens == 30 and tpot <= 2.0, "%s: the decode meets its TPOT objective: %.3f s", policy, tpot)
  keep(policy .. "3", e, ids)
  e:close()
end

-- a policy decides when, never what
for k, t in pairs(texts.default) do
  H.check(texts.edf[k] == t, "edf: request %s's greedy text is default.lua's", k)
end
for k, t in pairs(texts.default2) do
  H.check(texts.slo2[k] == t, "slo: request %s's greedy text is default.lua's", k)
end

for k, t in pairs(texts.default3) do
  H.check(texts.slo3[k] == t, "slo: request %s's greedy text is default.lua's (model clock)", k)
end

H.finish("test_policy_slo")
