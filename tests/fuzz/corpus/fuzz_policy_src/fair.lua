-- fair.lua — per-tenant fair share of the token budget.
--
-- Each step the token budget (max_batched_tokens) is split max-min fairly
-- across tenants with work: a tenant that needs less than an equal share
-- gets what it needs, the rest is shared equally among the others. Requests
-- are then served round-robin across tenants (each tenant's running, then
-- preempted, then waiting requests in arrival order; round k takes every
-- tenant's k-th request), the first tenant rotating every step. Chunked
-- prefill keeps a long prompt within its tenant's share.
--
-- When KV blocks run out, the victim is the last request in the round-robin
-- order: the newest request of the tenant with the most requests. A tenant
-- whose next queued request does not fit stops admitting this step; other
-- tenants go on.

local policy = require("luainfer.policy")

local function tenant_of(req) return req.tenant end

return {
  schedule = function(state)
    local queues, names = {}, {}
    for _, list in ipairs({ state.running, state.preempted, state.waiting }) do
      for _, r in ipairs(list) do
        local q = queues[r.tenant]
        if not q then
          q = {}
          queues[r.tenant] = q
          names[#names + 1] = r.tenant
        end
        q[#q + 1] = r
      end
    end
    local nt = #names
    if nt == 0 then return { run = {} } end
    table.sort(names)

    -- rotation: who goes first this step
    local rot, start = {}, state.step % nt
    for k = 1, nt do rot[k] = names[(start + k - 1) % nt + 1] end
    local pos = {}
    for k, t in ipairs(rot) do pos[t] = k end

    -- max-min fair shares of the token budget
    local budget = state.budget.max_batched_tokens
    local demand = {}
    for t, q in pairs(queues) do
      local d = 0
      for _, r in ipairs(q) do d = d + math.min(r.num_tokens - r.num_computed, budget) end
      demand[t] = d
    end
    local by_demand = policy.concat(rot)
    table.sort(by_demand, function(a, b)
      if demand[a] ~= demand[b] then return demand[a] < demand[b] end
      return pos[a] < pos[b]
    end)
    local share, left = {}, budget
    for k, t in ipairs(by_demand) do
      local a = math.min(demand[t], math.ceil(left / (nt - k + 1)))
      share[t] = a
      left = left - a
    end

    -- round-robin order across tenants
    local order, k, more = {}, 1, true
    while more do
      more = false
      for _, t in ipairs(rot) do
        local r = queues[t][k]
        if r then
          order[#order + 1] = r
          more = true
        end
      end
      k = k + 1
    end

    local used = {}
    return policy.greedy(state, order, {
      max_tokens = function(r) return share[r.tenant] - (used[r.tenant] or 0) end,
      on_run = function(r, n) used[r.tenant] = (used[r.tenant] or 0) + n end,
      queue_key = tenant_of,
    })
  end,
}
