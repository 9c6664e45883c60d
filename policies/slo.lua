-- slo.lua — SLO-aware scheduling: decodes ahead of their TPOT objective
-- yield to prompts near their TTFT deadline.
--
-- From a measured step time and prefill rate (moving averages), a decoding
-- request's slack is how long it could pause and still meet its TPOT
-- objective: the time its last token is due (first_token + slo_tpot_ms *
-- (max_tokens - 1)) - now - one step per token to come. Each step serves:
--   1. running requests at risk (prefilling, or slack < RELAXED_S): arrival order;
--   2. queued requests, earliest TTFT deadline first (arrival + slo_ttft_ms);
--   3. relaxed decodes, least slack first: they keep their KV blocks and fill
--      what the batch has left; their slack shrinks while they wait, so they
--      come back to (1) in time: nobody starves.
-- Under overload no decode is relaxed and this is FCFS with EDF admission.
-- A request short of KV blocks may preempt relaxed decodes only, the most
-- slack first (greedy preempts the latest entries); while the pool is under
-- pressure queued requests are admitted against their projected blocks.
-- Objectives a request does not give are DEFAULT_* (the replay lab's).

local policy = require("luainfer.policy")

local DEFAULT_TTFT_MS, DEFAULT_TPOT_MS = 2000, 200
local RELAXED_S, ALPHA = 1.0, 0.1  -- slack that lets a decode yield; smoothing
local step_s = 0.05                -- seconds per step (measured)
local last_now, relaxed = nil, {}

local function slack(r, now)
  local due = r.first_token + (r.slo_tpot_ms or DEFAULT_TPOT_MS) / 1000 * math.max(r.max_tokens - 1, 1)
  return due - now - (r.max_tokens - r.num_generated) * step_s
end
local function deadline(r) return r.arrival + (r.slo_ttft_ms or DEFAULT_TTFT_MS) / 1000 end

local opts = { project = true, skip_blocked = true, may_preempt = function(_, v) return relaxed[v.id] ~= nil end }

return {
  schedule = function(state)
    local now = state.now
    if last_now and now > last_now then step_s = (1 - ALPHA) * step_s + ALPHA * (now - last_now) end
    last_now = now
    local urgent, easy = {}, {}
    relaxed = {}
    for _, r in ipairs(state.running) do
      local s = r.first_token and r.num_computed >= r.num_tokens - 1 and slack(r, now)
      if s and s > RELAXED_S then easy[#easy + 1] = r; relaxed[r.id] = s else urgent[#urgent + 1] = r end
    end
    local queued = policy.sort_by(policy.concat(state.preempted, state.waiting), deadline)
    policy.sort_by(easy, function(r) return relaxed[r.id] end)
    return policy.greedy(state, policy.concat(urgent, queued, easy), opts)
  end,
}
