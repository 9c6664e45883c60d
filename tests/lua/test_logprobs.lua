-- test_logprobs.lua — engine:add{logprobs = k} returns per-token logprobs in
-- e:result(id).logprobs, in msgpack-RPC's shape: one {token, logprob,
-- top = {{id, logprob}...}} per generated token.
--  * greedy: each chosen token is the first of its top-k, its logprob the
--    largest of them and <= 0; the top-k are sorted;
--  * logprobs = true (or 0) gives the same chosen logprobs with no top;
--  * no logprobs option: no logprobs field; max_tokens = 0: an empty list;
--  * n > 1 samples each get their own list; bad values are errors.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local H = require("harness")
local luainfer = require("luainfer")

local e = luainfer.engine{ max_num_seqs = 4 }
local prompt = "The capital of France is"
local K = 3

local _, r = luainfer.generate(e, prompt, { max_tokens = 8, temperature = 0, ignore_eos = true, logprobs = K })
local lp = r.logprobs
H.check(type(lp) == "table" and #lp == #r.tokens and #lp == 8, "one logprobs entry per token (%s)",
        type(lp) == "table" and #lp or tostring(lp))
for i, ent in ipairs(lp or {}) do
  H.check(ent.token == r.tokens[i], "entry %d names the generated token", i)
  H.check(ent.logprob <= 0, "entry %d: logprob %g <= 0", i, ent.logprob)
  H.check(#ent.top == K, "entry %d: %d alternatives", i, #ent.top)
  local best = -math.huge
  for k, t in ipairs(ent.top) do
    H.check(type(t[1]) == "number" and type(t[2]) == "number" and t[2] <= 0, "entry %d top %d is {id, logprob}", i, k)
    if k > 1 then H.check(t[2] <= ent.top[k - 1][2], "entry %d: top sorted", i) end
    if t[2] > best then best = t[2] end
  end
  H.check(ent.top[1][1] == ent.token, "entry %d: greedy chose the top token", i)
  H.check(math.abs(ent.logprob - best) < 1e-5, "entry %d: chosen logprob %g is the max of its top %g", i,
          ent.logprob, best)
end

-- the chosen token's alone: same values, no alternatives
for _, v in ipairs({ true, 0 }) do
  local _, b = luainfer.generate(e, prompt, { max_tokens = 8, temperature = 0, ignore_eos = true, logprobs = v })
  H.check(b.logprobs and #b.logprobs == 8, "logprobs = %s: 8 entries", tostring(v))
  for i, ent in ipairs(b.logprobs or {}) do
    H.check(#ent.top == 0, "logprobs = %s: no alternatives", tostring(v))
    H.check(lp and lp[i] and math.abs(ent.logprob - lp[i].logprob) < 1e-5,
            "logprobs = %s: entry %d equals the top-%d run's", tostring(v), i, K)
  end
end

local _, plain = luainfer.generate(e, prompt, { max_tokens = 4, temperature = 0 })
H.check(plain.logprobs == nil, "no logprobs unless asked")
local _, off = luainfer.generate(e, prompt, { max_tokens = 4, temperature = 0, logprobs = false })
H.check(off.logprobs == nil, "logprobs = false: none")
local _, zero = luainfer.generate(e, prompt, { max_tokens = 0, logprobs = 2 })
H.check(zero.logprobs and #zero.logprobs == 0, "max_tokens = 0: an empty list")

-- n > 1: each sample its own list
local id = e:add{ prompt = prompt, max_tokens = 5, temperature = 1.0, seed = 11, n = 3, ignore_eos = true, logprobs = 1 }
e:run()
for k = 0, 2 do
  local s = e:result(id + k)
  H.check(s.logprobs and #s.logprobs == #s.tokens and #s.tokens == 5, "sample %d: one entry per token", k)
  for i, ent in ipairs(s.logprobs or {}) do
    H.check(ent.token == s.tokens[i] and ent.logprob <= 0 and #ent.top == 1, "sample %d entry %d", k, i)
  end
  e:release(id + k)
end

H.check(not pcall(e.add, e, { prompt = prompt, logprobs = 21 }), "logprobs = 21 is an error")
H.check(not pcall(e.add, e, { prompt = prompt, logprobs = "yes" }), "logprobs = 'yes' is an error")
local s = e:stats()
H.check(s.kv_free_blocks == s.kv_total_blocks and not e:has_work(), "nothing left running")
e:close()
H.finish("test_logprobs")
