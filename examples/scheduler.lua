-- scheduler.lua — a custom scheduler in 20 lines: running requests keep
-- their place (no thrash), and the queue is served shortest prompt first
-- with aging, so short chat turns jump ahead of a long document yet nothing
-- waits forever. Try it:
--   ./build/luainfer run examples/batch.lua examples/scheduler.lua
--   ./build/luainfer serve examples/scheduler.lua
--   python examples/hot_reload.py examples/scheduler.lua   (into a live server)
local policy = require("luainfer.policy")

local AGING = 0.5 -- seconds of waiting that count as much as 100 prompt tokens

local function score(now)
  return function(r) -- smaller is served first
    return (r.prompt_len - r.num_computed) / 100 - (now - r.arrival) / AGING
  end
end

return {
  schedule = function(state)
    local queued = policy.sort_by(policy.concat(state.preempted, state.waiting), score(state.now))
    return policy.greedy(state, policy.concat(state.running, queued))
  end,
}
