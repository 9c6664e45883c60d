-- hrrn.lua — highest response ratio next.
--
-- A queued request's response ratio is (waiting time + service time) /
-- service time, where the service time is its job size in tokens (prompt
-- still to prefill + output still to generate, policy.job_size) at a rate
-- the policy measures: tokens the engine computed per second of step time,
-- a moving average. Short jobs go first, as in SJF, but a long job's ratio
-- grows while it waits, so it cannot starve. Running requests keep their
-- place ahead of the queue. A full sort every step: no FCFS fallback at any
-- queue length.

local policy = require("luainfer.policy")

local rate = nil                    -- tokens computed per second of engine time, smoothed
local last_now, seen = nil, {}     -- seen[id]: num_computed at the previous step
local ALPHA = 0.1

-- tokens computed since the previous step (requests present in both) over
-- the engine time between them: the service rate
local function observe(state)
  local done, now_seen = 0, {}
  for _, r in ipairs(state.requests) do
    local before = seen[r.id]
    if before and r.num_computed > before then done = done + r.num_computed - before end
    now_seen[r.id] = r.num_computed
  end
  if last_now and state.now > last_now and done > 0 then
    local r = done / (state.now - last_now)
    rate = rate and (1 - ALPHA) * rate + ALPHA * r or r
  end
  last_now, seen = state.now, now_seen
end

return {
  schedule = function(state)
    observe(state)
    local per_token = 1 / (rate or 100) -- seconds per token; 100 tok/s until measured
    local now = state.now
    local function neg_ratio(r) -- sort_by is ascending: the highest ratio first
      local service = math.max(policy.job_size(r), 1) * per_token
      return -((now - r.arrival) + service) / service
    end
    local queued = policy.sort_by(policy.concat(state.preempted, state.waiting), neg_ratio)
    return policy.greedy(state, policy.concat(state.running, queued))
  end,
}
