-- test_spec_policy.lua — the policy's speculate(req, state) hook has the
-- last word on who drafts, with which proposer and how many tokens:
--  * a policy turning layerskip on (k = 3) on an engine with no default
--    makes drafts, and greedy output stays the output without speculation;
--  * `false` turns drafts off, whatever the engine and the request ask;
--  * an unavailable method is refused (plans_trimmed), k is clamped to max_k;
--  * a failing hook counts a policy error and the requests' own wants stand;
--  * the hook sees req.speculation (method, k, max_k, acceptance, drafted)
--    and state.spec (batch_size, step_time, token_time, draft_time, available);
--  * policies/spec_adaptive.lua: its cost model, and it runs exactly.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local H = require("harness")
local luainfer = require("luainfer")
local root = H.repo_root()

local prompts = {
  "Repeat this list exactly: apple, banana, cherry, dates, elderberry, fig, grape. Again: apple, banana,",
  "<|im_start|>user\nCopy this sentence: the quick brown fox jumps over the lazy dog.<|im_end|>\n<|im_start|>assistant\n",
  "one two three four five six seven eight nine ten one two three four five six seven",
}

local function run(cfg, spec)
  local e = luainfer.engine(cfg)
  local ids = {}
  for i, p in ipairs(prompts) do
    ids[i] = e:add{ prompt = p, max_tokens = 24, temperature = 0, ignore_eos = true, logprobs = 1, speculation = spec }
  end
  e:run()
  local out = {}
  for i = 1, #prompts do out[i] = e:result(ids[i]) end
  local s = e:stats()
  H.check(s.kv_free_blocks == s.kv_total_blocks, "every block returned (%d/%d)", s.kv_free_blocks, s.kv_total_blocks)
  e:close()
  return out, s
end

local function same(a, b, label)
  for i = 1, #b do
    local ok = H.eq_list(a[i].tokens, b[i].tokens)
    for j, ent in ipairs(b[i].logprobs) do ok = ok and a[i].logprobs[j].logprob == ent.logprob end
    H.check(ok, "%s: request %d differs from speculation off", label, i)
  end
end

local base = run{ max_num_seqs = 4 }

-- checks what the hook is shown, then answers
local checked = [[
local function check(req, state)
  local s, sp = req.speculation, state.spec
  assert(type(s.method) == "string" and type(s.k) == "number" and s.max_k >= 1 and s.max_k <= 16, "req.speculation")
  assert(s.acceptance.ngram and s.acceptance.layerskip and s.drafted.draft, "acceptance / drafted per method")
  assert(sp.batch_size >= 1 and sp.step_time >= 0 and sp.token_time >= 0 and sp.draft_time.layerskip, "state.spec")
  assert(sp.available.ngram == true and sp.available.draft == false, "state.spec.available")
  local rows = 0
  for n, t in pairs(sp.row_time) do
    assert(type(n) == "number" and n >= 1 and n <= 64 and n == math.floor(n) and t > 0, "state.spec.row_time entries")
    rows = rows + 1
  end
  -- decode steps of these few requests compute at most 64 rows each
  assert(rows >= 1 or req.num_generated < 3, "state.spec.row_time holds the decode steps measured so far")
end
]]
local function policy(body) return checked .. "return { speculate = function(req, state) check(req, state) " .. body .. " end }" end

local on, s_on = run{ max_num_seqs = 4, spec_layers = 29, spec_disable_batch = 0,
                      policy_source = policy('return "layerskip", 3') }
same(on, base, "policy: layerskip 3")
H.check(s_on.spec_by.layerskip.drafted > 0 and s_on.spec_by.layerskip.accepted > 0,
        "policy turned layerskip on (%d drafted)", s_on.spec_by.layerskip.drafted)
H.check(s_on.policy_errors == 0, "the hook saw what it expects (%d policy errors)", s_on.policy_errors)

local _, s_off = run({ max_num_seqs = 4, spec_layers = 29, spec_tokens = 4, spec_disable_batch = 0,
                       policy_source = policy("return false") }, { method = "layerskip", k = 4 })
H.check(s_off.spec_drafted == 0 and s_off.policy_errors == 0, "policy false: no drafts (%d)", s_off.spec_drafted)

local bad, s_bad = run{ max_num_seqs = 4, spec_tokens = 4, spec_disable_batch = 0,
                        policy_source = policy('return "draft", 4') }
same(bad, base, "policy: unavailable method")
H.check(s_bad.spec_drafted == 0 and s_bad.plans_trimmed > 0, "unavailable method refused (drafted %d, trimmed %d)",
        s_bad.spec_drafted, s_bad.plans_trimmed)

local big, s_big = run{ max_num_seqs = 4, spec_tokens = 0, spec_disable_batch = 0,
                        policy_source = policy('return "ngram", 1000') }
same(big, base, "policy: k above max_k")
H.check(s_big.spec_by.ngram.drafted > 0 and s_big.plans_trimmed > 0, "k clamped (drafted %d, trimmed %d)",
        s_big.spec_by.ngram.drafted, s_big.plans_trimmed)

