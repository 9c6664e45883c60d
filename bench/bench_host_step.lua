-- bench_host_step.lua — what a decode step costs the host beside its
-- forward pass (the sampler, the scheduler, the bookkeeping), for a few
-- sampling settings: one request of 32 prompt tokens decoding 128, the
-- engine's own clocks (stats: time_total less time_forward, per step).
--
--   ./build/luainfer run bench/bench_host_step.lua [MODEL] [--json FILE] [--plot FILE]
--
-- MODEL defaults to the default model. Compare builds by running each in
-- turn, alternating (docs/benchmarks.md, "Session 30"): the engine's
-- clocks, so the forward pass's noise stays out of "the rest".
local luainfer = require("luainfer")
local bench = require("luainfer.bench")
local opts = bench.options(arg)
local cfg = { threads = 2, max_num_seqs = 4, kv_memory = 256 * 1024 * 1024 }
if arg[1] then cfg.model = arg[1] end
local e = luainfer.engine(cfg)
local prompt = {}
for i = 1, 32 do prompt[i] = 100 + (i * 7919) % 40000 end
local sets = {
  { name = "greedy", temperature = 0 },
  { name = "T 0.8 top_k 40 top_p 0.95 min_p 0.05 (llama.cpp's)", temperature = 0.8, top_k = 40, top_p = 0.95,
    min_p = 0.05 },
  { name = "T 1 top_k 40", temperature = 1.0, top_k = 40, top_p = 1.0, min_p = 0.0 },
  { name = "T 1 top_k off (OpenAI's)", temperature = 1.0, top_k = 0, top_p = 1.0, min_p = 0.0 },
}
local rows = {}
local progress = bench.progress(#sets, "settings")
for _, s in ipairs(sets) do
  local id = e:add{ tokens = prompt, max_tokens = 129, temperature = s.temperature, top_k = s.top_k, top_p = s.top_p,
                    min_p = s.min_p, ignore_eos = true, seed = 7 }
  e:step() -- the prefill
  local s1 = e:stats()
  local n = 0
  while not e:result(id).finished do
    e:step()
    n = n + 1
  end
  local s2 = e:stats()
  local tot, fw = s2.time_total - s1.time_total, s2.time_forward - s1.time_forward
  local row = { setting = s.name, steps = n, step_us = tot / n * 1e6, forward_us = fw / n * 1e6,
                rest_us = (tot - fw) / n * 1e6 }
  rows[#rows + 1] = row
  progress:step()
  print(("%-52s %3d steps: step %7.1f us, forward %7.1f us, the rest %6.1f us"):format(
    s.name, n, row.step_us, row.forward_us, row.rest_us))
end
progress:done()
e:close()
bench.finish(opts, { bench = "host_step", rows = rows,
                     chart = { label = "setting", values = { "rest_us" }, ylabel = "host time a step (us)",
                               title = "a decode step's time beside its forward pass" } })
