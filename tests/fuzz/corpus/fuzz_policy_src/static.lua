-- static.lua — static batching, the baseline the benchmarks compare against.
--
-- A batch of up to max_num_seqs requests (preempted first, then waiting, in
-- arrival order) is formed only when the previous batch has completely
-- finished; nothing joins a batch while it runs. Within the batch, requests
-- get chunked prefill and decode like FCFS (a member short of KV blocks may
-- preempt a later member; it stays in the batch and recomputes).
--
-- The batch lives in a module local: policies keep state across steps.

local policy = require("luainfer.policy")

local batch = {}      -- id -> true for members of the current batch

return {
  schedule = function(state)
    -- members that finished are gone from state.requests
    local live = {}
    local n = 0
    for _, r in ipairs(state.requests) do
      if batch[r.id] then
        n = n + 1
        live[r.id] = true
      end
    end
    batch = live
    if n == 0 then
      -- a new batch; running requests we did not choose (e.g. after a hot
      -- reload) belong to it first
      for _, r in ipairs(policy.concat(state.running, state.preempted, state.waiting)) do
        if n >= state.budget.max_num_seqs then break end
        batch[r.id] = true
        n = n + 1
      end
    end
    local order = {}
    for _, list in ipairs({ state.running, state.preempted, state.waiting }) do
      for _, r in ipairs(list) do
        if batch[r.id] then order[#order + 1] = r end
      end
    end
    return policy.greedy(state, order)
  end,
}
