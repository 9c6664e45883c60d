-- bench_tp.lua — tensor parallelism with threads as ranks: decode speed at
-- TP 1, 2 and 3 side by side, and the time in all-reduces.
--
--   ./build/luainfer run bench/bench_tp.lua [OUTPUT_TOKENS] [REPEATS] [BATCH] [--json FILE] [--plot FILE]
--
-- Each configuration decodes BATCH (default 1) greedy requests of
-- OUTPUT_TOKENS (default 48) tokens after a short prompt; the engines run
-- interleaved (1, 2, 3, 1, 2, 3, ...) REPEATS times (default 3) and the
-- fastest run counts. Decode tokens/s = generated tokens / seconds inside
-- the steps after the first (the prefill). all-reduce ms/step = rank 0's
-- time in all-reduces (waiting for the slowest rank included) per step.
-- On one CPU the ranks share the same cores, so TP > 1 is not expected to
-- be faster: this measures its overhead, the point of the CPU ranks being
-- that CI runs the sharded pass (docs/parallel.md).
local luainfer = require("luainfer")
local bench = require("luainfer.bench")
local opts = bench.options(arg)
local OUT = tonumber(arg[1]) or 48
local REPEATS = tonumber(arg[2]) or 3
local BATCH = tonumber(arg[3]) or 1
local PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."

local engines = {}
for _, tp in ipairs({ 1, 2, 3 }) do
  engines[tp] = luainfer.engine{ tensor_parallel = tp, max_num_seqs = BATCH, prefix_caching = false }
end

local function once(tp)
  local e = engines[tp]
  local ids = {}
  for i = 1, BATCH do
    ids[i] = e:add{ prompt = PROMPT, max_tokens = OUT, temperature = 0, ignore_eos = true }
  end
  e:step() -- the prefill
  local s0 = e:stats()
  local t0 = bench.now()
  while e:has_work() do e:step() end
  local dt = bench.now() - t0
  local s1 = e:stats()
  local gen = 0
  for _, id in ipairs(ids) do gen = gen + #e:result(id).tokens - 1; e:release(id) end
  local steps = s1.steps - s0.steps
  return gen / dt, (s1.time_allreduce - s0.time_allreduce) / math.max(steps, 1) * 1e3,
         (s1.time_forward - s0.time_forward) / math.max(steps, 1) * 1e3
end

local best = {}
local progress = bench.progress(3 * REPEATS, "tp runs")
for _ = 1, REPEATS do
  for _, tp in ipairs({ 1, 2, 3 }) do
    local tps, ar, fw = once(tp)
    if not best[tp] or tps > best[tp].tps then best[tp] = { tps = tps, ar = ar, fw = fw } end
    progress:step()
  end
end
progress:done()
print(string.format("decode, batch %d, %d tokens, best of %d interleaved runs", BATCH, OUT, REPEATS))
print(string.format("%-4s %10s %8s %14s %18s", "TP", "tok/s", "vs TP1", "forward ms/st", "all-reduce ms/st"))
for _, tp in ipairs({ 1, 2, 3 }) do
  local b = best[tp]
  print(string.format("%-4d %10.1f %8.2f %14.2f %18.2f", tp, b.tps, b.tps / best[1].tps, b.fw, b.ar))
end
for _, e in pairs(engines) do e:close() end
local rows = {}
for _, tp in ipairs({ 1, 2, 3 }) do
  local b = best[tp]
  rows[#rows + 1] = { name = "TP " .. tp, tp = tp, tokens_per_s = b.tps, vs_tp1 = b.tps / best[1].tps,
                      forward_ms_per_step = b.fw, allreduce_ms_per_step = b.ar }
end
bench.finish(opts, { bench = "tp", batch = BATCH, output_tokens = OUT, repeats = REPEATS, rows = rows,
                     chart = { label = "name", values = { "tokens_per_s" }, ylabel = "decode tokens/s",
                               title = ("tensor parallel on CPU threads, batch %d (best of %d)"):format(BATCH, REPEATS) } })
