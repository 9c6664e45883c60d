-- Fails every step: the engine falls back; the log must not flood.
return { schedule = function(state) error(("a long message "):rep(20)) end }
