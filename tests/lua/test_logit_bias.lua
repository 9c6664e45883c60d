-- test_logit_bias.lua — engine:add{logit_bias = {[id] = bias}} on the real
-- model (OpenAI's logit_bias: added to the logits before sampling):
--  * banning greedy's first token (-100) picks the runner-up of the
--    unbiased top-k at that step, with the same raw logprob;
--  * banning every token of a greedy answer keeps all of them out;
--  * +100 forces a token at temperature 1, for every sample of n = 2;
--  * ids as strings of digits ("123", as OpenAI's JSON has them) work the
--    same as integers;
--  * bad keys, values and ids are errors, and the engine goes on serving.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local H = require("harness")
local luainfer = require("luainfer")

local e = luainfer.engine{ max_num_seqs = 4 }
local prompt = "The capital of France is"
local opts = { max_tokens = 10, temperature = 0, ignore_eos = true }
local function with(extra)
  local t = {}
  for k, v in pairs(opts) do t[k] = v end
  for k, v in pairs(extra) do t[k] = v end
  return t
end

local _, base = luainfer.generate(e, prompt, with{ logprobs = 3 })
local first, runner_up = base.tokens[1], base.logprobs[1].top[2]

-- ban the first token: greedy takes the unbiased runner-up, reported raw
local _, r = luainfer.generate(e, prompt, with{ logit_bias = { [first] = -100 }, logprobs = 1 })
H.check(r.tokens[1] == runner_up[1], "banned %d: first token %d is the runner-up %d", first, r.tokens[1], runner_up[1])
H.check(math.abs(r.logprobs[1].logprob - runner_up[2]) < 1e-5, "its logprob %g is the raw one %g",
        r.logprobs[1].logprob, runner_up[2])

-- the same with the id as a string of digits
local _, rs = luainfer.generate(e, prompt, with{ logit_bias = { [tostring(first)] = -100 } })
H.check(H.eq_list(rs.tokens, r.tokens), "string ids act as integer ids")

-- ban every token of the greedy answer: none of them comes back
local ban = {}
for _, t in ipairs(base.tokens) do ban[t] = -100 end
local _, nb = luainfer.generate(e, prompt, with{ logit_bias = ban })
H.check(#nb.tokens == opts.max_tokens, "%d tokens", #nb.tokens)
for i, t in ipairs(nb.tokens) do H.check(ban[t] == nil, "token %d (%d) was banned", i, t) end

-- +100 forces one token, at temperature 1, for each of n = 2 samples
local forced = base.tokens[2] ~= first and base.tokens[2] or runner_up[1]
local id = e:add{ prompt = prompt, max_tokens = 6, temperature = 1.0, seed = 7, n = 2, ignore_eos = true,
                  logit_bias = { [forced] = 100 } }
e:run()
for k = 0, 1 do
  local s = e:result(id + k)
  local all = #s.tokens == 6
  for _, t in ipairs(s.tokens) do all = all and t == forced end
  H.check(all, "sample %d: every token is the forced %d", k, forced)
  e:release(id + k)
end

-- errors: the request is refused with a message, the engine goes on
local bad = {
  { { ["12a"] = 1 }, "keys must be token ids" },
  { { [-1] = 1 }, "keys must be token ids" },
  { { [1.5] = 1 }, "keys must be token ids" },
  { { [5] = "x" }, "must be a number" },
  { { [5] = 100.5 }, "[-100, 100]" },
  { { [49152] = 1 }, "outside the vocabulary" },
  { "no", "must be a table" },
}
for i, b in ipairs(bad) do
  local ok, err = pcall(e.add, e, { prompt = prompt, logit_bias = b[1] })
  H.check(not ok and tostring(err):find(b[2], 1, true), "bad logit_bias %d: %s", i, tostring(err))
end
local _, again = luainfer.generate(e, prompt, opts)
H.check(H.eq_list(again.tokens, base.tokens), "the engine still gives the unbiased answer")
local s = e:stats()
H.check(s.kv_free_blocks == s.kv_total_blocks and not e:has_work(), "nothing left running")
e:close()
H.finish("test_logit_bias")
