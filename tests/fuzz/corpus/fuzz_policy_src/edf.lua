-- edf.lua — earliest deadline first, from each request's TTFT objective.
--
-- A request's deadline is its arrival plus its slo_ttft_ms (a request
-- without one gets DEFAULT_TTFT_MS, the replay lab's default). Running
-- requests keep their place, in deadline order (so under KV pressure the
-- latest deadline is preempted first); queued requests (preempted and
-- waiting together) are admitted earliest deadline first, and one that does
-- not fit lets later deadlines try (skip_blocked), so a large prompt cannot
-- hold up the queue behind it. A full sort every step, at any queue length.
-- EDF decides only *when*: greedy outputs are default.lua's.

local policy = require("luainfer.policy")

local DEFAULT_TTFT_MS = 2000

local function deadline(r)
  return r.arrival + (r.slo_ttft_ms or DEFAULT_TTFT_MS) / 1000
end

return {
  schedule = function(state)
    local running = policy.sort_by(policy.concat(state.running), deadline)
    local queued = policy.sort_by(policy.concat(state.preempted, state.waiting), deadline)
    return policy.greedy(state, policy.concat(running, queued), { skip_blocked = true })
  end,
}
