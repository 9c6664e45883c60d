-- test_stop_tokens.lua — vLLM's min_tokens and stop_token_ids through
-- engine:add, on the real model, greedy:
--  * stop_token_ids ends a request where that token would come, like an
--    end-of-generation token: finish "stop", the token not in the output;
--  * min_tokens holds back end-of-generation, stop tokens and stop strings
--    until that many tokens exist; the tokens before the hold-back point
--    are the unconstrained ones;
--  * each of n = 2 samples obeys min_tokens;
--  * bad values are errors and the engine goes on.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local H = require("harness")
local luainfer = require("luainfer")

local e = luainfer.engine{ max_num_seqs = 4 }
local P = "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
local function gen(extra)
  local o = { max_tokens = 48, temperature = 0 }
  for k, v in pairs(extra or {}) do o[k] = v end
  local _, r = luainfer.generate(e, P, o)
  return r
end
local function prefix_equal(a, b, n)
  for i = 1, n do if a[i] ~= b[i] then return false end end
  return true
end

local base = gen()
local n = #base.tokens
H.check(base.finish_reason == "stop" and n >= 6 and n < 48, "the plain answer ends by itself (%d tokens, %s)", n,
        base.finish_reason)

-- a stop token: the output ends just before it, as at end-of-generation
local st = base.tokens[4]
local cut = gen{ stop_token_ids = { st } }
local first = 4
for i = 1, 3 do if base.tokens[i] == st then first = i break end end
H.check(cut.finish_reason == "stop" and #cut.tokens == first - 1 and prefix_equal(cut.tokens, base.tokens, first - 1),
        "stop token %d: %d tokens (%s), want %d", st, #cut.tokens, cut.finish_reason, first - 1)

-- min_tokens past the natural end: the same start, then more
local long = gen{ min_tokens = n + 6 }
H.check(#long.tokens >= n + 6, "min_tokens %d: %d tokens", n + 6, #long.tokens)
H.check(prefix_equal(long.tokens, base.tokens, n), "min_tokens keeps the first %d tokens", n)

-- min_tokens holds back a stop token until it is reached
local held = gen{ stop_token_ids = { st }, min_tokens = first + 2 }
local early = false
for i = 1, math.min(first + 2, #held.tokens) do early = early or held.tokens[i] == st end
H.check(not early and #held.tokens >= first + 2, "stop token held back for %d tokens (%d tokens)", first + 2,
        #held.tokens)
for _, t in ipairs(held.tokens) do H.check(t ~= st, "the stop token is never in the output") end

-- and a stop string: base.text's first word stops at once, not under min_tokens
local word = base.text:match("^(%a+)")
local s0 = gen{ stop = word }
H.check(s0.finish_reason == "stop" and s0.text == "", "stop '%s' at once: '%s'", word, s0.text)
local s1 = gen{ stop = word, min_tokens = 3 }
H.check(#s1.tokens >= 3 and s1.text:sub(1, #word) == word, "min_tokens 3 lets '%s' through: '%s'", word, s1.text)

-- n = 2 samples at temperature 1: both at least min_tokens long
local id = e:add{ prompt = P, max_tokens = 40, min_tokens = 30, temperature = 1.0, seed = 5, n = 2 }
e:run()
for k = 0, 1 do
  local r = e:result(id + k)
  H.check(#r.tokens >= 30, "sample %d: %d tokens >= 30", k, #r.tokens)
  e:release(id + k)
end

local bad = {
  { { max_tokens = 4, min_tokens = 5 }, "min_tokens" },
  { { stop_token_ids = { 49152 } }, "outside the vocabulary" },
  { { stop_token_ids = { -1 } }, "list of token ids" },
  { { stop_token_ids = "x" }, "list of token ids" },
  { { stop_token_ids = (function() local t = {} for i = 1, 65 do t[i] = i end return t end)() }, "at most 64" },
}
for i, b in ipairs(bad) do
  local o = { prompt = P }
  for k, v in pairs(b[1]) do o[k] = v end
  local ok, err = pcall(e.add, e, o)
  H.check(not ok and tostring(err):find(b[2], 1, true), "bad %d: %s", i, tostring(err))
end
local again = gen()
H.check(prefix_equal(again.tokens, base.tokens, n) and #again.tokens == n, "the engine still gives the plain answer")
local s = e:stats()
H.check(s.kv_free_blocks == s.kv_total_blocks and not e:has_work(), "nothing left running")
e:close()
H.finish("test_stop_tokens")
