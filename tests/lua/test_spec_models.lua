-- test_spec_models.lua — speculation with a model as proposer, on the real
-- model: a draft GGUF (its first 4 layers, tools/make_draft.py) and
-- layer-skip self-drafting (the target's first N blocks + its head). Greedy
-- verification must be exact, so every run gives the tokens, text, finish
-- reasons and logprob bits of the engine without speculation:
--  * batched (8 requests, one of them n = 2 sharing its prompt's blocks,
--    copy-on-write under the drafts), with a prefix-cache hit afterwards;
--  * chunked prefill and drafts verified in part (a 24-token step budget);
--  * preemption under a tiny KV budget;
--  * a request's own `speculation = {method, k}` on an engine with none;
--  * drafts were made and some accepted and some rejected, counted per method;
--  * every block comes back; bad settings are clear errors.
-- The draft comes from $LUAINFER_TEST_DRAFT, else it is made in a temp file
-- (skipped, exit 77, when .venv's Python cannot run make_draft.py); an
-- untrained EAGLE draft likewise ($LUAINFER_TEST_EAGLE). With one loaded,
-- a request copying with n-gram lookup stops computing its draft KV after
-- eagle_idle_steps positions, in fewer steps.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local H = require("harness")
local luainfer = require("luainfer")

local draft = H.draft_model("test_spec_models")

local prompts = {
  -- over two 16-token blocks, so the repeated request below hits the prefix cache
  "The river ran past old mills and quiet farms while children counted boats under a grey sky of late autumn, and",
  "Repeat this list exactly: apple, banana, cherry, dates, elderberry, fig, grape. Again: apple, banana,",
  "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
  "<|im_start|>user\nCopy this sentence: the quick brown fox jumps over the lazy dog.<|im_end|>\n<|im_start|>assistant\n",
  "Write a haiku about the sea:",
  "one two three four five six seven eight nine ten one two three four five six seven",
  "The capital of France is Paris. The capital of Spain is",
}

-- spec: nil, or the speculation table every request asks for
local function run(cfg, spec)
  local e = luainfer.engine(cfg)
  local ids = {}
  for i, p in ipairs(prompts) do
    ids[i] = e:add{ prompt = p, max_tokens = 10 + 4 * i, temperature = 0, ignore_eos = (i % 3 == 0),
                    stop = (i == 5) and "\n\n" or nil, n = (i == 2) and 2 or nil, logprobs = (i % 2 == 1) and 2 or nil,
                    speculation = spec }
  end
  e:run()
  local out = {}
  for i = 1, #prompts do out[i] = e:result(ids[i]) end
  out[#out + 1] = e:result(ids[2] + 1) -- the second sample of request 2
  -- a prefix hit after the batch is done: the first prompt again
  local again = e:add{ prompt = prompts[1], max_tokens = 16, temperature = 0, speculation = spec }
  e:run()
  out[#out + 1] = e:result(again)
  local s = e:stats()
  H.check(s.kv_free_blocks == s.kv_total_blocks, "every block returned (%d/%d)", s.kv_free_blocks, s.kv_total_blocks)
  -- (a tiny budget may have evicted it)
  H.check(cfg.kv_memory or s.prefix_hit_tokens > 0, "the repeated prompt hit the prefix cache")
  e:close()
  return out, s
end

local function same(a, b, label)
  local n = 0
  for i = 1, #b do
    local ok = H.eq_list(a[i].tokens, b[i].tokens) and a[i].text == b[i].text and a[i].finish_reason == b[i].finish_reason
    -- the logprobs' bits too: a text can survive a corrupted KV row, its logits cannot
    for j, ent in ipairs(b[i].logprobs or {}) do
      local o = a[i].logprobs and a[i].logprobs[j]
      ok = ok and o and o.token == ent.token and o.logprob == ent.logprob
    end
    if ok then
      n = n + 1
    else
      H.check(false, "%s: request %d differs (%d vs %d tokens)", label, i, #a[i].tokens, #b[i].tokens)
    end
  end
  print(("%s: %d/%d identical to speculation off"):format(label, n, #b))
end

local function drafted(s, method, label)
  local m = s.spec_by[method]
  print(("%s: %s drafted %d, accepted %d, rounds %d"):format(label, method, m.drafted, m.accepted, m.rounds))
  H.check(m.drafted > 0 and m.accepted > 0 and m.accepted < m.drafted,
          "%s: %s drafts made (%d), some accepted (%d), some rejected", label, method, m.drafted, m.accepted)
  H.check(s.spec_drafted == m.drafted and s.spec_accepted == m.accepted, "%s: every draft came from %s", label, method)
end

local base = run{ max_num_seqs = 8 }

-- a draft model
local d, ds = run{ max_num_seqs = 8, draft_model = draft, spec_tokens = 4, spec_disable_batch = 0 }
same(d, base, "draft k=4")
drafted(ds, "draft", "draft k=4")

-- layer skip: the target's first 29 of 30 blocks (close enough to be accepted often)
local l, ls = run{ max_num_seqs = 8, spec_layers = 29, spec_tokens = 4, spec_disable_batch = 0 }
same(l, base, "layerskip 29, k=4")
drafted(ls, "layerskip", "layerskip 29, k=4")
H.check(ls.kv_draft_bytes == 0, "layerskip keeps no KV of its own (%d bytes)", ls.kv_draft_bytes)

-- chunked prefill, drafts verified in part
local lc = run{ max_num_seqs = 8, spec_layers = 29, spec_tokens = 6, spec_disable_batch = 0, max_batched_tokens = 24 }
same(lc, base, "layerskip 29, k=6, 24 tokens per step")
local dc = run{ max_num_seqs = 8, draft_model = draft, spec_tokens = 6, spec_disable_batch = 0, max_batched_tokens = 24 }
same(dc, base, "draft k=6, 24 tokens per step")

-- preemption under a tiny KV budget (draft: both storages share it)
local ie = luainfer.engine{ max_num_seqs = 1 }
local info = ie:info()
ie:close()
local per_token = 2 * info.n_layer * 3 * 64 * 2
local lt, lts = run{ max_num_seqs = 8, kv_memory = per_token * 16 * 10, spec_layers = 29, spec_tokens = 4,
                     spec_disable_batch = 0 }
same(lt, base, "layerskip 29, tiny KV budget")
H.check(lts.preemptions > 0, "layerskip: the tiny budget forced preemption (%d)", lts.preemptions)
local dt, dts = run{ max_num_seqs = 8, kv_memory = per_token * 16 * 11, draft_model = draft, spec_tokens = 4,
                     spec_disable_batch = 0 }
same(dt, base, "draft k=4, tiny KV budget")
H.check(dts.preemptions > 0, "draft: the tiny budget forced preemption (%d)", dts.preemptions)

-- an EAGLE draft (untrained: the tokens stay, whatever it drafts), chunked
local eagle = H.eagle_draft("test_spec_models")
local eg, egs = run{ max_num_seqs = 8, eagle = eagle, spec_tokens = 3, spec_disable_batch = 0, max_batched_tokens = 24 }
same(eg, base, "eagle k=3, 24 tokens per step")
H.check(egs.spec_by.eagle.drafted > 0 and egs.spec_drafted == egs.spec_by.eagle.drafted,
        "eagle: drafts made (%d), all of them by eagle", egs.spec_by.eagle.drafted)
-- ... with eagle_lazy (each prompt's draft KV at its first draft step: the
-- forked sample, the prefix hit and chunked prefill as above), and under a
-- tiny KV budget (preempted requests recompute, their rows wait again)
local egl = run{ max_num_seqs = 8, eagle = eagle, eagle_lazy = true, spec_tokens = 3, spec_disable_batch = 0,
                 max_batched_tokens = 24 }
same(egl, base, "eagle k=3, eagle_lazy, 24 tokens per step")
local egt, egts = run{ max_num_seqs = 8, kv_memory = per_token * 16 * 11, eagle = eagle, eagle_lazy = true,
                       spec_tokens = 3, spec_disable_batch = 0 }
same(egt, base, "eagle k=3, eagle_lazy, tiny KV budget")
H.check(egts.preemptions > 0, "eagle_lazy: the tiny budget forced preemption (%d)", egts.preemptions)

-- EAGLE loaded, a request copying with n-gram lookup (more than one
-- position a step, never an EAGLE draft): past eagle_idle_steps positions
-- (30 here) its draft KV is zeroed, not computed, though it ran fewer steps
-- than that; with 0 it is always computed; the tokens are the same either
-- way
do
  local copy = "Repeat this list exactly: apple, banana, cherry, dates, elderberry, fig, grape, kiwi, lemon, mango, " ..
               "nectarine, orange, papaya, quince. Again: apple, banana,"
  local function copying(idle)
    local e = luainfer.engine{ max_num_seqs = 2, eagle = eagle, spec_disable_batch = 0, eagle_idle_steps = idle }
    local id = e:add{ prompt = copy, max_tokens = 40, temperature = 0, ignore_eos = true,
                      speculation = { method = "ngram", k = 16 } }
    e:run()
    local r, st = e:result(id), e:stats()
    e:close()
    return r, st
  end
  local r30, s30 = copying(30)
  local r0, s0 = copying(0)
  H.check(H.eq_list(r30.tokens, r0.tokens), "the same tokens whether idle rows are dropped or computed")
  H.check(s30.steps < 30 and s30.draft_sync_dropped > 0, "40 tokens in %d steps (%d drafts accepted): %d positions "
          .. "dropped as idle (%d computed)", s30.steps, s30.spec_by.ngram.accepted, s30.draft_sync_dropped,
          s30.draft_sync_tokens)
  H.check(s0.draft_sync_dropped == 0 and s0.draft_sync_tokens > s30.draft_sync_tokens,
          "eagle_idle_steps 0: every position computed (%d)", s0.draft_sync_tokens)
end

-- eagle_lazy: a request's draft KV waits for its first EAGLE draft. The
-- copying request never drafts with EAGLE, so nothing is computed (every
-- position it computed dropped at its end); an EAGLE request whose prompt
-- fits (LI_EAGLE_LAZY_MAX, 512) catches it up at its first draft, one
-- whose prompt does not is caught up as without eagle_lazy; the tokens are
-- the same throughout
do
  local copy = "Repeat this list exactly: apple, banana, cherry, dates, elderberry, fig, grape, kiwi, lemon, mango, " ..
               "nectarine, orange, papaya, quince. Again: apple, banana,"
  local long = ("The river ran past the old mills and the quiet farms. "):rep(60)
  local function go(lazy, prompt, spec)
    local e = luainfer.engine{ max_num_seqs = 2, eagle = eagle, spec_disable_batch = 0, eagle_idle_steps = 0,
                               eagle_lazy = lazy, max_batched_tokens = 256 }
    local id = e:add{ prompt = prompt, max_tokens = 24, temperature = 0, ignore_eos = true, speculation = spec }
    e:run()
    local r, st = e:result(id), e:stats()
    e:close()
    return r, st
  end
  local ng = { method = "ngram", k = 16 }
  local ra, sa = go(false, copy, ng)
  local rb, sb = go(true, copy, ng)
  H.check(H.eq_list(ra.tokens, rb.tokens), "eagle_lazy, n-gram: the same tokens")
  H.check(sa.draft_sync_tokens > 0 and sb.draft_sync_tokens == 0 and sb.draft_sync_dropped > 0,
          "eagle_lazy, never an EAGLE draft: no draft KV computed (%d; %d without eagle_lazy), %d positions dropped",
          sb.draft_sync_tokens, sa.draft_sync_tokens, sb.draft_sync_dropped)
  local eg3 = { method = "eagle", k = 3 }
  for _, p in ipairs({ copy, long }) do
    local r1, s1 = go(false, p, eg3)
    local r2, s2 = go(true, p, eg3)
    H.check(H.eq_list(r1.tokens, r2.tokens) and s1.spec_by.eagle.accepted == s2.spec_by.eagle.accepted and
            s2.draft_sync_dropped == 0 and s2.draft_sync_tokens == s1.draft_sync_tokens,
            "eagle_lazy, EAGLE from the first step, a %d-token prompt: the same tokens and acceptance (%d, %d), "
            .. "the same rows caught up (%d, %d), none dropped", r1.prompt_tokens or #p, s1.spec_by.eagle.accepted,
            s2.spec_by.eagle.accepted, s1.draft_sync_tokens, s2.draft_sync_tokens)
  end
end

-- a request's own speculation on an engine that does not speculate by default
local r, rs = run({ max_num_seqs = 8, spec_layers = 29, spec_disable_batch = 0 }, { method = "layerskip", k = 3 })
same(r, base, "requests asking {layerskip, 3}")
drafted(rs, "layerskip", "requests asking {layerskip, 3}")
local rn, rns = run({ max_num_seqs = 8, spec_disable_batch = 0 }, { method = "ngram", k = 5 })
same(rn, base, "requests asking {ngram, 5}")
drafted(rns, "ngram", "requests asking {ngram, 5}")
-- and one asking for none on an engine that speculates
local _, offs = run({ max_num_seqs = 8, spec_layers = 29, spec_tokens = 4, spec_disable_batch = 0 }, false)
H.check(offs.spec_drafted == 0, "speculation = false: no drafts (%d)", offs.spec_drafted)

-- bad settings
local function refused(cfg, want, label)
  local ok, msg = pcall(luainfer.engine, cfg)
  H.check(not ok and tostring(msg):find(want, 1, true) ~= nil, "%s: want an error with '%s', got %s", label, want,
          tostring(msg))
end
refused({ spec_method = "draft", spec_tokens = 4 }, "needs a draft model", "draft without a draft model")
refused({ spec_method = "lookahead", spec_tokens = 4 }, "unknown speculation method 'lookahead'", "unknown method")
refused({ spec_layers = 30, spec_tokens = 4 }, "spec_layers must be in [1, 29]", "spec_layers = n_layer")
refused({ spec_layers = 29, spec_tokens = 4, isa = "ggml" }, "batch-invariant", "layerskip with --isa ggml")
refused({ draft_model = draft, spec_tokens = 4, isa = "ggml" }, "batch-invariant", "draft with --isa ggml")
refused({ eagle = eagle, isa = "ggml" }, "batch-invariant", "eagle with --isa ggml")
refused({ eagle = draft }, "not an EAGLE draft", "a draft model given as an EAGLE draft")
refused({ spec_method = "eagle", spec_tokens = 3 }, "needs an EAGLE draft", "eagle without a draft")
refused({ spec_tokens = 17 }, "spec_tokens", "k out of range")

local e = luainfer.engine{ max_num_seqs = 2 }
local function add_refused(req, want, label)
  local ok, msg = pcall(e.add, e, req)
  H.check(not ok and tostring(msg):find(want, 1, true) ~= nil, "%s: want an error with '%s', got %s", label, want,
          tostring(msg))
end
add_refused({ prompt = "hi", speculation = { method = "draft", k = 2 } }, "'draft' is not available", "no draft model")
add_refused({ prompt = "hi", speculation = { method = "layerskip", k = 2 } }, "'layerskip' is not available",
            "no layerskip")
add_refused({ prompt = "hi", speculation = { method = "ngram", k = 17 } }, "'speculation.k' must be an integer in [0, 16]",
            "k out of range")
add_refused({ prompt = "hi", speculation = { method = "tree" } }, "unknown speculation method 'tree'", "unknown method")
add_refused({ prompt = "hi", speculation = { k = 2, depth = 3 } }, "unknown key 'depth'", "unknown key")
add_refused({ prompt = "hi", speculation = 3 }, "'speculation' must be a map", "not a map")
e:close()
local g = luainfer.engine{ isa = "ggml", max_num_seqs = 1 }
local ok, msg = pcall(g.add, g, { prompt = "hi", speculation = { method = "ngram", k = 2 } })
H.check(not ok and tostring(msg):find("batch-invariant", 1, true), "ggml: a request's speculation refused: %s", tostring(msg))
g:close()

H.finish("test_spec_models")
