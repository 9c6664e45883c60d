-- bench_cpu.lua — luainfer's side of bench/bench_llama_cpp.py: prefill,
-- single-stream decode and batched decode speed through the engine, timed
-- step by step with a monotonic clock.
--
--   ./build/luainfer run bench/bench_cpu.lua [PREFILL] [DECODE] [SEQS...] [--json FILE]
--
-- Defaults: a 512-token prompt, 128 decoded tokens, batches of 8 and 32
-- sequences. Prompts are synthetic token ids (the same formula as the
-- Python driver feeds llama.cpp); decoding is greedy with ignore_eos.
-- Prints one "RESULT name value" line per measurement (tokens/s); --json
-- writes them, --plot draws them as bars.
local luainfer = require("luainfer")
local bench = require("luainfer.bench")
local opts = bench.options(arg)
local now = bench.now

local PREFILL = tonumber(arg[1]) or 512
local DECODE = tonumber(arg[2]) or 128
local SEQS = {}
for i = 3, #arg do SEQS[#SEQS + 1] = tonumber(arg[i]) end
if #SEQS == 0 then SEQS = { 8, 32 } end
local THREADS = tonumber(os.getenv("LUAINFER_THREADS") or "2")
local ISA = os.getenv("LUAINFER_ISA") or "auto" -- "ggml": llama.cpp's arithmetic

-- token ids of prompt s, length n: deterministic, spread over the vocabulary
local function prompt(s, n)
  local t = {}
  for i = 1, n do t[i] = 100 + (i * 7919 + s * 104729) % 40000 end
  return t
end

local function engine(max_seqs)
  return luainfer.engine{ threads = THREADS, isa = ISA, max_num_seqs = max_seqs, max_batched_tokens = 512,
                          kv_memory = 256 * 1024 * 1024, prefix_caching = false }
end

local function median(xs)
  table.sort(xs)
  return xs[math.floor((#xs + 1) / 2)]
end

local progress = bench.progress(2 + #SEQS, "cpu phases") -- prefill, decode, each batch size

-- Prefill: one step computes the whole prompt (and the first token).
local prefill_rate
do
  local e = engine(1)
  local rates = {}
  for rep = 1, 4 do
    local id = e:add{ tokens = prompt(rep, PREFILL), max_tokens = 1, temperature = 0, ignore_eos = true }
    local t0 = now()
    e:step()
    local dt = now() - t0
    assert(e:result(id).finished, "prefill took more than one step")
    e:release(id)
    if rep > 1 then rates[#rates + 1] = PREFILL / dt end -- the first warms up
  end
  prefill_rate = median(rates)
  progress:step()
  print(("RESULT prefill %.2f"):format(prefill_rate))
  e:close()
end

-- Decode: S sequences with 16-token prompts; the first step prefills them
-- all, the next DECODE steps each decode one token of every sequence.
local function decode(S)
  local e = engine(math.max(S, 1))
  local best = 0
  for rep = 1, 2 do
    local ids = {}
    for s = 1, S do
      ids[s] = e:add{ tokens = prompt(1000 * rep + s, 16), max_tokens = DECODE + 1, temperature = 0, ignore_eos = true }
    end
    e:step() -- prefill + first tokens
    local t0 = now()
    for _ = 1, DECODE do e:step() end
    local dt = now() - t0
    for s = 1, S do
      local r = e:result(ids[s])
      assert(r.finished and #r.tokens == DECODE + 1, "a sequence did not decode every step")
      e:release(ids[s])
    end
    best = math.max(best, S * DECODE / dt)
  end
  e:close()
  return best
end

local results = { bench = "cpu", prefill_tokens = PREFILL, decode_tokens = DECODE, threads = THREADS, isa = ISA,
                  tokens_per_s = { prefill = prefill_rate } }
results.tokens_per_s.decode = decode(1)
progress:step()
print(("RESULT decode %.2f"):format(results.tokens_per_s.decode))
for _, S in ipairs(SEQS) do
  local r = decode(S)
  progress:step()
  results.tokens_per_s["batched" .. S] = r
  print(("RESULT batched%d %.2f"):format(S, r))
end
progress:done()
results.rows = { { name = ("prefill %d"):format(PREFILL), tokens_per_s = results.tokens_per_s.prefill },
                 { name = "decode 1", tokens_per_s = results.tokens_per_s.decode } }
for _, S in ipairs(SEQS) do
  results.rows[#results.rows + 1] = { name = ("batched %d"):format(S), tokens_per_s = results.tokens_per_s["batched" .. S] }
end
results.chart = { label = "name", values = { "tokens_per_s" }, ylabel = "tokens/s", log = true,
                  title = ("luainfer on the CPU: %d threads, isa %s"):format(THREADS, ISA) }
bench.finish(opts, results)
