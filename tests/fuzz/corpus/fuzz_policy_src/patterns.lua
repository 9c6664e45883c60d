return { schedule = function(state)
  for _, r in ipairs(state.requests) do
    local a, b = r.tenant:match("^(%w*)-?(%d*)$")
    local s = (r.tenant .. "x"):rep(8):gsub("x", { x = "y" })
    local f = string.format("%s %d %q", tostring(r.id), r.prompt_len, r.tenant)
    string.find(f, "[%d]+", 1, true)
  end
  return {}
end }
