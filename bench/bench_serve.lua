-- bench_serve.lua — the in-process half of bench/bench_serve.py: the same
-- requests through the same engine, no server in between.
--
--   luainfer run bench/bench_serve.lua PROMPTS.txt OUTPUT_LEN THREADS MAX_NUM_SEQS MAX_BATCHED_TOKENS KV_MEMORY [POLICY]
--
-- PROMPTS.txt holds one request per line as space-separated token ids. All
-- requests are added at once (what the server sees at request rate inf),
-- greedy, ignore_eos, OUTPUT_LEN tokens each. Prints one JSON line:
-- {"requests", "output_tokens", "prompt_tokens", "duration_s", "ttft_p50_ms", ...}.

local luainfer = require("luainfer")

local path, out_len, threads, max_num_seqs, max_batched, kv_memory, policy = ...
assert(path and out_len, "usage: bench_serve.lua PROMPTS.txt OUTPUT_LEN THREADS MAX_NUM_SEQS MAX_BATCHED_TOKENS KV_MEMORY [POLICY]")
out_len = tonumber(out_len)

local prompts = {}
for line in io.lines(path) do
  local toks = {}
  for t in line:gmatch("%d+") do toks[#toks + 1] = tonumber(t) end
  if #toks > 0 then prompts[#prompts + 1] = toks end
end

local e = luainfer.engine{
  threads = tonumber(threads) or 0, max_num_seqs = tonumber(max_num_seqs), max_batched_tokens = tonumber(max_batched),
  kv_memory = tonumber(kv_memory), policy = policy ~= "" and policy or nil,
}

-- warm-up: one short request (first-touch of the weights), not timed
local w = e:add{ tokens = prompts[1], max_tokens = 2, temperature = 0 }
e:run()
e:release(w)

local clock = require("luainfer.bench").now -- wall time, not CPU time

local t0 = clock()
local ids = {}
for i, p in ipairs(prompts) do
  ids[i] = e:add{ tokens = p, max_tokens = out_len, temperature = 0, ignore_eos = true }
end
e:run()
local dt = clock() - t0

local out_tokens, prompt_tokens, ttft, lat = 0, 0, {}, {}
for i, id in ipairs(ids) do
  local r = e:result(id)
  out_tokens = out_tokens + #r.tokens
  prompt_tokens = prompt_tokens + r.prompt_tokens
  ttft[#ttft + 1] = (r.ttft or 0) * 1e3
  lat[#lat + 1] = (r.latency or 0) * 1e3
  e:release(id)
end
local function pct(t, p)
  table.sort(t)
  return t[math.max(1, math.min(#t, math.floor(p / 100 * #t + 0.5)))]
end
print(string.format(
  '{"requests": %d, "output_tokens": %d, "prompt_tokens": %d, "duration_s": %.6f, "ttft_p50_ms": %.3f, "ttft_p99_ms": %.3f, "e2e_p50_ms": %.3f, "e2e_p99_ms": %.3f}',
  #ids, out_tokens, prompt_tokens, dt, pct(ttft, 50), pct(ttft, 99), pct(lat, 50), pct(lat, 99)))
