-- Hits the memory limit inside a loop LuaJIT would compile, every step.
local policy = require("luainfer.policy")
local function fill() local t = {} for i = 1, 1e9 do t[i] = i end return t end
return { schedule = function(state) fill(); return policy.fcfs(state) end }
