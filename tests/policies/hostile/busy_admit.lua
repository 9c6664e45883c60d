-- A loop without end in admit.
local policy = require("luainfer.policy")
return { admit = function(req, state) local x = 0 while true do x = x + 1 end end,
         schedule = function(state) return policy.fcfs(state) end }
