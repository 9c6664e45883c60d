-- luainfer.client — a msgpack-RPC client for `luainfer serve`, usable from
-- `luainfer run` scripts and the REPL (`luainfer repl --connect HOST:PORT`).
-- Sockets and msgpack come from the C module luainfer.net.
--
--   local client = require("luainfer.client")
--   local c = assert(client.connect("127.0.0.1:7700"))        -- or "unix:/path"
--   local r = assert(c:generate{ prompt = "Hello", max_tokens = 16, temperature = 0 })
--   print(r.text, r.finish_reason, r.usage.completion_tokens)
--   c:generate{ prompt = "Hi", stream = true,                  -- deltas as they come
--               on_delta = function(d) io.write(d.text) end }
--   print(c:stats().kv.blocks_used)
--   c:close()
--
-- Every call returns result, or nil and an error table {code, message}
-- (see docs/server.md for the codes). Calls are synchronous: one at a time
-- per client object; notifications that arrive meanwhile are handed to the
-- call's on_delta (generate) or to c.on_notification(method, params).

local function load_net()
  local ok, net = pcall(require, "luainfer.net")
  if ok then return net end
  -- a binary that did not preload it may still export it (luainfer does)
  local open = package.loadlib("", "luaopen_luainfer_net")
  if not open then error(net, 0) end
  net = open()
  package.loaded["luainfer.net"] = net
  return net
end
local net = load_net()

local M = { net = net }
local Client = {}
Client.__index = Client

local function errtab(message, code)
  return setmetatable({ code = code or -1, message = message },
    { __tostring = function(e) return ("%s (code %s)"):format(e.message, tostring(e.code)) end })
end

-- connect(addr, opts) → client | nil, err. opts: timeout (seconds per call,
-- default none), connect_timeout (default 10), auth_token.
function M.connect(addr, opts)
  opts = opts or {}
  addr = addr or "127.0.0.1:7700"
  local sock, err = net.connect(addr, opts.connect_timeout or 10)
  if not sock then return nil, errtab(err) end
  local c = setmetatable({ sock = sock, addr = addr, buf = "", pos = 1, next_id = 0,
                           timeout = opts.timeout or -1 }, Client)
  if opts.auth_token then
    local _, e = c:call("auth", { token = opts.auth_token })
    if e then c:close(); return nil, e end
  end
  return c
end

-- Reads the next whole message from the socket.
function Client:_read()
  while true do
    if self.pos <= #self.buf then
      local ok, msg, nextpos = pcall(net.unpack, self.buf, self.pos)
      if not ok then return nil, errtab("malformed reply: " .. tostring(msg)) end
      if nextpos then
        self.pos = nextpos
        if self.pos > 65536 then self.buf = self.buf:sub(self.pos); self.pos = 1 end
        return msg
      end
    end
    local data, err = self.sock:recv(65536, self.timeout)
    if not data then return nil, errtab("connection " .. err) end
    if self.pos > #self.buf then self.buf, self.pos = data, 1 else self.buf = self.buf .. data end
  end
end

-- request(method, params, on_note) → result | nil, err. on_note(method,
-- params, id) receives notifications that arrive before the response (id:
-- this request's msgid). If waiting is cut short by an error (an error in
-- on_note, or Ctrl-C in the REPL), the request is cancelled on the server
-- before the error goes on, so it does not keep generating for nobody.
function Client:request(method, params, on_note)
  if not self.sock then return nil, errtab("client is closed") end
  local id = self.next_id
  self.next_id = (id + 1) % 4294967296
  local frame = net.pack(net.array{ 0, id, method, params or net.map{} })
  local ok, err = self.sock:send(frame)
  if not ok then
    -- a frame cut short would garble every later one: this connection is done
    self:close()
    return nil, errtab("send: " .. err)
  end
  local function wait()
    while true do
      local msg, rerr = self:_read()
      if not msg then return nil, rerr end
      if msg[1] == 1 and msg[2] == id then
        if msg[3] ~= nil then
          local e = msg[3]
          if type(e) ~= "table" then e = { message = tostring(e) } end
          return nil, errtab(e.message or "error", e.code)
        end
        return msg[4]
      elseif msg[1] == 2 then
        if on_note then on_note(msg[2], msg[3], id)
        elseif self.on_notification then self.on_notification(msg[2], msg[3]) end
        if msg[2] == "error" and type(msg[3]) == "table" then
          -- the server reports a fatal protocol error and closes
          return nil, errtab(msg[3].message or "error", msg[3].code)
        end
      end
    end
  end
  local res = { pcall(wait) }
  if not res[1] then
    if self.sock then pcall(self.notify, self, "cancel", { request_id = id }) end
    error(res[2], 0)
  end
  return res[2], res[3]
end

Client.call = Client.request

-- Sends a notification (no response).
function Client:notify(method, params)
  return self.sock:send(net.pack(net.array{ 2, method, params or net.map{} }))
end

-- generate{prompt | messages | tokens, max_tokens, temperature, ..., on_delta}
-- → {text, tokens, finish_reason, usage, timings, id} (choices for n > 1).
-- With on_delta, stream = true and on_delta({id, request_id, index, text, tokens}) runs per token.
function Client:generate(opts)
  if type(opts) == "string" then opts = { prompt = opts } end
  local params, on_delta = {}, nil
  for k, v in pairs(opts or {}) do
    if k == "on_delta" then on_delta = v else params[k] = v end
  end
  if on_delta then params.stream = true end
  if params.tokens then params.tokens = net.array(params.tokens) end
  return self:request("generate", params, function(method, p, id)
    -- deltas of an earlier, abandoned generate may still be in flight
    if method == "generate.delta" and on_delta and p.request_id == id then on_delta(p) end
  end)
end

function Client:tokenize(text, special)
  local r, e = self:request("tokenize", { text = text, special = special })
  if not r then return nil, e end
  return r.tokens
end

function Client:detokenize(tokens, special)
  local r, e = self:request("detokenize", { tokens = net.array(tokens), special = special })
  if not r then return nil, e end
  return r.text
end

function Client:cancel(id) return self:request("cancel", { id = id }) end
function Client:stats() return self:request("stats") end
function Client:health() return self:request("health") end
function Client:models() return self:request("models") end
function Client:methods() return self:request("methods") end

-- reload_policy{path = ... | source = ..., admin_token = ...}
function Client:reload_policy(p) return self:request("policy.reload", p) end
function Client:shutdown(admin_token) return self:request("shutdown", { admin_token = admin_token }) end

function Client:close()
  if self.sock then self.sock:close(); self.sock = nil end
end

return M
