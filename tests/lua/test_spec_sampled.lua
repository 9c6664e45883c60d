-- test_spec_sampled.lua — speculation at temperature > 0 on the real model:
-- drafts are verified by rejection sampling (spec/verify.c) with each
-- request's own seeded uniforms. (Losslessness itself is tested
-- statistically by tests/integration/test_spec_lossless.py.) Here:
--  * the same seeds give the same tokens, run after run, for layerskip,
--    a draft model (sampling its drafts, q) and n-gram drafts a request asks for;
--  * drafts are made and accepted at temperature 0.7;
--  * max_tokens, stop strings, min_tokens and penalties hold with speculation;
--  * every block comes back.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local H = require("harness")
local luainfer = require("luainfer")

local draft = H.draft_model("test_spec_sampled")

local prompts = {
  "Repeat this list exactly: apple, banana, cherry, dates, elderberry, fig, grape. Again: apple, banana,",
  "<|im_start|>user\nCopy this sentence: the quick brown fox jumps over the lazy dog.<|im_end|>\n<|im_start|>assistant\n",
  "Once upon a time, in a small village by the sea,",
  "one two three four five six seven eight nine ten one two three four five six seven",
}

local function run(cfg, spec)
  local e = luainfer.engine(cfg)
  local ids = {}
  for i, p in ipairs(prompts) do
    ids[i] = e:add{ prompt = p, max_tokens = 16 + 6 * i, temperature = 0.7, seed = 100 + i, top_k = 0, top_p = 1,
                    min_p = 0, stop = (i == 3) and "," or nil, min_tokens = (i == 4) and 8 or nil,
                    repetition_penalty = (i == 2) and 1.3 or nil, ignore_eos = (i == 1), speculation = spec }
  end
  e:run()
  local out = {}
  for i = 1, #prompts do out[i] = e:result(ids[i]) end
  local s = e:stats()
  H.check(s.kv_free_blocks == s.kv_total_blocks, "every block returned (%d/%d)", s.kv_free_blocks, s.kv_total_blocks)
  e:close()
  for i, r in ipairs(out) do
    H.check(r.finished and #r.tokens <= 16 + 6 * i, "request %d finished within max_tokens (%d)", i, #r.tokens)
    if i == 1 then H.check(r.finish_reason == "length" and #r.tokens == 22, "ignore_eos: max_tokens reached (%d)", #r.tokens) end
    if i == 3 then
      H.check(not r.text:find(",", 1, true), "the stop string is not in the text: %q", r.text)
    end
    if i == 4 then H.check(#r.tokens >= 8, "min_tokens held (%d)", #r.tokens) end
  end
  return out, s
end

local function same(a, b, label)
  local n = 0
  for i = 1, #b do
    if H.eq_list(a[i].tokens, b[i].tokens) and a[i].text == b[i].text then n = n + 1
    else H.check(false, "%s: request %d not reproduced (%d vs %d tokens)", label, i, #a[i].tokens, #b[i].tokens) end
  end
  print(("%s: %d/%d reproduced"):format(label, n, #b))
end

local function spec_ok(s, method, label)
  local m = s.spec_by[method]
  print(("%s: %s drafted %d, accepted %d"):format(label, method, m.drafted, m.accepted))
  H.check(m.drafted > 0 and m.accepted > 0, "%s: %s drafted (%d) and accepted (%d) at temperature 0.7", label, method,
          m.drafted, m.accepted)
end

local cases = {
  { "layerskip 29, k=4", { max_num_seqs = 4, spec_layers = 29, spec_tokens = 4 }, nil, "layerskip" },
  { "draft k=3", { max_num_seqs = 4, draft_model = draft, spec_tokens = 3 }, nil, "draft" },
  { "ngram asked, k=4", { max_num_seqs = 4 }, { method = "ngram", k = 4 }, "ngram" },
}
for _, c in ipairs(cases) do
  local a, sa = run(c[2], c[3])
  local b = run(c[2], c[3])
  same(a, b, c[1])
  spec_ok(sa, c[4], c[1])
end
-- the engine's n-gram default drafts greedy requests only
local _, s0 = run({ max_num_seqs = 4, spec_tokens = 4 })
H.check(s0.spec_drafted == 0, "default n-gram: no drafts at temperature > 0 (%d)", s0.spec_drafted)

H.finish("test_spec_sampled")
