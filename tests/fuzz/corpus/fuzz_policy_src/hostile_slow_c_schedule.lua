-- Slow in C: each iteration is a few VM instructions and a 64 KiB
-- string.rep, so the host's deadline stops it long before the instruction
-- budget would (busy_schedule.lua can reach the budget first on a fast CPU).
return { schedule = function(state)
  for _ = 1, 1e6 do local _ = ("x"):rep(65536) end
end }
