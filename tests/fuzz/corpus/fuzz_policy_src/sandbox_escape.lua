local ok = {}
for _, name in ipairs({ "io", "os.execute", "debug", "load", "loadstring", "ffi", "jit", "package" }) do
  ok[name] = pcall(function() return _G[name] end)
end
return { schedule = function(state) return { run = { { id = 10, tokens = 1 } }, preempt = { 11 } } end }
