-- lpm.lua — longest prefix match first (cache-aware scheduling, as SGLang
-- offers it).
--
-- Running requests keep their place; queued requests are admitted in order
-- of how much of their prompt the prefix cache already holds (cached_len),
-- longest first, ties by arrival. Requests sharing a hot prefix run while
-- its blocks are cached, instead of interleaving with other prefixes that
-- would evict them. Fairness is traded for cache hits: a request whose
-- prefix is cold waits until no warmer one is queued.

local policy = require("luainfer.policy")

local function by_cached(req) return -req.cached_len end

return {
  schedule = function(state)
    local queued = policy.concat(state.preempted, state.waiting)
    policy.sort_by(queued, by_cached)
    -- a queued request that does not fit does not stop the others: a cold
    -- long prompt must not hold back warm short ones
    return policy.greedy(state, policy.concat(state.running, queued), { skip_blocked = true })
  end,
}
