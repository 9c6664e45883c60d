-- bench_spec.lua — n-gram speculation (prompt lookup) on versus off, side
-- by side in one run: greedy decode throughput, draft acceptance, and a
-- check that the output is the same token for token.
--
--   ./build/luainfer run bench/bench_spec.lua [MAX_TOKENS] [ROUNDS] [--json FILE] [--plot FILE]
--
-- Workloads (each greedy, ignore_eos, MAX_TOKENS default 128):
--   copy     prompts that ask for text the prompt holds (code to repeat, a
--            list, a passage): where prompt lookup pays;
--   free     open-ended prompts with little to look up.
-- Each workload's 8 prompts run one at a time (max_num_seqs 1) and all at
-- once (8); speculation with
-- spec_tokens 2, 4 and 8 (n-grams 4 down to 2, the default
-- spec_disable_batch 4: no drafts while more than 4 requests run), and
-- spec_tokens 4 drafting at any batch (spec_disable_batch 0). Rounds
-- interleave the settings; the fastest of each is kept.
--
-- With a third argument, `proposers`, it measures every proposer instead:
--
--   ./build/luainfer bench spec [MAX_TOKENS] [ROUNDS] proposers [LAYERS] [DRAFT.gguf]
--
-- speculation off, n-gram (k 8), layer skip (the target's first LAYERS
-- blocks, default 20, k 3), a draft model (DRAFT.gguf, default: none; k 4)
-- and policies/spec_adaptive.lua (every proposer available), on four
-- workloads: input-grounded (rewrite a paragraph, edit a JSON object, add
-- type hints to code) and open-ended (a story); at batch 1 and 4 (four
-- variants of the prompt), greedy and temperature 0.7. Requests stop at
-- EOS or MAX_TOKENS. Each setting prints the decode rate a client sees
-- (a request's tokens after its first over its time after its first token,
-- the mean over the batch) and its ratio to off, the acceptance, and the
-- end-to-end ratio (all tokens over the run's time, prefill included).
-- Settings alternate within each round; the fastest run of each is kept.
-- A second table prices every run on one model clock: each forward pass
-- by its row count at the median cost of that count over the whole
-- benchmark, plus the run's measured time outside the target's forward
-- (proposing, the draft's catch-up, the policy, sampling and verification;
-- until session 31 sampling and verification were left out, which hid
-- what sampled drafts cost the host), so it compares what the
-- settings decided without the machine's load in between (--json: each
-- row's model_ratio).
-- Greedy runs assert the tokens of speculation off.
--
-- --medusa FILE (with proposers) adds Medusa heads (method medusa, the
-- engine's default tree or --medusa-tree SPEC, up to 16 nodes; the adaptive
-- run gets them only without DRAFT: the engine takes one or the other); --quick
-- keeps batch 1 at temperature 0 only. tools/gen_medusa_heads.py writes
-- untrained heads (acceptance near 0: a check of the machinery and its
-- cost), `luainfer train-medusa` trained ones.
--
-- --eagle FILE [--eagle-k K] (with proposers) adds an EAGLE draft (method
-- eagle, k 3 unless given; `luainfer train-eagle` makes one,
-- tools/gen_eagle_draft.py an untrained one), also offered to the adaptive
-- policy when no Medusa heads are.
--
-- --eagle-idle N[,N...] (with --eagle) runs the adaptive setting once per
-- value of the engine's eagle_idle_steps (named "adaptive idleN"; 0: every
-- request's draft KV computed, the default 16: an idle request's zeroed),
-- side by side.
--
-- --eagle-lazy (with --eagle) runs each adaptive setting twice: as the
-- engine runs it by default and with eagle_lazy (a request's draft KV of
-- its prompt computed at its first EAGLE draft; named "NAME lazy"), side by
-- side.
--
-- --isa NAME (with proposers) runs every engine on those CPU kernels.
--
-- --device cuda runs every engine on the GPU (with LUAINFER_CUDA_INVARIANT=1:
-- speculation needs its batch-invariant kernels, docs/cuda.md).
--
-- --calibrated (with proposers) runs each adaptive setting twice: as the
-- engine runs it by default (the row-cost curve from the passes run so
-- far, a count's first one untimed) and with the curve timed before the
-- first step (spec_calibrate; named "adaptive cal"), side by side.
--
-- --policy FILE[,FILE...] (with proposers) runs each policy file as its own
-- adaptive setting (named by the file's base name) instead of
-- policies/spec_adaptive.lua, alternating with the rest: two versions of a
-- speculation policy side by side in one run.
--
-- --temps T[,T...] and --batches B[,B...] (with proposers) choose the rows
-- (default 0,0.7 and 1,4; --quick: 0 and 1); --workloads W[,W...] the
-- workloads (default: all four). LAYERS 0 leaves layer skip out (its row
-- and the adaptive policy's offer: at 0.2-0.3x it is most of a run's time).
--
-- --seeds N (with proposers) runs each sampled setting (temperature 0.7)
-- N times over, one batch after another in the same engine, with seeds
-- 7 + i, 1007 + i, ...: sampled drafts change what each setting draws, so
-- with one seed a temperature row compares texts as much as settings (the
-- default, 1, is the benchmark as it was).
--
-- --json writes every row (workload, batch, temperature, setting, tok/s,
-- ratio to off, drafted, accepted); --plot draws the speedups over off.
local luainfer = require("luainfer")
local bench = require("luainfer.bench")
local opts = bench.options(arg)
local flags = bench.take_flags(arg, { ["--medusa"] = "value", ["--medusa-tree"] = "value", ["--eagle"] = "value",
                                      ["--eagle-k"] = "value", ["--quick"] = "flag", ["--eagle-idle"] = "value",
                                       ["--policy"] = "value", ["--seeds"] = "value", ["--temps"] = "value",
                                       ["--batches"] = "value", ["--calibrated"] = "flag", ["--device"] = "value",
                                       ["--workloads"] = "value", ["--eagle-lazy"] = "flag", ["--isa"] = "value" })
-- --device cuda: the engines run there (speculation needs its batch-invariant
-- kernels: LUAINFER_CUDA_INVARIANT=1, docs/cuda.md)
local DEVICE = flags["--device"]
-- --isa NAME (with proposers): the CPU kernels of every engine (default auto), e.g. avx512 against amx
local ISA = flags["--isa"]
local medusa, medusa_tree, quick = flags["--medusa"], flags["--medusa-tree"], flags["--quick"]
local eagle, eagle_k = flags["--eagle"], tonumber(flags["--eagle-k"] or "3")
local SEEDS = tonumber(flags["--seeds"] or "1")
if not SEEDS or SEEDS < 1 or SEEDS % 1 ~= 0 then
  error(("bench spec: --seeds %s: want a whole number >= 1"):format(flags["--seeds"]), 0)
end
local function list(flag, default, ok, want)
  local t, msg = bench.number_list(flags[flag], default, flag, ok, want)
  if not t then error("bench spec: " .. msg, 0) end
  return t
end
local TEMPS = list("--temps", quick and "0" or "0,0.7", function(n) return n >= 0 and n <= 2 end,
                   "temperatures in [0, 2]")
local BATCHES = list("--batches", quick and "1" or "1,4", function(n) return n >= 1 and n <= 8 and n % 1 == 0 end,
                     "batch sizes 1 to 8")
local root = (arg[0]:match("^(.*)/bench/") or ".")
local policies = {}
for f in (flags["--policy"] or (root .. "/policies/spec_adaptive.lua")):gmatch("[^,]+") do
  local fh = io.open(f, "r")
  if not fh then error(("bench spec: --policy %s: cannot open the file"):format(f), 0) end
  fh:close()
  policies[#policies + 1] = f
end
local idles = flags["--eagle-idle"] and
  list("--eagle-idle", nil, function(n) return n >= 0 and n % 1 == 0 end, "whole numbers >= 0") or {}
if #idles > 0 and not eagle then error("bench spec: --eagle-idle needs --eagle FILE", 0) end
if flags["--eagle-lazy"] and not eagle then error("bench spec: --eagle-lazy needs --eagle FILE", 0) end
local MAX = tonumber(arg[1]) or 128
local ROUNDS = tonumber(arg[2]) or 2

local SW = bench.spec_workloads()
local code = SW.code
local passage = "The river ran past the old mills and the quiet farms, while the children counted the boats " ..
  "under a grey sky of late autumn. In the evening the lamps were lit along the bank, and the ferryman " ..
  "called the last crossing of the day."
local workloads = {
  copy = {
    "<|im_start|>user\nRepeat this code exactly:\n" .. code .. "<|im_end|>\n<|im_start|>assistant\n",
    "Copy the passage.\nPassage: " .. passage .. "\nCopy: The river ran past",
    "one, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve; one, two, three,",
    code .. "\n# the same functions again, unchanged:\n",
    "<|im_start|>user\nWrite the sentence twice: " .. passage .. "<|im_end|>\n<|im_start|>assistant\n",
    "Name list: Alice Brown, Carlos Diaz, Emma Fischer, Hiro Ito, Jana Kowalski. Sorted as given: Alice Brown,",
    code .. "\n" .. code:sub(1, 60),
    "Q: What did the children count?\nContext: " .. passage .. "\nA: The children counted",
  },
  free = {
    "Write a short story about a lighthouse keeper.",
    "Explain how a hash table works.",
    "List some ideas for a weekend trip.",
    "The history of the printing press",
    "Describe the water cycle to a child.",
    "Why is the sky blue?",
    "Give advice for learning a new language.",
    "What makes a good cup of coffee?",
  },
}

local settings = { { k = 0 }, { k = 2 }, { k = 4 }, { k = 8 }, { k = 4, always = true } }

-- ---- every proposer (mode `proposers`) ---------------------------------------
-- the workloads (luainfer.bench's spec_workloads: the prompts and how a
-- batch's variants differ)
local grounded, kinds = SW.prompts, SW.kinds
if flags["--workloads"] then
  local want = {}
  for w in flags["--workloads"]:gmatch("[^,]+") do
    if not grounded[w] then
      error(("bench spec: --workloads %s: unknown workload %q (have %s)"):format(flags["--workloads"], w,
            table.concat(kinds, ", ")), 0)
    end
    want[#want + 1] = w
  end
  if #want == 0 then error("bench spec: --workloads: name at least one workload", 0) end
  kinds = want
end

local function proposers_bench(layers, draft)
  local sets = {
    { name = "off", cfg = {} },
    { name = "ngram k8", cfg = { spec_tokens = 8, spec_method = "ngram" }, spec = { method = "ngram", k = 8 } },
  }
  if layers > 0 then
    sets[#sets + 1] = { name = ("layerskip%d k3"):format(layers), cfg = { spec_tokens = 3, spec_layers = layers },
                        spec = { method = "layerskip", k = 3 } }
  end
  if draft then
    sets[#sets + 1] = { name = "draft k4", cfg = { spec_tokens = 4, draft_model = draft, spec_method = "draft" },
                        spec = { method = "draft", k = 4 } }
  end
  if medusa then
    sets[#sets + 1] = { name = "medusa", cfg = { medusa = medusa, medusa_tree = medusa_tree, spec_method = "medusa",
                                                 spec_tokens = 16 },
                        spec = { method = "medusa", k = 16 } }
  end
  if eagle then
    sets[#sets + 1] = { name = ("eagle k%d"):format(eagle_k), cfg = { eagle = eagle, spec_method = "eagle",
                                                                    spec_tokens = eagle_k },
                        spec = { method = "eagle", k = eagle_k } }
  end
  for _, f in ipairs(policies) do
    local base = f:match("([^/]+)%.lua$") or f
    for _, idle in ipairs(#idles > 0 and idles or { false }) do
      for _, cal in ipairs(flags["--calibrated"] and { false, true } or { false }) do
        for _, lazy in ipairs(flags["--eagle-lazy"] and { false, true } or { false }) do
          local name = base == "spec_adaptive" and #policies == 1 and "adaptive" or base
          name = idle and ("%s idle%d"):format(name, idle) or name
          name = (cal and name .. " cal" or name) .. (lazy and " lazy" or "")
          -- the engine takes heads or a draft model, not both, and an EAGLE draft, not with heads
          local eg = not (not draft and medusa) and eagle or nil
          sets[#sets + 1] = { name = name,
                              cfg = { spec_layers = layers > 0 and layers or nil, draft_model = draft,
                                      spec_method = "ngram", medusa = not draft and medusa or nil,
                                      medusa_tree = not draft and medusa_tree or nil, eagle = eg, policy = f,
                                      eagle_idle_steps = idle or nil, spec_calibrate = cal,
                                      eagle_lazy = (lazy and eg) and true or nil } }
        end
      end
    end
  end
  -- The model clock: every target forward pass of every run is timed by
  -- its row count (tokens computed in the step); at the end each count's
  -- cost is the median over the whole benchmark, and a run's modelled time
  -- is the sum of its steps' costs plus what it spent outside the target's
  -- forward (proposing, the draft model's catch-up, the policy, sampling
  -- and verifying the rows: everything a step did besides the pass). Every
  -- setting is priced from the one table, so the ratios say what the
  -- decisions cost, not how loaded the machine was during that run.
  local row_cost = {} -- [n] = { seconds of each forward pass of n rows }
  local function one(kind, seqs, temp, set)
    local cfg = { max_num_seqs = seqs, max_batched_tokens = 512, spec_disable_batch = 0, device = DEVICE, isa = ISA }
    for k, v in pairs(set.cfg) do cfg[k] = v end
    local e = luainfer.engine(cfg)
    local ids, hist, extra, s0 = {}, {}, 0, e:stats()
    for round = 1, temp > 0 and SEEDS or 1 do
      for i = 1, seqs do
        local p = seqs == 1 and grounded[kind] or SW.variant(grounded[kind], i)
        -- sampled requests ask for their proposer themselves (the engine's
        -- n-gram default drafts greedy requests only)
        ids[#ids + 1] = e:add{ prompt = p, max_tokens = MAX, temperature = temp, seed = 7 + i + 1000 * (round - 1),
                               speculation = temp > 0 and set.spec or nil }
      end
      while e:has_work() do
        e:step()
        local s1 = e:stats()
        local rows = s1.tokens_computed - s0.tokens_computed
        if rows > 0 then
          hist[rows] = (hist[rows] or 0) + 1
          local c = row_cost[rows] or {}
          c[#c + 1] = s1.time_forward - s0.time_forward
          row_cost[rows] = c
        end
        extra = extra + (s1.time_total - s1.time_forward) - (s0.time_total - s0.time_forward)
        s0 = s1
      end
    end
    local s = e:stats()
    local toks, n = bench.outputs(e, ids)
    -- the decode rate a client sees (tokens after its first over the time
    -- after its first), the mean over the requests
    local dec = 0
    for _, id in ipairs(ids) do
      local r = e:result(id)
      dec = dec + (#r.tokens - 1) / math.max(r.latency - r.ttft, 1e-9) / #ids
    end
    e:close()
    return { tput = n / s.time_total, dec = dec, drafted = s.spec_drafted, accepted = s.spec_accepted, toks = toks,
             model = { hist = hist, extra = extra, tokens = n } }
  end
  print(("speculation by proposer: up to %d tokens per request (stopping at EOS), best of %d rounds%s; decode tok/s " ..
         "per request after its first token (ratio to off, acceptance) and the end-to-end ratio (prefill included)")
    :format(MAX, ROUNDS, SEEDS > 1 and (", sampled rows over %d seeds a request"):format(SEEDS) or ""))
  local head = {}
  for i = 2, #sets do head[#head + 1] = ("%-30s"):format(sets[i].name) end
  print(("%-8s %5s %4s | %9s | %s"):format("workload", "batch", "temp", "off tok/s", table.concat(head, " ")))
  local rows = {}
  local temps, batches = TEMPS, BATCHES
  local progress = bench.progress(#temps * #batches * #kinds * ROUNDS * #sets, "spec runs")
  for _, temp in ipairs(temps) do
    for _, seqs in ipairs(batches) do
      for _, kind in ipairs(kinds) do
        local best = {}
        for _ = 1, ROUNDS do
          for si, set in ipairs(sets) do
            local r = one(kind, seqs, temp, set)
            progress:step()
            if temp == 0 and best[1] then
              for i = 1, seqs do
                assert(r.toks[i] == best[1].toks[i], ("%s, batch %d, %s: request %d differs from speculation off")
                  :format(kind, seqs, set.name, i))
              end
            end
            -- the fastest round of each setting, on each measure
            local b = best[si]
            if not b then best[si] = { dec = r.dec, tput = r.tput, drafted = r.drafted, accepted = r.accepted,
                                       toks = r.toks, models = {} }
            else
              if r.dec > b.dec then b.dec, b.drafted, b.accepted = r.dec, r.drafted, r.accepted end
              b.tput = math.max(b.tput, r.tput)
            end
            local bm = best[si].models
            bm[#bm + 1] = r.model
          end
        end
        local cols = {}
        for si = 2, #sets do
          local b, off = best[si], best[1]
          rows[#rows + 1] = { workload = kind, seqs = seqs, temperature = temp, setting = sets[si].name,
                              tok_s = b.dec, off_tok_s = off.dec, ratio = b.dec / off.dec,
                              e2e_tok_s = b.tput, off_e2e_tok_s = off.tput, e2e_ratio = b.tput / off.tput,
                              drafted = b.drafted, accepted = b.accepted, models = b.models,
                              requests = seqs * (temp > 0 and SEEDS or 1),
                              off_models = off.models }
          cols[#cols + 1] = ("%-30s"):format(("%.1f (%.2fx, %.0f%%) e2e %.2fx"):format(b.dec, b.dec / off.dec,
            100 * b.accepted / math.max(b.drafted, 1), b.tput / off.tput))
        end
        print(("%-8s %5d %4.1f | %9.1f | %s"):format(kind, seqs, temp, best[1].dec, table.concat(cols, " ")))
        io.stdout:flush()
      end
    end
  end
  progress:done()
  for _, t in ipairs(temps) do
    if t == 0 then
      print("greedy runs: every proposer's tokens were identical to speculation off")
      break
    end
  end
  -- the model clock's table, then each row's modelled ratio (the median over rounds)
  local cost = {}
  for n, c in pairs(row_cost) do cost[n] = bench.median(c) end
  local function tput(m)
    local t = m.extra
    for n, count in pairs(m.hist) do t = t + count * cost[n] end
    return m.tokens / t
  end
  local function model_ratio(r)
    local off = {}
    for i, m in ipairs(r.off_models) do off[i] = tput(m) end
    local off_tput, xs = bench.median(off), {}
    for i, m in ipairs(r.models) do xs[i] = tput(m) / off_tput end
    return bench.median(xs)
  end
  local shown = {}
  for _, n in ipairs({ 1, 2, 4, 8, 16, 32, 64 }) do
    if cost[n] then shown[#shown + 1] = ("%d %.2f ms"):format(n, 1e3 * cost[n]) end
  end
  print(("model clock: the median forward pass by rows over the whole run (%s); end-to-end tok/s ratio to off, " ..
         "median over rounds"):format(table.concat(shown, ", ")))
  print(("%-8s %5s %4s | %s"):format("workload", "batch", "temp", table.concat(head, " ")))
  -- rows come #sets - 1 to a line (workload, batch, temperature), as above
  for g = 1, #rows, #sets - 1 do
    local cols = {}
    for i = g, g + #sets - 2 do
      local r = rows[i]
      r.model_ratio = model_ratio(r)
      r.models, r.off_models = nil, nil
      cols[#cols + 1] = ("%-30s"):format(("%.2fx"):format(r.model_ratio))
    end
    local r = rows[g]
    print(("%-8s %5d %4.1f | %s"):format(r.workload, r.seqs, r.temperature, table.concat(cols, " ")))
  end
  bench.finish(opts, { bench = "spec", mode = "proposers", max_tokens = MAX, rounds = ROUNDS, seeds = SEEDS,
                       rows = rows })
end

if arg[3] == "proposers" then
  proposers_bench(tonumber(arg[4]) or 20, arg[5])
  return
end

local function run(prompts, seqs, set)
  local e = luainfer.engine{ device = DEVICE, max_num_seqs = seqs, max_batched_tokens = 512, spec_tokens = set.k,
                             spec_disable_batch = set.always and 0 or nil, policy = root .. "/policies/default.lua" }
  local ids = {}
  for i = 1, #prompts do
    ids[i] = e:add{ prompt = prompts[i], max_tokens = MAX, temperature = 0, ignore_eos = true }
  end
  e:run()
  local s = e:stats()
  local toks = {}
  for i = 1, #prompts do toks[i] = table.concat(e:result(ids[i]).tokens, ",") end
  e:close()
  return { secs = s.time_total, tput = #prompts * MAX / s.time_total, drafted = s.spec_drafted,
           accepted = s.spec_accepted, steps = s.steps, toks = toks }
end

print(("n-gram speculation: greedy, %d tokens per request, best of %d rounds"):format(MAX, ROUNDS))
print(("%-5s %4s | %10s | %s"):format("load", "seqs", "off tok/s",
  "spec_tokens 2 / 4 / 8 / 4 at any batch: tok/s (ratio to off, acceptance)"))
local rows = {}
local progress = bench.progress(2 * 2 * ROUNDS * #settings, "spec runs")
for _, name in ipairs({ "copy", "free" }) do
  for _, seqs in ipairs({ 1, 8 }) do
    local prompts = workloads[name]
    local best, ref = {}, nil
    for _ = 1, ROUNDS do
      for si, set in ipairs(settings) do
        local r = run(prompts, seqs, set)
        progress:step()
        ref = ref or r
        for i = 1, #prompts do
          assert(r.toks[i] == ref.toks[i], ("%s, %d seqs, spec %d: request %d differs from speculation off")
            :format(name, seqs, set.k, i))
        end
        if not best[si] or r.tput > best[si].tput then best[si] = r end
      end
    end
    local cols = {}
    for si = 2, #settings do
      local b = best[si]
      local set = settings[si]
      rows[#rows + 1] = { workload = name, seqs = seqs, temperature = 0,
                          setting = ("ngram k%d%s"):format(set.k, set.always and " any batch" or ""),
                          tok_s = b.tput, off_tok_s = best[1].tput, ratio = b.tput / best[1].tput,
                          drafted = b.drafted, accepted = b.accepted }
      cols[#cols + 1] = ("%.1f (%.2fx, %.0f%% of %d)"):format(b.tput, b.tput / best[1].tput,
                                                            100 * b.accepted / math.max(b.drafted, 1), b.drafted)
    end
    print(("%-5s %4d | %10.1f | %s"):format(name, seqs, best[1].tput, table.concat(cols, "  ")))
  end
end
progress:done()
print("every run's tokens were identical to speculation off")
bench.finish(opts, { bench = "spec", mode = "ngram", max_tokens = MAX, rounds = ROUNDS, rows = rows })
