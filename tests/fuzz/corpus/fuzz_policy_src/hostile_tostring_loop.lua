-- __tostring that calls tostring on itself.
local policy = require("luainfer.policy")
local x = setmetatable({}, {__tostring = function(x) return tostring(x) end})
return { schedule = function(state) tostring(x); return policy.fcfs(state) end }
