-- The s:gsub and __index variants of the C-stack recursion.
local policy = require("luainfer.policy")
local repl = setmetatable({}, {})
getmetatable(repl).__index = function(t, k) return ("x"):gsub("x", repl) end
local function g() return ("x"):gsub("x", g) end
return { schedule = function(state)
  pcall(g)
  local s = "x"
  s:gsub("x", repl)
  return policy.fcfs(state)
end }
