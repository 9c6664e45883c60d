-- bench_sample_where.lua — sampling where the logits are (device_sampling)
-- against copying every row's logits back, side by side in one run,
-- alternating, for a few sampling settings: decode tokens/s, and how many
-- tokens the device's candidates decided (docs/cuda.md, "Sampling on the
-- device").
--
--   ./build/luainfer run bench/bench_sample_where.lua [N_SEQS] [NEW_TOKENS] [ROUNDS]
--                                                     [--device cpu|cuda] [--json FILE]
--                                                     default 64, 64, 2
--
-- N_SEQS requests of one 24-word prompt each (the same prompt: one prefill,
-- then shared blocks) decode NEW_TOKENS tokens at once (ignore_eos), a run
-- per setting and mode; the rounds alternate the modes. On the CPU the
-- logits are host memory: both modes are the same code (a control).
local luainfer = require("luainfer")
local bench = require("luainfer.bench")
local DEVICE = bench.take_flags(arg, { ["--device"] = "value" })["--device"]
local opts = bench.options(arg)
local N = tonumber(arg[1]) or 64
local NEW = tonumber(arg[2]) or 64
local ROUNDS = tonumber(arg[3]) or 2
assert(N >= 1 and N <= 256 and NEW >= 1 and NEW <= 1024 and ROUNDS >= 1,
       "N_SEQS in 1..256, NEW_TOKENS in 1..1024, ROUNDS >= 1")

local settings = {
  { name = "greedy", temperature = 0 },
  { name = "T 0.7, top_p 0.9", temperature = 0.7, top_p = 0.9, top_k = 0, min_p = 0 },
  { name = "T 1.0 (OpenAI's default)", temperature = 1.0, top_p = 1.0, top_k = 0, min_p = 0 },
  { name = "llama.cpp's defaults + repeat_penalty 1.1", temperature = 0.8, repeat_penalty = 1.1 },
}
local prompt = "The river ran past the old mill where the engine of the town had turned for a hundred years, "
  .. "and the people who lived by it"

local function run(set, on)
  local e = luainfer.engine{ max_num_seqs = N, max_batched_tokens = 512, kv_memory = 256 * 1024 * 1024,
                             device = DEVICE, device_sampling = on }
  local ids = {}
  for i = 1, N do
    local r = { prompt = prompt, max_tokens = NEW, ignore_eos = true, seed = i }
    for k, v in pairs(set) do if k ~= "name" then r[k] = v end end
    ids[i] = e:add(r)
  end
  e:run()
  local s = e:stats()
  local gen = 0
  for _, id in ipairs(ids) do gen = gen + #e:result(id).tokens end
  e:close()
  return { tput = gen / s.time_total, dev = s.tokens_device_sampled, und = s.tokens_device_undecided, gen = gen }
end

print(("%d sequences x %d new tokens, device %s, %d rounds alternating"):format(N, NEW, DEVICE or "cpu", ROUNDS))
print(("%-42s %12s %12s %8s %10s %10s"):format("setting", "on tok/s", "off tok/s", "on/off", "decided", "undecided"))
local rows = {}
local progress = bench.progress(#settings * ROUNDS * 2, "sampling runs")
for _, set in ipairs(settings) do
  local on, off = {}, {}
  local dev, und, gen = 0, 0, 0
  for _ = 1, ROUNDS do
    local a = run(set, true)
    progress:step()
    local b = run(set, false)
    progress:step()
    on[#on + 1], off[#off + 1] = a.tput, b.tput
    dev, und, gen = dev + a.dev, und + a.und, gen + a.gen
  end
  table.sort(on)
  table.sort(off)
  local m_on, m_off = on[#on], off[#off] -- best of the rounds
  print(("%-42s %12.1f %12.1f %7.2fx %9.1f%% %9.1f%%"):format(set.name, m_on, m_off, m_on / m_off,
    100 * dev / gen, 100 * und / gen))
  rows[#rows + 1] = { setting = set.name, on_tok_s = m_on, off_tok_s = m_off, ratio = m_on / m_off,
                      decided_pct = 100 * dev / gen, undecided_pct = 100 * und / gen }
end
progress:done()
bench.finish(opts, { bench = "sample_where", n_seqs = N, new_tokens = NEW, device = DEVICE or "cpu", rows = rows,
                     chart = { label = "setting", values = { "on_tok_s", "off_tok_s" }, ylabel = "tokens/s",
                               title = "Sampling where the logits are (on) against copying them back (off)" } })
