-- A valid plan that makes no progress: preempt and run the same request.
return { schedule = function(state)
  local r = state.running[1] or state.waiting[1] or state.preempted[1]
  if not r then return {} end
  return { preempt = { r.id }, run = { { id = r.id, tokens = 1 } } }
end }
