-- sjf.lua — shortest job first.
--
-- A job's size is the prompt it still has to prefill plus the tokens it may
-- still generate (prompt_len - num_computed + max_tokens - num_generated).
-- Running requests are served shortest first, so when KV blocks run out the
-- longest running job is the one preempted. Queued requests (preempted and
-- waiting together) are admitted shortest first; they never preempt a
-- running request (non-preemptive SJF: what runs, finishes).

local policy = require("luainfer.policy")

return {
  schedule = function(state)
    local size = policy.job_size
    local running = policy.sort_by(policy.concat(state.running), size)
    local queued = policy.sort_by(policy.concat(state.preempted, state.waiting), size)
    return policy.greedy(state, policy.concat(running, queued))
  end,
}
