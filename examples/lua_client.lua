-- lua_client.lua — a msgpack-RPC client in Lua (luainfer.client), run by
-- `luainfer run` against a live server:
--
--   ./build/luainfer serve &                        # msgpack-RPC on 127.0.0.1:7700
--   ./build/luainfer run examples/lua_client.lua [ADDR] ["PROMPT"]
--
-- One plain call, one streamed call (deltas printed as they arrive), then a
-- few of the server's counters.
local client = require("luainfer.client")

local addr = arg[1] or "127.0.0.1:7700"
local prompt = arg[2] or "The capital of France is"

-- one line per text: newlines shown as \n
local function show(text) return '"' .. text:gsub("\n", "\\n") .. '"' end

local c, err = client.connect(addr, { timeout = 60 })
if not c then
  io.stderr:write(("cannot connect to %s: %s\n"):format(addr, tostring(err)))
  os.exit(1)
end

local r = assert(c:generate{ prompt = prompt, max_tokens = 12, temperature = 0 })
print(("plain:    %s (%s, %d tokens)"):format(show(r.text), r.finish_reason, r.usage.completion_tokens))

io.write("streamed: ")
local s = assert(c:generate{
  prompt = "Once upon a time", max_tokens = 16, temperature = 0.7, seed = 1, stream = true,
  on_delta = function(d) io.write(d.text); io.flush() end,
})
print(("\n          (%s, %d tokens)"):format(s.finish_reason, s.usage.completion_tokens))

local st = assert(c:stats())
print(("server:   %d requests finished, %d tokens generated, KV %d of %d blocks in use"):format(
  st.engine.requests_finished, st.engine.tokens_generated, st.kv.blocks_used, st.kv.blocks_total))
c:close()
