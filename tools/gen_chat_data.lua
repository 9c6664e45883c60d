-- gen_chat_data.lua — a model's own answers to many chat prompts, as a text
-- file to train a draft on (luainfer train-eagle --data FILE; EAGLE trains
-- on the target's regenerated answers, docs/eagle.md).
--
--   ./build/luainfer run tools/gen_chat_data.lua OUT.txt [--prompts N] [--max-tokens N]
--       [--temperature T] [--seed S] [--batch B] [--offset K]
--       [--tasks chat|grounded --text FILE --code DIR]
--
-- --tasks chat (the default): templates ("Write a short story about %s.",
-- "Explain %s in simple terms.", ...) crossed with topics, taken in a
-- seeded order from --offset on (so several runs add up without
-- repeating). --tasks grounded: tasks whose answer draws on the prompt,
-- as in the chats a served model gets (EAGLE's ShareGPT has them; a draft
-- trained on stories alone drafts none of a copy): correcting typos put
-- into a paragraph of --text (blank-line separated; chat markup and
-- paragraphs under 200 or over 900 bytes skipped), rewording or repeating
-- one; editing a JSON object made up from the seed (a value changed, a
-- field added or removed, YAML); annotating, documenting or renaming in
-- one or two functions of the *.py files under --code
-- (tools/grounded_tasks.lua). None of them is a prompt of
-- bench/bench_spec.lua nor holds its texts (held out: a draft is measured
-- on those; the `held` list below). Each conversation is written in the
-- model's chat format (its chat template through luainfer.chat, the
-- special tokens as text: `train-eagle --data` tokenizes them back), one
-- after another. The file is written to OUT.txt.tmp and renamed at the
-- end; progress goes to stderr.
local luainfer = require("luainfer")
local bench = require("luainfer.bench")

local out = arg[1]
if not out or out:sub(1, 2) == "--" then
  io.stderr:write("usage: luainfer run tools/gen_chat_data.lua OUT.txt [--prompts N] [--max-tokens N] " ..
                  "[--temperature T] [--seed S] [--batch B] [--offset K] [--tasks chat|grounded --text FILE --code DIR]\n")
  os.exit(2)
end
local opt = { prompts = 800, ["max-tokens"] = 320, temperature = 0, seed = 1, batch = 32, offset = 0 }
local sopt = { tasks = "chat", text = false, code = false } -- the options that take a string
local i = 2
while i <= #arg do
  local k = arg[i]:match("^%-%-(.+)$")
  local v = tonumber(arg[i + 1] or "")
  if k and sopt[k] ~= nil and arg[i + 1] then
    sopt[k] = arg[i + 1]
  elseif not k or opt[k] == nil or not v then
    io.stderr:write(("gen_chat_data: unknown option or bad value: %s %s\n"):format(arg[i], arg[i + 1] or ""))
    os.exit(2)
  else
    opt[k] = v
  end
  i = i + 2
end
if sopt.tasks ~= "chat" and sopt.tasks ~= "grounded" then
  io.stderr:write("gen_chat_data: --tasks is chat or grounded, got " .. sopt.tasks .. "\n")
  os.exit(2)
end
if sopt.tasks == "grounded" and (not sopt.text or not sopt.code) then
  io.stderr:write("gen_chat_data: --tasks grounded needs --text FILE (paragraphs) and --code DIR (*.py files)\n")
  os.exit(2)
end
if opt.prompts < 1 or opt["max-tokens"] < 1 or opt.batch < 1 or opt.temperature < 0 or opt.offset < 0 then
  io.stderr:write("gen_chat_data: --prompts, --max-tokens and --batch must be >= 1, --temperature and --offset >= 0\n")
  os.exit(2)
end

