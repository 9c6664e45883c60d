-- priority.lua — higher priority first, with preemption.
--
-- Every request (running, preempted, waiting) is ranked by priority (larger
-- first), then arrival. Walking that ranking, each request gets its next
-- tokens (chunked prefill) while the budgets and free KV blocks last. When
-- blocks are short, a request preempts running requests ranked below it,
-- lowest first: a queued request only preempts strictly lower priorities, a
-- running one also later arrivals of its own priority. A queued request that
-- still does not fit stops admission for this step, so a large important
-- request is not starved by small unimportant ones.

local policy = require("luainfer.policy")

local function rank(state)
  local all = policy.concat(state.running, state.preempted, state.waiting)
  table.sort(all, function(a, b)
    if a.priority ~= b.priority then return a.priority > b.priority end
    if a.arrival ~= b.arrival then return a.arrival < b.arrival end
    return a.id < b.id
  end)
  return all
end

local function may_preempt(req, victim)
  if victim.priority < req.priority then return true end
  return req.state == "running" and victim.priority == req.priority
end

return {
  schedule = function(state)
    return policy.greedy(state, rank(state), { may_preempt = may_preempt })
  end,
}
