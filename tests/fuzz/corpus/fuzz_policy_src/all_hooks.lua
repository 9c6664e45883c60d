local policy = require("luainfer.policy")
local n = 0
return {
  config = { max_num_seqs = 8 },
  admit = function(req, state) return req.priority >= 0, "low priority" end,
  schedule = function(state) n = n + 1; return policy.fcfs(state) end,
  evict = function(cands, need)
    table.sort(cands, function(a, b) return a.hits < b.hits end)
    local out = {}
    for i, c in ipairs(cands) do out[i] = c.block end
    return out
  end,
  on_finish = function(req, stats) n = n + stats.num_generated end,
}
