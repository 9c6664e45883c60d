return { schedule = function(state) return { run = { { id = 0/0, tokens = 1 }, { id = -1 } } } end }
