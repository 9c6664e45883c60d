-- test_gen_data.lua — tools/grounded_tasks.lua and tools/gen_chat_data.lua
-- --tasks grounded (a draft's training chats whose answers draw on the
-- prompt):
--  * the three kinds in turn, each prompt holding its source (a paragraph
--    of --text, with typos when it asks for them; a JSON object; a function
--    of a file under --code);
--  * typos change about one word in eight, never the word count;
--  * the same seed gives the same prompts;
--  * sources with nothing usable, a missing file, bad flags: refused with the reason;
--  * gen_chat_data writes one conversation per prompt, and none holds a
--    bench prompt's text.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local H = require("harness")
local root = H.repo_root()
local gen = dofile(root .. "/tools/grounded_tasks.lua")

local dir = os.tmpname()
os.remove(dir)
assert(os.execute(("mkdir -p %q/code"):format(dir)))
local para = "The morning market opened before dawn, and the traders carried their baskets of apples, pears and " ..
             "fresh bread along the narrow streets. By noon the square was full of voices, music and the smell of " ..
             "roasting chestnuts, while children chased pigeons between the stalls."
local function write(path, s)
  local f = assert(io.open(path, "w"))
  f:write(s)
  f:close()
end
write(dir .. "/text.txt", "too short\n\n" .. para .. "\n\n<|im_start|>user\n" .. para .. "<|im_end|>\n\n" ..
      "Again. Again. " .. para .. "\n")
write(dir .. "/code/a.py", "import os\n\ndef area(width, height):\n    total = width * height\n" ..
      "    if total < 0:\n        raise ValueError(total)\n    return total\n\nx = 1\n\ndef tiny():\n    pass\n")
write(dir .. "/code/b.txt", "def ignored(a):\n    b = a\n    c = b\n    return c\n")

local function rng(seed)
  local s = seed
  return function(n) s = (s * 1103515245 + 12345) % 2147483648; return math.floor(s / 65536) % n + 1 end
end
local function failer(msg) error("fail: " .. msg, 0) end
local prompts = gen({ text = dir .. "/text.txt", code = dir .. "/code", n = 60, rand = rng(1), fail = failer })
H.check(#prompts == 60, "60 prompts asked, %d made", #prompts)
local typo_words, words, with_typos = 0, 0, 0
for j, p in ipairs(prompts) do
  local kind = j % 3
  if kind == 1 then
    -- a paragraph task: the one usable paragraph (the short one, the one in
    -- markup and the one with a sentence twice are skipped)
    local body = p:match("\n\n?(.-)\nPlease rewrite") or p:match(":\n\n?(.*)$")
    H.check(body and select(2, body:gsub("%S+", "")) == select(2, para:gsub("%S+", "")),
            "prompt %d: the paragraph, every word of it: %s", j, p:sub(1, 80))
    if body and body ~= para then
      with_typos = with_typos + 1
      local a, b = {}, {}
      for w in body:gmatch("%S+") do a[#a + 1] = w end
      for w in para:gmatch("%S+") do b[#b + 1] = w end
      for i = 1, #b do
        words = words + 1
        if a[i] ~= b[i] then typo_words = typo_words + 1 end
      end
    end
  elseif kind == 2 then
    H.check(p:find('"name": "', 1, true) and p:find('"city": "', 1, true) and p:find("{\n", 1, true),
            "prompt %d: a JSON object: %s", j, p:sub(1, 80))
  else
    H.check(p:find("def area(width, height):\n    total = width * height\n", 1, true) and p:find("```python\n", 1, true)
            and not p:find("tiny") and not p:find("ignored"),
            "prompt %d: the 5-line function of a.py, not the 2-line one nor the .txt file's: %s", j, p:sub(1, 80))
  end
end
H.check(with_typos >= 5, "typo prompts made (%d)", with_typos)
H.check(typo_words > 0 and typo_words / words > 0.03 and typo_words / words < 0.25,
        "typos in about one word in eight: %d of %d", typo_words, words)
local again = gen({ text = dir .. "/text.txt", code = dir .. "/code", n = 60, rand = rng(1), fail = failer })
H.check(table.concat(again, "\0") == table.concat(prompts, "\0"), "the same seed, the same prompts")
local other = gen({ text = dir .. "/text.txt", code = dir .. "/code", n = 60, rand = rng(2), fail = failer })
H.check(table.concat(other, "\0") ~= table.concat(prompts, "\0"), "another seed, other prompts")

local function refused(o, want)
  o.n, o.rand, o.fail = 3, rng(1), failer
  local ok, err = pcall(gen, o)
  H.check(not ok and tostring(err):find(want, 1, true), "refused (%s): %s", want, tostring(err))
end
refused({ text = dir .. "/missing.txt", code = dir .. "/code" }, "--text: cannot read")
write(dir .. "/short.txt", "one line\n\nanother\n")
refused({ text = dir .. "/short.txt", code = dir .. "/code" }, "--text: no paragraph")
refused({ text = dir .. "/text.txt", code = dir .. "/nothing" }, "--code: no Python function")

-- the command
local bin = H.luainfer_bin()
if not bin then
  print("SKIP: gen_chat_data's runs: cannot find the luainfer binary running this test (/proc/$PPID/exe)")
else
  local function run(flags) return H.run_tool(bin, root, "tools/gen_chat_data.lua", flags) end
  local out, rc = run(dir .. "/x.txt --tasks poems")
  H.check(rc == 2 and out:find("--tasks is chat or grounded", 1, true), "bad --tasks: %s", out)
  out, rc = run(dir .. "/x.txt --tasks grounded --text " .. dir .. "/text.txt")
  H.check(rc == 2 and out:find("needs --text FILE", 1, true), "grounded without --code: %s", out)
  out, rc = run(("%s/x.txt --tasks grounded --text %s/missing.txt --code %s/code"):format(dir, dir, dir))
  H.check(rc == 2 and out:find("--text: cannot read", 1, true), "a missing --text: %s", out)
  H.check(not io.open(dir .. "/x.txt") and not io.open(dir .. "/x.txt.tmp"), "no output after a refusal")
  out, rc = run(("%s/x.txt --tasks grounded --text %s/text.txt --code %s/code --prompts 3 --max-tokens 8 --batch 2")
                :format(dir, dir, dir))
  H.check(rc == 0, "gen_chat_data --tasks grounded runs: %s", out)
  local f = io.open(dir .. "/x.txt")
  local s = f and f:read("*a") or ""
  if f then f:close() end
  local _, users = s:gsub("<|im_start|>user\n", "")
  local _, answers = s:gsub("<|im_start|>assistant\n", "")
  H.check(users == 3 and answers == 3, "three conversations written (%d users, %d answers)", users, answers)
  H.check(s:find("def area(width, height)", 1, true) and s:find('"name": "', 1, true), "the code and JSON prompts in it")
  H.check(not io.open(dir .. "/x.txt.tmp"), "the temporary file renamed")
end
os.execute(("rm -rf %q"):format(dir))
H.finish("test_gen_data")
