return { schedule = function(state)
  local run = {}
  for i, r in ipairs(state.running) do run[i] = { r.id, 1 } end
  return { run = run, preempt = { state.requests[1] and state.requests[1].id } }
end }
