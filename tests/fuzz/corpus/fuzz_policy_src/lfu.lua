-- lfu.lua — FCFS scheduling with least-frequently-used prefix-cache
-- eviction (the engine's own default is LRU).
--
-- evict(candidates, need) gets the idle cached blocks (block, hits since
-- the block was filled, last_access time, depth in its sequence) and returns
-- them most-evictable first. The engine evicts in that order, never touches
-- blocks in use, and completes a short answer in LRU order.
--
-- Order: fewest hits first; among equals the least recently used; among
-- those the deepest block first (a chain's tail goes before its root, so
-- shared roots survive longest).

local policy = require("luainfer.policy")

local function lfu_less(a, b)
  if a.hits ~= b.hits then return a.hits < b.hits end
  if a.last_access ~= b.last_access then return a.last_access < b.last_access end
  return a.depth > b.depth
end

return {
  schedule = function(state) return policy.fcfs(state) end,

  evict = function(candidates, need)
    table.sort(candidates, lfu_less)
    local out = {}
    for i = 1, math.min(#candidates, math.max(need, 1)) do out[i] = candidates[i].block end
    return out
  end,
}
