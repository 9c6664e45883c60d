-- slo.lua — SLO-aware scheduling by slack: every request is served least
-- slack first, slack being how long it could still wait and meet its
-- objectives (slo_ttft_ms, slo_tpot_ms; DEFAULT_* when it gives none), from
-- a measured step time and prefill rate (moving averages):
--   * before its first token: arrival + TTFT objective - now - the time to
--     prefill what is left of its prompt;
--   * decoding: the time its last token is due (first_token + TPOT
--     objective * (max_tokens - 1)) - now - one step per token to come.
-- So a decode far ahead of its TPOT objective yields its sequence slot to a
-- queued prompt near its TTFT deadline, keeping its KV blocks (its slack
-- shrinks with time: nobody starves), and the batch stays full. Under KV
-- pressure the most slack loses its blocks first (greedy preempts later
-- entries), only for MIN_GAP s more slack; admission checks projected blocks.
local policy = require("luainfer.policy")

local DEFAULT_TTFT_MS, DEFAULT_TPOT_MS = 2000, 200
local ALPHA, MIN_GAP = 0.1, 0.5       -- smoothing; seconds of slack a preemption must win
local step_s, rate = 0.05, 2000       -- seconds per step, prefill tokens per second (measured)
local last_now, seen = nil, {}        -- seen[id]: num_computed at the previous step

local function observe(state) -- the step time and the tokens computed per second
  local done, now_seen = 0, {}
  for _, r in ipairs(state.requests) do
    local before = seen[r.id]
    if before and r.num_computed > before then done = done + r.num_computed - before end
    now_seen[r.id] = r.num_computed
  end
  if last_now and state.now > last_now then
    local dt = state.now - last_now; step_s = (1 - ALPHA) * step_s + ALPHA * dt
    if done > 0 then rate = (1 - ALPHA) * rate + ALPHA * done / dt end
  end
  last_now, seen = state.now, now_seen
end

local slack = {}
local function slack_of(r, now)
  if r.first_token == nil or r.state ~= "running" then -- TTFT still ahead (preempted: again)
    local left = math.max(r.prompt_len - r.num_computed, 0)
    local due = r.arrival + (r.slo_ttft_ms or DEFAULT_TTFT_MS) / 1000
    if r.first_token ~= nil then due = math.max(due, now) end -- TTFT met: resume soon, not first
    return due - now - left / rate
  end
  local due = r.first_token + (r.slo_tpot_ms or DEFAULT_TPOT_MS) / 1000 * math.max(r.max_tokens - 1, 1)
  return due - now - (r.max_tokens - r.num_generated) * step_s
end

local opts = { project = true, skip_blocked = true,
               may_preempt = function(r, v) return slack[v.id] >= slack[r.id] + MIN_GAP end }

return {
  schedule = function(state)
    observe(state)
    slack = {}
    for _, r in ipairs(state.requests) do slack[r.id] = slack_of(r, state.now) end
    local order = policy.sort_by(policy.concat(state.requests), function(r) return slack[r.id] end)
    return policy.greedy(state, order, opts)
  end,
}