local topics = {
  "a dragon who is afraid of fire", "a robot learning to paint", "a lost cat in a big city", "an old clockmaker",
  "a girl who can talk to birds", "a village at the edge of a desert", "a pirate who hates the sea",
  "a magic library", "a boy who builds a rocket", "two friends on a mountain", "a baker who bakes at midnight",
  "a secret garden", "a detective solving a small mystery", "a farmer and a talking cow", "a king who lost his crown",
  "a wizard's apprentice", "a fox and a crow", "a train that never stops", "a snowman in summer",
  "an astronaut on Mars", "a shy ghost", "a musician in the rain", "a knight and a tiny dragon",
  "a teacher on her last day", "an island with no name", "a bear who loves honey", "a child's first day at school",
  "a storm over the ocean", "a letter from the future", "a forgotten toy", "a river that sings",
  "a city under the sea", "a broken violin", "a race between two snails", "a map to a hidden treasure",
  "a tree that grows stars", "a family moving to a new house", "a dog who waits every day",
  "a painter who lost her colors", "a bridge between two kingdoms", "a cook in a busy kitchen", "a rainy afternoon",
  "photosynthesis", "the water cycle", "how computers store data", "the solar system", "volcanoes",
  "the immune system", "how airplanes fly", "climate change", "the history of the internet", "how to make bread",
  "the French revolution", "black holes", "how vaccines work", "the Roman empire", "electric cars", "recycling",
  "the human heart", "earthquakes", "machine learning", "honey bees", "the moon landing", "ocean tides",
  "the stock market", "healthy sleep", "learning to play guitar", "time management", "saving money",
  "public speaking", "gardening", "writing a good essay", "staying focused while studying", "making new friends",
  "cooking pasta", "running a marathon", "the life of a butterfly", "how a bicycle works", "the Great Wall of China",
  "penguins", "how bridges are built", "the internet of things", "ancient Egypt", "how rain forms",
}
local templates = {
  "Write a short story about %s.", "Tell me a story about %s.", "Write a poem about %s.",
  "Explain %s in simple terms.", "Write a few paragraphs about %s.", "Describe %s to a child.",
  "Give me some interesting facts about %s.", "Write a short essay about %s.", "What should I know about %s?",
  "Write a blog post about %s.",
}
local rng = opt.seed
local function rand(n) rng = (rng * 1103515245 + 12345) % 2147483648; return rng % n + 1 end
local pairs_ = {}
if sopt.tasks == "chat" then
  -- every (template, topic) pair in a seeded order
  for _, t in ipairs(topics) do for _, tp in ipairs(templates) do pairs_[#pairs_ + 1] = tp:format(t) end end
  for j = #pairs_, 2, -1 do local r = rand(j); pairs_[j], pairs_[r] = pairs_[r], pairs_[j] end
else
  -- the same generator's high bits (its low bits repeat with a short period:
  -- the chat order above keeps them, so that its files stay the same)
  local function hrand(n) rng = (rng * 1103515245 + 12345) % 2147483648; return math.floor(rng / 65536) % n + 1 end
  pairs_ = dofile((arg[0]:match("^(.*)/[^/]+$") or ".") .. "/grounded_tasks.lua")({
    text = sopt.text, code = sopt.code, n = opt.offset + opt.prompts * 2, rand = hrand, fail = function(msg)
      io.stderr:write("gen_chat_data: " .. msg .. "\n")
      os.exit(2)
    end })
end
-- held out: the prompts bench/bench_spec.lua measures on, their texts and
-- their instructions' wording
local held = { "lighthouse", "message in a bottle", "Rewrite this paragraph", "type hints", "rivr", "Ada Lovelace",
               "parse_header", "Output the same JSON object", "Here is a JSON object", "Here is some Python code",
               "fixing only the spelling" }
local prompts = {}
for j = opt.offset + 1, #pairs_ do
  local p, ok = pairs_[j], true
  for _, h in ipairs(held) do if p:find(h, 1, true) then ok = false end end
  if ok then prompts[#prompts + 1] = p end
  if #prompts == opt.prompts then break end
end
if #prompts < opt.prompts then
  io.stderr:write(("gen_chat_data: only %d prompts from offset %d (of %d)\n"):format(#prompts, opt.offset, #pairs_))
end

local e = luainfer.engine{ max_num_seqs = opt.batch }
local chat = require("luainfer.chat")
local template = e:info().chat_template
local tmp = out .. ".tmp"
local f = assert(io.open(tmp, "w"))
local ids, texts, done, n_done, n_tok = {}, {}, {}, 0, 0
local next_p = 1
local function add_more()
  while next_p <= #prompts and (next_p - n_done) <= opt.batch do
    local text = chat.format(template, { { role = "user", content = prompts[next_p] } },
                             { add_generation_prompt = true })
    texts[next_p] = text
    ids[next_p] = e:add{ prompt = text, max_tokens = opt["max-tokens"], temperature = opt.temperature,
                         seed = opt.seed * 100003 + next_p }
    next_p = next_p + 1
  end
end
add_more()
local progress = bench.progress(#prompts, "gen_chat_data")
while e:has_work() do
  e:step()
  for j = 1, next_p - 1 do
    if not done[j] then
      local r = e:result(ids[j])
      if r and r.finished then
        done[j] = true
        n_done = n_done + 1
        n_tok = n_tok + #r.tokens
        -- the answer closed the way the template closes a turn
        f:write(texts[j], r.text, r.finish_reason == "stop" and "<|im_end|>\n" or "\n")
        e:release(ids[j])
        progress:step()
      end
    end
  end
  add_more()
end
progress:done()
f:close()
assert(os.rename(tmp, out))
io.stderr:write(("gen_chat_data: %d answers, %d tokens -> %s\n"):format(n_done, n_tok, out))
