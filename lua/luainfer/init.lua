-- luainfer — the Lua face of the engine, for `luainfer run`, the REPL and
-- tests. The C half (luainfer.core) provides engine objects; this file adds
-- conveniences written in Lua.
--
--   local luainfer = require("luainfer")
--   local e = luainfer.engine{ policy = "policies/default.lua" }
--   print(luainfer.generate(e, "The capital of France is", { max_tokens = 8, temperature = 0 }))

local core = require("luainfer.core")

local M = {
  engine = core.engine,
  default_model = core.default_model,
  chat = require("luainfer.chat"),
}

-- Adds one request, runs the engine until it finishes, returns text and the
-- full result table.
function M.generate(engine, prompt, opts)
  local req = {}
  for k, v in pairs(opts or {}) do req[k] = v end
  if type(prompt) == "table" then req.tokens = prompt else req.prompt = prompt end
  local id = engine:add(req)
  while true do
    local r = engine:result(id)
    if r.finished then
      engine:release(id)
      return r.text, r
    end
    engine:step()
  end
end

return M
