-- A plan far longer than any batch: 10^6 run entries (one table, repeated).
local policy = require("luainfer.policy")
return { schedule = function(state)
  local p = policy.fcfs(state)
  local r = {}
  for i, e in ipairs(p.run or {}) do r[i] = e end
  local junk = { id = 2^40, tokens = 1 }
  for i = #r + 1, 1e6 do r[i] = junk end
  return { run = r, preempt = p.preempt }
end }
