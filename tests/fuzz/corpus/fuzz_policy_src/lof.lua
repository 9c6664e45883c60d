-- lof.lua — longest output first (SGLang's "lof" schedule policy).
--
-- Queued requests (preempted and waiting together) are admitted in order of
-- the output they may still generate (max_tokens - num_generated), longest
-- first; ties by arrival. Running requests keep their place ahead of the
-- queue, so nothing admitted is thrown out for a longer newcomer. Long jobs
-- start early and overlap the short ones that arrive behind them, which
-- raises throughput on mixed traffic at the cost of short requests' TTFT.
-- The order is a full sort every step: no fallback to FCFS at any queue
-- length.

local policy = require("luainfer.policy")

local function remaining_output(r) return -(r.max_tokens - r.num_generated) end -- sort_by is ascending

return {
  schedule = function(state)
    local queued = policy.sort_by(policy.concat(state.preempted, state.waiting), remaining_output)
    return policy.greedy(state, policy.concat(state.running, queued))
  end,
}
