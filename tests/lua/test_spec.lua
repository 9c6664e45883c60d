-- test_spec.lua — n-gram speculation (spec_tokens > 0) on the real model:
-- drafts are verified in one forward pass, and since a position gets the
-- same logits in any batch, greedy output with speculation is exactly the
-- output without it:
--  * 32 concurrent requests (varied and repetitive prompts, stop strings,
--    ignore_eos, logprobs) give the same tokens, text, finish reasons and
--    logprobs as with speculation off;
--  * the same under a tiny KV budget (preemption) and a tiny step budget
--    (drafts verified in part);
--  * drafts were made and some accepted; sampled requests never draft;
--  * bad settings are errors, and so is speculation with --isa ggml.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local H = require("harness")
local luainfer = require("luainfer")

local words = { "The", "river", "ran", "past", "old", "mills", "and", "quiet", "farms", "while",
                "children", "counted", "boats", "under", "a", "grey", "sky", "of", "late", "autumn" }
local repetitive = {
  "Repeat this list exactly: apple, banana, cherry, dates, elderberry, fig, grape. Again: apple, banana,",
  "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
  "one two three four five six seven eight nine ten one two three four five six seven",
  "<|im_start|>user\nCopy this sentence: the quick brown fox jumps over the lazy dog.<|im_end|>\n<|im_start|>assistant\n",
}
local N = 32
local reqs = {}
for i = 1, N do
  local p
  if i % 4 == 0 then p = repetitive[(i / 4) % #repetitive + 1]
  else
    local t = {}
    for k = 1, 3 + (i * 7) % 40 do t[#t + 1] = words[(i * 3 + k * k) % #words + 1] end
    p = table.concat(t, " ")
  end
  reqs[i] = { prompt = p, max_tokens = 8 + (i * 7) % 40, temperature = 0, ignore_eos = (i % 3 == 0),
              stop = (i % 5 == 0) and "\n\n" or nil, logprobs = (i % 6 == 0) and 2 or nil }
end

local function run(cfg)
  local e = luainfer.engine(cfg)
  local ids = {}
  for i = 1, N do ids[i] = e:add(reqs[i]) end
  e:run()
  local out = {}
  for i = 1, N do out[i] = e:result(ids[i]) end
  local s = e:stats()
  H.check(s.kv_free_blocks == s.kv_total_blocks, "every block returned (%d/%d)", s.kv_free_blocks, s.kv_total_blocks)
  e:close()
  return out, s
end

local function same(a, b, label)
  local n = 0
  for i = 1, N do
    local ok = H.eq_list(a[i].tokens, b[i].tokens) and a[i].text == b[i].text and a[i].finish_reason == b[i].finish_reason
    if ok and a[i].logprobs then
      for j, ent in ipairs(a[i].logprobs) do
        local o = b[i].logprobs[j]
        ok = ok and o and o.token == ent.token and math.abs(o.logprob - ent.logprob) < 1e-6
      end
    end
    if ok then n = n + 1 else H.check(false, "%s: request %d differs (%d vs %d tokens)", label, i, #a[i].tokens, #b[i].tokens) end
  end
  print(("%s: %d/%d identical to speculation off"):format(label, n, N))
end

local base = run{ max_num_seqs = 32, max_batched_tokens = 512 }
-- spec_disable_batch = 0: drafts even with 32 running (the default, 4, skips them there)
local spec, s = run{ max_num_seqs = 32, max_batched_tokens = 512, spec_tokens = 4, spec_disable_batch = 0 }
same(spec, base, "spec 4")
print(("drafted %d, accepted %d (%.0f%%), steps %d"):format(s.spec_drafted, s.spec_accepted,
      100 * s.spec_accepted / math.max(s.spec_drafted, 1), s.steps))
H.check(s.spec_drafted > 0 and s.spec_accepted > 0 and s.spec_accepted <= s.spec_drafted,
        "drafts made (%d) and accepted (%d)", s.spec_drafted, s.spec_accepted)

local spec8 = run{ max_num_seqs = 32, max_batched_tokens = 512, spec_tokens = 8, spec_ngram_min = 1,
                   spec_disable_batch = 0 }
same(spec8, base, "spec 8, n-grams down to 1")

-- drafts verified in part: a step budget smaller than the batch's drafts
local part = run{ max_num_seqs = 32, max_batched_tokens = 24, spec_tokens = 6, spec_disable_batch = 0 }
same(part, base, "spec 6, 24 tokens per step")

-- preemption under a tiny KV budget
local ie = luainfer.engine{ max_num_seqs = 1 }
local info = ie:info()
ie:close()
local per_token = 2 * info.n_layer * 3 * 64 * 2
local tight, ts = run{ max_num_seqs = 32, kv_memory = per_token * 16 * 24, spec_tokens = 4, spec_disable_batch = 0 }
same(tight, base, "spec 4, tiny KV budget")
H.check(ts.preemptions > 0, "the tiny budget forced preemption (%d)", ts.preemptions)

-- Drafts are not cut at block boundaries: a request copying its prompt
-- drafts its full k every round (up to the room before max_tokens), taking
-- blocks past its next token's for the step, and gives back what rejected
-- drafts took: between steps it holds the blocks of its tokens, the last
-- one's (computed next step) at most.
local function rounds(e, id, k, max_tokens, each)
  local s0, P = e:stats(), nil
  while e:has_work() do
    local r0 = e:result(id)
    local g0 = r0 and #r0.tokens or 0
    e:step()
    local s, r = e:stats(), e:result(id)
    P = r.prompt_tokens
    local d = s.spec_drafted - s0.spec_drafted
    if d > 0 then each(P + g0, d, math.min(k, max_tokens - g0 - 1)) end
    if e:has_work() and e:result(id).finish_reason == nil then
      local T = P + #r.tokens
      local used, hi, lo = s.kv_total_blocks - s.kv_free_blocks, math.ceil(T / s.block_size), math.ceil((T - 1) / s.block_size)
      H.check(used >= lo and used <= hi, "between steps the request holds %d blocks for %d tokens (%d-%d)", used, T, lo, hi)
    end
    s0 = s
  end
end
do
  local e = luainfer.engine{ max_num_seqs = 1, spec_tokens = 8, prefix_caching = false }
  local id = e:add{ prompt = repetitive[3], max_tokens = 60, temperature = 0, ignore_eos = true }
  local n, cut, crossed = 0, 0, 0
  rounds(e, id, 8, 60, function(ntoks, d, want)
    n = n + 1
    if d < want then cut = cut + 1 end
    if (ntoks % 16) + d > 16 then crossed = crossed + 1 end
  end)
  H.check(n >= 4 and cut == 0, "every round drafted its full k (%d of %d cut)", cut, n)
  H.check(crossed > 0, "rounds drafted past the block of the next token (%d)", crossed)
  local s = e:stats()
  H.check(s.kv_free_blocks == s.kv_total_blocks, "every block returned (%d/%d)", s.kv_free_blocks, s.kv_total_blocks)
  e:close()
end
-- ... but never into blocks a waiting request's prompt needs: with the
-- pool's free blocks all spoken for, drafts stay in the next token's block
do
  local long = {}
  for i = 1, 150 do long[i] = words[(i * 7) % #words + 1] end
  local e = luainfer.engine{ max_num_seqs = 1, spec_tokens = 8, prefix_caching = false, kv_memory = per_token * 16 * 12 }
  H.check(e:stats().kv_total_blocks == 12, "a pool of 12 blocks (%d)", e:stats().kv_total_blocks)
  local id = e:add{ prompt = repetitive[3], max_tokens = 60, temperature = 0, ignore_eos = true }
  local wid = e:add{ prompt = table.concat(long, " "), max_tokens = 2, temperature = 0 }
  local n, over = 0, 0
  rounds(e, id, 8, 60, function(ntoks, d)
    n = n + 1
    if ntoks + d > (math.floor(ntoks / 16) + 1) * 16 then over = over + 1 end
  end)
  local pw = e:result(wid).prompt_tokens
  H.check(pw > 16 * 9 and pw <= 16 * 12, "the waiting prompt needs 10-12 of the 12 blocks (%d tokens)", pw)
  H.check(n >= 4 and over == 0, "with a prompt waiting, no round drafted past the next token's block (%d of %d)", over, n)
  H.check(e:stats().preemptions == 0, "no preemption (%d)", e:stats().preemptions)
  e:close()
end

-- A draft that would end the request ends the round: the rows after it
-- could never be accepted. Counting "one two ... seven", the model says
-- " eight", and the first round's copy runs on " nine ten one two three
-- four five six"; with " four" a stop token it drafts 6 of those 8, and the
-- output is speculation off's. (With ignore_eos an end-of-generation id in
-- a copy does not cut it, the request going on past it; nor is a copy
-- without one cut: above, every round drafted its full k.)
do
  local e = luainfer.engine{ max_num_seqs = 1 }
  local pt, four = e:tokenize(repetitive[3]), nil
  for _, t in ipairs(pt) do if e:detokenize({ t }) == " four" then four = t end end
  e:close()
  H.check(four ~= nil, "' four' is one token of the counting prompt")
  local req = { prompt = repetitive[3], max_tokens = 30, temperature = 0, ignore_eos = true, stop_token_ids = { four } }
  local function go(cfg)
    local eng = luainfer.engine(cfg)
    local id = eng:add(req)
    local first
    while eng:has_work() do
      eng:step()
      if not first and eng:stats().spec_drafted > 0 then first = eng:stats().spec_drafted end
    end
    local r, st = eng:result(id), eng:stats()
    eng:close()
    return r, first, st
  end
  local off = go{ max_num_seqs = 1, prefix_caching = false }
  local on, first, st = go{ max_num_seqs = 1, spec_tokens = 8, prefix_caching = false }
  H.check(off.finish_reason == "stop" and H.eq_list(on.tokens, off.tokens) and on.finish_reason == off.finish_reason,
          "a stop token in the copy: the output of speculation off (%d tokens, %s)", #on.tokens, tostring(on.finish_reason))
  H.check(first == 6, "the first round drafted up to the stop token: 6 of 8 (%s)", tostring(first))
  H.check(st.spec_accepted < st.spec_drafted, "drafts rejected (' ten') and accepted (%d of %d)", st.spec_accepted,
          st.spec_drafted)
end

-- the default spec_disable_batch (4): drafts only once few requests still run
local dflt, ds = run{ max_num_seqs = 32, max_batched_tokens = 512, spec_tokens = 4 }
same(dflt, base, "spec 4, default spec_disable_batch")
H.check(ds.spec_drafted > 0 and ds.spec_drafted < s.spec_drafted, "fewer drafts with a busy batch (%d < %d)",
        ds.spec_drafted, s.spec_drafted)

-- a sampled request never drafts
local e = luainfer.engine{ spec_tokens = 4 }
luainfer.generate(e, repetitive[3], { max_tokens = 24, temperature = 0.7, seed = 1, ignore_eos = true })
H.check(e:stats().spec_drafted == 0, "temperature > 0: no drafts (%d)", e:stats().spec_drafted)
e:close()

for _, bad in ipairs({ { spec_tokens = 17 }, { spec_tokens = -1 }, { spec_tokens = 2, spec_ngram_min = 3, spec_ngram_max = 2 },
                       { spec_disable_batch = -1 } }) do
  local ok, err = pcall(luainfer.engine, bad)
  H.check(not ok and tostring(err):find("spec_"), "bad setting refused: %s", tostring(err))
end
-- llama.cpp's arithmetic sums attention differently for 1 and 2+ tokens:
-- verification would not be exact there, so it is refused
local ok, err = pcall(luainfer.engine, { isa = "ggml", spec_tokens = 2 })
H.check(not ok and tostring(err):find("batch-invariant", 1, true), "isa ggml refuses speculation: %s", tostring(err))
H.finish("test_spec")
