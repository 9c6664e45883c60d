-- Valid plans without progress: preempt whoever runs, run someone else 1 token.
return { schedule = function(state)
  local pre = {}
  for i, r in ipairs(state.running) do pre[i] = r.id end
  local r = state.preempted[1] or state.waiting[1]
  if not r then return { preempt = pre } end
  return { preempt = pre, run = { { id = r.id, tokens = 1 } } }
end }
