local function f(n) if n == 0 then error({}) end return pcall(f, n - 1) end
return { schedule = function(state) f(10000); return {} end }
