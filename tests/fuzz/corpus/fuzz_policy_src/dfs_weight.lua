-- dfs_weight.lua — prefix-tree-weighted order (SGLang's "dfs-weight"):
-- queued requests that share a prompt prefix run together, the most shared
-- prefix first, so its KV blocks are computed once and reused while cached.
--
-- Each step it builds the tree of the running and queued requests' prompt
-- prefixes: a node per full KV block, keyed by the block's chain hash
-- (req.prefix_hashes, as the prefix cache computes them: two nodes are the
-- same exactly when the cache would share the block). A node's weight is
-- the number of requests under it, running ones included (a group in
-- flight keeps going). A depth-first walk visits the heavier subtree first
-- (ties: a subtree whose blocks are cached, then the earliest arrival) and
-- lists a node's queued requests (prompt ending there) before its
-- subtrees: that is the admission order; running requests keep their place
-- ahead of it. The whole queue is walked every step: no FCFS fallback at
-- large queues. Without prefix caching all sit at the root: FCFS. It
-- decides only *when*: greedy outputs are default.lua's.

local policy = require("luainfer.policy")

local function node(seq) return { kids = {}, weight = 0, reqs = {}, seq = seq, hot = false } end
local function before(a, b)
  if a.weight ~= b.weight then return a.weight > b.weight end
  if a.hot ~= b.hot then return a.hot end
  return a.seq < b.seq
end

local function dfs_order(running, queued, bs)
  local root, seq, all = node(0), 0, policy.concat(running, queued)
  for i, r in ipairs(all) do -- running first, then arrival order: seq = first under a node
    local at = root
    at.weight = at.weight + 1
    for b, h in ipairs(r.prefix_hashes) do
      local k = at.kids[h]
      if not k then seq = seq + 1; k = node(seq); at.kids[h] = k end
      at = k
      at.weight = at.weight + 1
      at.hot = at.hot or b * bs <= r.cached_len
    end
    if i > #running then at.reqs[#at.reqs + 1] = r end
  end
  local out, stack = {}, { root } -- iterative DFS: prompts can be thousands of blocks deep
  while #stack > 0 do
    local n = table.remove(stack)
    for _, r in ipairs(n.reqs) do out[#out + 1] = r end
    local kids = {}
    for _, k in pairs(n.kids) do kids[#kids + 1] = k end
    table.sort(kids, before)
    for i = #kids, 1, -1 do stack[#stack + 1] = kids[i] end -- the first on top
  end
  return out
end

return {
  schedule = function(state)
    local queued = dfs_order(state.running, policy.concat(state.preempted, state.waiting), state.kv.block_size)
    return policy.greedy(state, policy.concat(state.running, queued), { skip_blocked = true })
  end,
}
