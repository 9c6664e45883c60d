-- bench_quant_speed.lua — one model's speed for bench/bench_quant.py's
-- speed table: prefill of one ~512-token prompt, decode of 1 sequence, and
-- batched decode of 8 and 32 sequences (greedy, ignore_eos). Forward time
-- only (the engine's time_forward), best of ROUNDS. Prints one JSON line.
--
--   LUAINFER_MODEL=M.gguf ./build/luainfer run bench/bench_quant_speed.lua [DECODE_STEPS] [ROUNDS] [ISA] [Q4_ACT]
--
-- Q4_ACT: f32 (A16, default) or int8 (A8) for 4-bit group weights.
local luainfer = require("luainfer")
require("luainfer.bench").options(arg) -- --help
local root = (arg[0]:match("^(.*)/bench/") or ".")
local STEPS = tonumber(arg[1]) or 16
local ROUNDS = tonumber(arg[2]) or 1
local ISA = arg[3] or "auto"
local Q4_ACT = arg[4] or "f32"

local words = { "data", "engine", "river", "policy", "cache", "block", "stream", "token", "lua", "kernel",
                "batch", "queue", "model", "vector", "prefix", "server" }
local function prompt(n, seed)
  local t = {}
  for i = 1, n do t[i] = words[(i * 7 + seed) % #words + 1] end
  return table.concat(t, " ")
end

local function engine(n)
  return luainfer.engine{ policy = root .. "/policies/default.lua", max_num_seqs = n, isa = ISA, q4_act = Q4_ACT,
                          max_batched_tokens = 4096, kv_memory = 256 * 1024 * 1024 }
end

-- prefill: tokens per second of one prompt's single forward step
local function prefill()
  local e = engine(1)
  e:add{ prompt = prompt(510, 1), max_tokens = 1, temperature = 0, ignore_eos = true }
  local s0 = e:stats()
  e:step()
  local s1 = e:stats()
  e:close()
  return (s1.tokens_computed - s0.tokens_computed) / (s1.time_forward - s0.time_forward)
end

-- decode of n sequences: generated tokens per second after their prefill
local function decode(n)
  local e = engine(n)
  for i = 1, n do
    e:add{ prompt = ("Request %d: %s"):format(i, prompt(8, i)), max_tokens = STEPS + 1, temperature = 0,
           ignore_eos = true }
  end
  e:step()
  local s0 = e:stats()
  e:run()
  local s1 = e:stats()
  e:close()
  return (s1.tokens_computed - s0.tokens_computed) / (s1.time_forward - s0.time_forward)
end

local best = {}
local function keep(k, v) best[k] = math.max(best[k] or 0, v) end
for _ = 1, ROUNDS do
  keep("prefill_512", prefill())
  keep("decode_1", decode(1))
  keep("batched_8", decode(8))
  keep("batched_32", decode(32))
end
print(('{"prefill_512": %.2f, "decode_1": %.2f, "batched_8": %.2f, "batched_32": %.2f}')
  :format(best.prefill_512, best.decode_1, best.batched_8, best.batched_32))
