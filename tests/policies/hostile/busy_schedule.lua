-- A loop without end in schedule (compiled by LuaJIT unless prevented).
return { schedule = function(state) while true do end end }