local err, s_err = run({ max_num_seqs = 4, spec_layers = 29, spec_disable_batch = 0,
                         policy_source = "return { speculate = function() error('boom') end }" },
                       { method = "layerskip", k = 2 })
same(err, base, "policy: failing hook")
H.check(s_err.policy_errors > 0 and s_err.spec_by.layerskip.drafted > 0,
        "failing hook: policy errors (%d), the requests' wants stand (%d drafted)", s_err.policy_errors,
        s_err.spec_by.layerskip.drafted)

-- spec_adaptive.lua: the model, then a run
local A = dofile(root .. "/policies/spec_adaptive.lua")
H.check(math.abs(A._expected(0.5, 2) - 1.75) < 1e-12, "E(k=2, a=0.5) = 1.75")
local function lin(c) return function(k) return 1 + k * c end end
H.check(A._best_k(0, lin(0.05), 8) == 0, "acceptance 0: no drafts")
H.check(A._best_k(0.9, lin(0.06), 8) >= 4, "acceptance 0.9 at batch 1: long drafts (%d)", A._best_k(0.9, lin(0.06), 8))
H.check(A._best_k(0.5, lin(0.06 * 32), 8) == 0, "acceptance 0.5 at batch 32: no drafts")
-- the round's cost from measured steps: 9 rows cost twice 1 row
local rt = { [1] = 0.004, [9] = 0.008 }
H.check(math.abs(A._round_cost(rt, 1, 8, 0) - 2) < 1e-12, "C(8) at batch 1 from row_time (%g)", A._round_cost(rt, 1, 8, 0))
H.check(math.abs(A._round_cost(rt, 1, 8, 0.1) - 2.8) < 1e-12, "plus the proposer's share")
-- unmeasured: from the largest count below at 0.06 per row (5 rows: from 1)
H.check(math.abs(A._round_cost(rt, 1, 4, 0) - 1.24) < 1e-12, "C(4) from the prior slope (%g)", A._round_cost(rt, 1, 4, 0))
-- 10 rows at batch 2, k 4: from 9 rows, over 2 rows (from 1 row)
H.check(math.abs(A._round_cost(rt, 2, 4, 0) - 0.008 * 1.06 / (0.004 * 1.06)) < 1e-12, "C(4) at batch 2")
H.check(math.abs(A._round_cost({}, 4, 2, 0) - 1.48) < 1e-12, "nothing measured: the prior model")
-- measured costs steer k: where 2 rows cost 1.1 and 3 rows cost 2, acceptance 0.8 drafts 1
H.check(A._best_k(0.8, function(k) return A._round_cost({ [1] = 1, [2] = 1.1, [3] = 2, [4] = 3, [5] = 4 }, 1, k, 0) end,
                  4) == 1, "a steep measured cost keeps k at 1")
-- recent acceptance, per draft: the prior first, then each round's accepted
-- drafts as successes and its rejection as one failure, older trials fading
local f = A._FORGET
H.check(math.abs(A._recent(-1, "ngram", 0, -1, 0.5) - 0.5) < 1e-12, "nothing drafted: the prior")
-- a round of 8 drafts, 2 accepted then a rejection: 2 successes, 1 failure (not 2 of 8)
local a1 = A._recent(-1, "ngram", 8, 2 / 8, 0.5)
local S1, F1 = 2 * f ^ 3 + 2, 2 * f ^ 3 + 1
H.check(math.abs(a1 - S1 / (S1 + F1)) < 1e-12, "2 accepted, then rejected: %g", a1)
H.check(a1 > 0.5, "2 accepted before a rejection is better than the prior 0.5 (%g), not 2/8", a1)
H.check(math.abs(A._recent(-1, "ngram", 8, 2 / 8, 0.5) - a1) < 1e-12, "no new drafts: unchanged")
-- then rounds of 8 all accepted: towards 1 as the old trials fade
local d, acc, a = 8, 2, a1
for _ = 1, 6 do
  d, acc = d + 8, acc + 8
  a = A._recent(-1, "ngram", d, acc / d, 0.5)
end
H.check(a > 0.95, "six rounds of 8 accepted: %g (lifetime accepted / verified is %g)", a, acc / d)
local peak = a
-- then rejections at the first draft: it falls within a few rounds
for _ = 1, 5 do
  d = d + 8
  a = A._recent(-1, "ngram", d, acc / d, 0.5)
end
H.check(a < peak - 0.25, "five rounds rejected at once: %g, from %g", a, peak)
H.check(math.abs(A._recent(-1, "draft", 0, -1, 0.3) - 0.3) < 1e-12, "each method apart")
local ad, s_ad = run{ max_num_seqs = 4, spec_layers = 29, policy = root .. "/policies/spec_adaptive.lua" }
same(ad, base, "spec_adaptive")
H.check(s_ad.spec_drafted > 0 and s_ad.policy_errors == 0, "spec_adaptive drafted (%d), no policy errors (%d)",
        s_ad.spec_drafted, s_ad.policy_errors)
H.finish("test_spec_policy")
