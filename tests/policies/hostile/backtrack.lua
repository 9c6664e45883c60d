-- Exponential backtracking in C, where no instruction count reaches.
local policy = require("luainfer.policy")
return { schedule = function(state)
  string.find(("a"):rep(64), ("a*"):rep(32) .. "b")
  return policy.fcfs(state)
end }
