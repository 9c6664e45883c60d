-- luainfer.chat — chat templates, one function per family.
--
-- A model's GGUF carries a Jinja template (tokenizer.chat_template); rather
-- than embed a Jinja engine we recognise the family from its markers and
-- render it here, in plain Lua. Users add their own with chat.register().
--
--   local chat = require("luainfer.chat")
--   chat.format(template_string, {{role="user", content="hi"}}, {add_generation_prompt=true})

local M = {}

local families = {}   -- ordered list of {name, match(template), render(messages, opts)}

local function check_messages(messages)
  if type(messages) ~= "table" or #messages == 0 then
    error("chat: messages must be a non-empty list of {role=, content=}", 3)
  end
  for i, m in ipairs(messages) do
    if type(m) ~= "table" or type(m.role) ~= "string" or type(m.content) ~= "string" then
      error(("chat: message %d needs string fields 'role' and 'content'"):format(i), 3)
    end
  end
end

-- Registers a family; later registrations are tried first, so a user's
-- template can take over a shipped one.
function M.register(name, match, render)
  assert(type(name) == "string" and type(match) == "function" and type(render) == "function",
         "chat.register(name, match_fn, render_fn)")
  table.insert(families, 1, { name = name, match = match, render = render })
end

-- The default system prompt a template injects when the conversation has none
-- (SmolLM2's template does this), read out of the template's literal text.
local function default_system(template, open, close)
  if not template then return nil end
  local pat = open:gsub("%p", "%%%0") .. "system\n(.-)" .. close:gsub("%p", "%%%0")
  return template:match(pat)
end

-- ChatML: <|im_start|>role\ncontent<|im_end|>\n  (SmolLM2, Qwen, ...)
M.register("chatml",
  function(t) return t:find("<|im_start|>", 1, true) ~= nil end,
  function(messages, opts)
    local out = {}
    local sys = default_system(opts.template, "<|im_start|>", "<|im_end|>")
    if sys and messages[1].role ~= "system" then
      out[#out + 1] = "<|im_start|>system\n" .. sys .. "<|im_end|>\n"
    end
    for _, m in ipairs(messages) do
      out[#out + 1] = "<|im_start|>" .. m.role .. "\n" .. m.content .. "<|im_end|>\n"
    end
    if opts.add_generation_prompt then out[#out + 1] = "<|im_start|>assistant\n" end
    return table.concat(out)
  end)

-- Llama 3: <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
M.register("llama3",
  function(t) return t:find("<|start_header_id|>", 1, true) ~= nil end,
  function(messages, opts)
    local out = { opts.bos_text or "<|begin_of_text|>" }
    for _, m in ipairs(messages) do
      out[#out + 1] = "<|start_header_id|>" .. m.role .. "<|end_header_id|>\n\n" ..
                      (m.content:match("^%s*(.-)%s*$")) .. "<|eot_id|>"
    end
    if opts.add_generation_prompt then
      out[#out + 1] = "<|start_header_id|>assistant<|end_header_id|>\n\n"
    end
    return table.concat(out)
  end)

-- Llama 2: <s>[INST] <<SYS>>\nsys\n<</SYS>>\n\nuser [/INST] answer </s>
M.register("llama2",
  function(t) return t:find("[INST]", 1, true) ~= nil end,
  function(messages, opts)
    local out, sys = {}, nil
    local i = 1
    if messages[1].role == "system" then sys = messages[1].content; i = 2 end
    local first = true
    while i <= #messages do
      local m = messages[i]
      if m.role == "user" then
        local content = m.content
        if first and sys then content = "<<SYS>>\n" .. sys .. "\n<</SYS>>\n\n" .. content end
        out[#out + 1] = "<s>[INST] " .. content:match("^%s*(.-)%s*$") .. " [/INST]"
        first = false
      elseif m.role == "assistant" then
        out[#out + 1] = " " .. m.content:match("^%s*(.-)%s*$") .. " </s>"
      else
        error(("chat: llama2 template has no role '%s'"):format(m.role), 2)
      end
      i = i + 1
    end
    return table.concat(out)
  end)

-- Which family a template string belongs to, and whether one matched;
-- "chatml" (and false) when none does.
function M.detect(template)
  if type(template) == "string" then
    for _, f in ipairs(families) do
      if f.match(template) then return f.name, f, true end
    end
  end
  for _, f in ipairs(families) do
    if f.name == "chatml" then return f.name, f, false end
  end
end

-- Renders messages with the family the template belongs to (or opts.family).
-- Returns the text, the family's name and whether it was recognised (false:
-- a template of no known family, rendered as ChatML; callers warn).
function M.format(template, messages, opts)
  opts = opts or {}
  check_messages(messages)
  local family, recognised = nil, true
  if opts.family then
    for _, f in ipairs(families) do if f.name == opts.family then family = f end end
    if not family then error("chat: unknown template family '" .. tostring(opts.family) .. "'", 2) end
  else
    local _
    _, family, recognised = M.detect(template)
    recognised = recognised or type(template) ~= "string"
  end
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.template = template
  return family.render(messages, o), family.name, recognised
end

return M
