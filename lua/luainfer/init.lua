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
  ngram_draft = core.ngram_draft,
  default_model = core.default_model,
  chat = require("luainfer.chat"),
}

-- Adds one request, runs the engine until it finishes, returns text and the
-- full result table (the first sample's when n > 1). Every sample is
-- released, and an error or Ctrl-C while stepping cancels them first, so
-- nothing is left running or held.
function M.generate(engine, prompt, opts)
  local req = {}
  for k, v in pairs(opts or {}) do req[k] = v end
  if type(prompt) == "table" then req.tokens = prompt else req.prompt = prompt end
  local id = engine:add(req)
  local n = tonumber(req.n) or 1 -- samples take ids id .. id + n - 1
  local ok, r = pcall(function()
    while true do
      local r = engine:result(id)
      if r.finished then return r end
      engine:step()
    end
  end)
  for k = id, id + n - 1 do
    if not ok then pcall(engine.cancel, engine, k) end
    pcall(engine.release, engine, k)
  end
  if not ok then error(r, 0) end
  return r.text, r
end

return M
