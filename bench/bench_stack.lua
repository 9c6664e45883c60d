-- bench_stack.lua — the seed's stacking table (issue 19): one workload, one
-- engine per row, each row adding one thing to the row above it.
--
--   ./build/luainfer bench stack [MAX_TOKENS] [ROUNDS] [W8A8.gguf] [--requests N] [--seqs S]
--                                [--json FILE] [--plot FILE]
--
-- Rows:
--   1. Q4_1 single stream: one request at a time (max_num_seqs 1), no
--      prefix caching, no speculation;
--   2. + continuous batching: S requests at once (max_num_seqs S, default 4);
--   3. + prefix caching;
--   4. + speculation: n-gram (prompt lookup), k 8, at any batch size
--      (spec_disable_batch 0);
--   5. the same speculation chosen by policies/spec_adaptive.lua (n-gram,
--      k from acceptance and the measured step costs, off where it would
--      slow the batch);
--   6. + W8A8: row 5's settings on W8A8.gguf (`luainfer quantize --method
--      w8a8` of the model's f16 expansion, docs/quantization.md). Without
--      the third argument the row is skipped, saying why.
--
-- The workload: N requests (default 8), all added at the start (an offline
-- batch), each a chat turn that shares one system prompt holding a short
-- document and asks for an edit of it (input-grounded: the answer copies
-- much of the prompt), greedy, ignore_eos, MAX_TOKENS tokens each (default
-- 128). Tokens/s is generated tokens over the engine's time (time_total).
--
-- Each round runs every row once, the starting row rotating from round to
-- round so no row always runs first; a row's ratio is taken to row 1 of the
-- same round, and the table shows the median tok/s and the median ratio.
-- Rows 1-5 run one model with batch-invariant kernels, so the program
-- asserts that their tokens are identical; row 6 is another model and only
-- counts the requests whose tokens equal row 5's. The load average (from
-- /proc/loadavg) is printed at the start and the end: wall-clock ratios
-- taken on a loaded machine are noise.
--
-- Beside the timings, what does not depend on the machine's load: tokens
-- computed by the forward passes (prompts less cache hits, plus verified
-- drafts), prefix-cache hit tokens, drafts accepted of drafted, and steps.
--
-- --json writes every row (name, median tok/s, median ratio, every round's
-- tok/s and ratio, tokens computed, prefix-cache hit tokens, drafted,
-- accepted, steps) and the load averages; --plot draws the median tok/s of
-- each row.
local luainfer = require("luainfer")
local bench = require("luainfer.bench")
local opts = bench.options(arg)
local flags = bench.take_flags(arg, { ["--requests"] = "count", ["--seqs"] = "count" })  -- this bench's own
local N, SEQS = flags["--requests"] or 8, flags["--seqs"] or 4
local MAX = tonumber(arg[1]) or 128
local ROUNDS = tonumber(arg[2]) or 3
local W8A8 = arg[3]
if not (MAX >= 1 and ROUNDS >= 1) then error("MAX_TOKENS and ROUNDS must be numbers >= 1", 0) end
if W8A8 then
  local f = io.open(W8A8, "rb")
  if not f then error(("W8A8 model '%s' cannot be opened"):format(W8A8), 0) end
  f:close()
end

local loadavg = bench.loadavg

-- ---- the workload ----------------------------------------------------------------
local doc = '{"id": 1042, "name": "Ada Lovelace", "born": 1815, "city": "London", ' ..
  '"fields": ["mathematics", "computing"], "notes": "wrote the first published algorithm for a machine", ' ..
  '"letters": 87, "status": "archived"}\n' ..
  "The river ran past the old mills and the quiet farms, while the children counted the boats under a grey " ..
  "sky of late autumn. In the evening the lamps were lit along the bank, and the ferryman called the last " ..
  "crossing of the day."
local system = "<|im_start|>system\nYou are an editor. You get a record and a paragraph, and you make exactly " ..
  "the change asked for, then output the whole record and the whole paragraph again, unchanged otherwise.\n" ..
  "Record and paragraph:\n" .. doc .. "<|im_end|>\n"
local asks = {
  'Change the city to "Paris".', "Change the born year to 1816.", 'Set the status to "open".',
  "Change the letters count to 88.", 'Rename the person to "Augusta Ada King".', 'Add "poetry" to the fields.',
  'Change "grey sky" to "pale sky" in the paragraph.', "Change the id to 2042.",
}
local prompts = {}
for i = 1, N do
  prompts[i] = system .. "<|im_start|>user\n" .. asks[(i - 1) % #asks + 1] ..
    (i > #asks and (" (request %d)"):format(i) or "") .. "<|im_end|>\n<|im_start|>assistant\n"
end

-- ---- the rows ----------------------------------------------------------------------
local base = { max_batched_tokens = 512 }
local root = arg[0]:match("^(.*)/bench/") or "."
local ADAPTIVE = root .. "/policies/spec_adaptive.lua"
local rows = {
  { name = "Q4_1 single stream", cfg = { max_num_seqs = 1, prefix_caching = false } },
  { name = "+ continuous batching", cfg = { max_num_seqs = SEQS, prefix_caching = false } },
  { name = "+ prefix caching", cfg = { max_num_seqs = SEQS, prefix_caching = true } },
  { name = "+ speculation (n-gram k8)", cfg = { max_num_seqs = SEQS, prefix_caching = true, spec_tokens = 8,
                                              spec_method = "ngram", spec_disable_batch = 0 } },
  { name = "+ speculation (adaptive)", cfg = { max_num_seqs = SEQS, prefix_caching = true, spec_tokens = 8,
                                             spec_method = "ngram", spec_disable_batch = 0, policy = ADAPTIVE } },
}
local SAME = #rows -- the rows that run the one model
if W8A8 then
  rows[#rows + 1] = { name = "+ W8A8", cfg = { max_num_seqs = SEQS, prefix_caching = true, spec_tokens = 8,
                                               spec_method = "ngram", spec_disable_batch = 0, policy = ADAPTIVE,
                                               model = W8A8 } }
end

local function run(row)
  local cfg = {}
  for k, v in pairs(base) do cfg[k] = v end
  for k, v in pairs(row.cfg) do cfg[k] = v end
  local e = luainfer.engine(cfg)
  local ids = {}
  for i = 1, N do
    ids[i] = e:add{ prompt = prompts[i], max_tokens = MAX, temperature = 0, ignore_eos = true }
  end
  e:run()
  local s = e:stats()
  local toks, n = bench.outputs(e, ids)
  e:close()
  return { tput = n / s.time_total, tokens = n, computed = s.tokens_computed, hit = s.prefix_hit_tokens,
           drafted = s.spec_drafted,
           accepted = s.spec_accepted, steps = s.steps, toks = toks }
end

local median = bench.median

local load_start = loadavg()
print(("stacking table: %d requests sharing a system prompt, %d tokens each (greedy), %d at once from row 2, " ..
  "%d rounds; load average %s"):format(N, MAX, SEQS, ROUNDS, load_start))
if not W8A8 then print("(+ W8A8 skipped: give the W8A8 model as the third argument, see docs/benchmarks.md)") end
local progress = bench.progress(ROUNDS * #rows, "stack")
local got = {} -- got[row][round]
for ri = 1, #rows do got[ri] = {} end
local ref -- row 1's tokens
for round = 1, ROUNDS do
  for j = 0, #rows - 1 do
    local ri = (round - 1 + j) % #rows + 1
    local r = run(rows[ri])
    got[ri][round] = r
    progress:step()
  end
  ref = ref or got[1][1].toks
  for ri = 1, SAME do
    for i = 1, N do
      assert(got[ri][round].toks[i] == ref[i], ("round %d, %s: request %d's tokens differ from the single stream's")
        :format(round, rows[ri].name, i))
    end
  end
end
progress:done()
local load_end = loadavg()

local out = {}
print(("%-28s %10s %8s %9s %12s %14s %7s"):format("row", "tok/s", "ratio", "computed", "prefix hits", "accepted",
  "steps"))
for ri, row in ipairs(rows) do
  local tps, ratios = {}, {}
  for round = 1, ROUNDS do
    tps[round] = got[ri][round].tput
    ratios[round] = got[ri][round].tput / got[1][round].tput
  end
  local last = got[ri][ROUNDS]
  local o = { name = row.name, tok_s = median(tps), ratio = median(ratios), rounds_tok_s = tps, rounds_ratio = ratios,
              computed = last.computed, prefix_hit_tokens = last.hit, drafted = last.drafted, accepted = last.accepted, steps = last.steps,
              tokens = last.tokens }
  if ri > SAME then
    local same = 0
    for i = 1, N do same = same + (last.toks[i] == got[SAME][ROUNDS].toks[i] and 1 or 0) end
    o.same_tokens_as_row5 = same
  end
  out[#out + 1] = o
  print(("%-28s %10.1f %7.2fx %9d %12d %14s %7d%s"):format(row.name, o.tok_s, o.ratio, o.computed, o.prefix_hit_tokens,
    o.drafted > 0 and ("%d/%d (%.0f%%)"):format(o.accepted, o.drafted, 100 * o.accepted / o.drafted) or "-",
    o.steps, o.same_tokens_as_row5 and ("  (%d of %d requests as row 5)"):format(o.same_tokens_as_row5, N) or ""))
end
print(("rows 1-%d: every request's tokens identical to the single stream's; load average %s at the end")
  :format(SAME, load_end))
bench.finish(opts, { bench = "stack", requests = N, seqs = SEQS, max_tokens = MAX, rounds = ROUNDS, w8a8 = W8A8,
                     load_start = load_start, load_end = load_end, rows = out,
                     chart = { label = "name", values = { "tok_s" }, ylabel = "tokens/s (median of rounds)",
                               title = ("stacking: %d requests x %d tokens, %d at once"):format(N, MAX, SEQS) } })
