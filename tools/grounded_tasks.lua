-- grounded_tasks.lua — prompts whose answers draw on the prompt, for
-- tools/gen_chat_data.lua --tasks grounded (see there). Returns a function
-- of { text = FILE, code = DIR, n = N, rand = f(m) -> 1..m, fail = f(msg) }
-- giving N prompts (or as many as the sources allow) in the order rand
-- makes: the kinds in turn (a paragraph, a JSON object, code), each from
-- its own templates.

-- paragraphs of FILE: blank-line separated, 200-900 bytes, none holding chat markup
-- or a sentence twice,
-- line breaks inside a paragraph joined
local function paragraphs(path, fail)
  local f = io.open(path, "rb")
  if not f then fail("--text: cannot read " .. path) end
  local s = f:read("*a")
  f:close()
  local out = {}
  for para in (s:gsub("\r", "") .. "\n\n"):gmatch("(.-)\n%s*\n") do
    para = para:gsub("%s*\n%s*", " "):gsub("^%s+", ""):gsub("%s+$", "")
    -- a model's own paragraphs loop at times: none with a sentence twice
    local seen, again = {}, false
    for sentence in para:gmatch("%s*([^%.!?]+)") do
      if seen[sentence] then again = true end
      seen[sentence] = true
    end
    if #para >= 200 and #para <= 900 and not again and not para:find("<|", 1, true) and not para:find("[%c]") then
      out[#out + 1] = para
    end
  end
  if #out == 0 then fail("--text: no paragraph of 200-900 bytes in " .. path) end
  return out
end

-- top-level functions of the *.py files under DIR: one or two adjacent
-- defs of 4-20 lines each, no tabs
local function functions(dir, fail)
  local ls = io.popen("find '" .. dir:gsub("'", "'\\''") .. "' -name '*.py' -type f 2>/dev/null | sort")
  local files = {}
  for line in ls:lines() do files[#files + 1] = line end
  ls:close()
  local out = {}
  for _, path in ipairs(files) do
    local f = io.open(path, "rb")
    local s = f and f:read("*a") or ""
    if f then f:close() end
    local defs, cur = {}, nil
    for line in (s .. "\n"):gmatch("(.-)\n") do
      if line:match("^def ") then
        if cur then defs[#defs + 1] = cur end
        cur = { line }
      elseif cur and (line == "" or line:match("^%s")) then
        cur[#cur + 1] = line
      else
        if cur then defs[#defs + 1] = cur end
        cur = nil
      end
    end
    if cur then defs[#defs + 1] = cur end
    local ok = {}
    for _, d in ipairs(defs) do
      while #d > 0 and d[#d] == "" do d[#d] = nil end
      local body = table.concat(d, "\n") .. "\n"
      if #d >= 4 and #d <= 20 and not body:find("\t") and not body:find("[\128-\255]") then ok[#ok + 1] = body end
    end
    for j = 1, #ok, 2 do out[#out + 1] = ok[j + 1] and (ok[j] .. "\n" .. ok[j + 1]) or ok[j] end
  end
  if #out == 0 then fail("--code: no Python function of 4-20 lines under " .. dir) end
  return out
end

-- a typo in about one word of eight (a letter dropped, doubled, or two
-- swapped), words of four letters or more only
local function typos(p, rand)
  return (p:gsub("%a%a%a%a+", function(w)
    if rand(8) ~= 1 then return w end
    local i, kind = rand(#w - 2) + 1, rand(3)
    if kind == 1 then return w:sub(1, i - 1) .. w:sub(i + 1) end
    if kind == 2 then return w:sub(1, i) .. w:sub(i) end
    return w:sub(1, i - 1) .. w:sub(i + 1, i + 1) .. w:sub(i, i) .. w:sub(i + 2)
  end))
end

local FIRST = { "Maria", "John", "Wei", "Fatima", "Lars", "Aiko", "Carlos", "Priya", "Tom", "Olga", "Kwame", "Sofia" }
local LAST = { "Garcia", "Smith", "Chen", "Khan", "Berg", "Tanaka", "Silva", "Patel", "Brown", "Ivanova", "Mensah" }
local CITY = { "Berlin", "Tokyo", "Lagos", "Lima", "Oslo", "Cairo", "Toronto", "Madrid", "Seoul", "Nairobi", "Rome" }
local WORDS = { "music", "physics", "chess", "cooking", "history", "painting", "biology", "sailing", "poetry", "law" }
local KEYS = { "email", "phone", "team", "role", "country", "status", "level", "language", "score", "active" }

local function quote(s) return '"' .. s .. '"' end

-- a made-up object: name, age or year, city, a list, some of KEYS
local function json_object(rand)
  local f = {}
  f[#f + 1] = { "name", quote(FIRST[rand(#FIRST)] .. " " .. LAST[rand(#LAST)]) }
  f[#f + 1] = rand(2) == 1 and { "age", tostring(17 + rand(60)) } or { "joined", tostring(1990 + rand(34)) }
  f[#f + 1] = { "city", quote(CITY[rand(#CITY)]) }
  f[#f + 1] = { "interests", "[" .. quote(WORDS[rand(#WORDS)]) .. ", " .. quote(WORDS[rand(#WORDS)]) .. "]" }
  local used = {}
  for _ = 1, rand(3) - 1 do
    local k = KEYS[rand(#KEYS)]
    if not used[k] then
      used[k] = true
      f[#f + 1] = { k, k == "score" and tostring(rand(100)) or k == "active" and (rand(2) == 1 and "true" or "false")
                    or quote(WORDS[rand(#WORDS)]) }
    end
  end
  return f
end

local function json_text(f)
  local lines = {}
  for j, kv in ipairs(f) do lines[j] = "  " .. quote(kv[1]) .. ": " .. kv[2] .. (j < #f and "," or "") end
  return "{\n" .. table.concat(lines, "\n") .. "\n}"
end

local TEXT = {
  function(p, r) return "Fix the spelling mistakes in this paragraph and write it out again:\n" .. typos(p, r) end,
  function(p, r) return "Correct the typos in the following text:\n\n" .. typos(p, r) end,
  function(p, r) return "Proofread this passage and return the corrected version:\n" .. typos(p, r) end,
  function(p, r) return "Here is a paragraph with some spelling errors:\n" .. typos(p, r) ..
                        "\nPlease rewrite it with the errors fixed." end,
  function(p) return "Repeat this paragraph word for word:\n" .. p end,
  function(p) return "Rewrite the following text in the present tense:\n" .. p end,
  function(p) return "Make this paragraph more formal:\n" .. p end,
  function(p) return "Summarize this paragraph in two sentences:\n" .. p end,
}

local JSON = {
  function(f, r)
    local c = CITY[r(#CITY)]
    return "Change \"city\" to \"" .. c .. "\" in this JSON and print the whole document:\n" .. json_text(f) end,
  function(f, r)
    local kv = f[r(#f)]
    return "Update this JSON so that the \"" .. kv[1] .. "\" field is removed:\n" .. json_text(f) end,
  function(f, r)
    return "Add a field \"nickname\": \"" .. FIRST[r(#FIRST)] .. "y\" to this JSON object and output the result:\n" ..
           json_text(f) end,
  function(f) return "Convert this JSON to YAML:\n" .. json_text(f) end,
  function(f, r)
    return "Here is a record:\n" .. json_text(f) .. "\nReturn it with \"name\" set to \"" .. FIRST[r(#FIRST)] .. " " ..
           LAST[r(#LAST)] .. "\"." end,
}

local CODE = {
  function(c) return "Add type annotations to these Python functions:\n```python\n" .. c .. "```" end,
  function(c) return "Add a docstring to each function in this code:\n```python\n" .. c .. "```" end,
  function(c) return "Here is a Python function:\n```python\n" .. c .. "```\nRewrite it with a comment on each step." end,
  function(c) return "Explain what this code does:\n```python\n" .. c .. "```" end,
  function(c)
    local v = c:match("^def [%w_]+%(([%a_][%w_]*)")
    if not v or v == "self" then return "Add type annotations to these Python functions:\n```python\n" .. c .. "```" end
    return "Rename the parameter `" .. v .. "` to `value` in this code:\n```python\n" .. c .. "```" end,
}

return function(o)
  local paras, funcs = paragraphs(o.text, o.fail), functions(o.code, o.fail)
  local out = {}
  for j = 1, o.n do
    local kind = j % 3
    if kind == 1 then
      out[j] = TEXT[o.rand(#TEXT)](paras[o.rand(#paras)], o.rand)
    elseif kind == 2 then
      out[j] = JSON[o.rand(#JSON)](json_object(o.rand), o.rand)
    else
      out[j] = CODE[o.rand(#CODE)](funcs[o.rand(#funcs)], o.rand)
    end
  end
  return out
end
