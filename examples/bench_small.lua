-- bench_small.lua — a small benchmark: the same 16 greedy requests
-- run one at a time and then all batched, alternating for a few rounds, and
-- the ratio of their throughputs printed. Start here to measure your own
-- policy or setting: change `configs`.
--
--   ./build/luainfer run examples/bench_small.lua [ROUNDS] [TOKENS]
local luainfer = require("luainfer")
local ROUNDS, TOKENS = tonumber(arg[1]) or 2, tonumber(arg[2]) or 24

local configs = {
  { name = "one at a time", max_num_seqs = 1 },
  { name = "batched (16)", max_num_seqs = 16 },
}

local function run(cfg)
  local e = luainfer.engine{ policy = "policies/default.lua", max_num_seqs = cfg.max_num_seqs }
  local ids = {}
  for i = 1, 16 do
    ids[i] = e:add{ prompt = "Request " .. i .. ": list some prime numbers.", max_tokens = TOKENS,
                    temperature = 0, ignore_eos = true }
  end
  while e:has_work() do e:step() end
  local s, texts = e:stats(), {}
  for i, id in ipairs(ids) do texts[i] = e:result(id).text end
  e:close()
  return s.tokens_generated / s.time_total, texts
end

local sum = { 0, 0 }
local ref
for round = 1, ROUNDS do
  for c, cfg in ipairs(configs) do -- alternating, so drift hits both alike
    local tps, texts = run(cfg)
    sum[c] = sum[c] + tps
    ref = ref or texts
    for i = 1, #texts do assert(texts[i] == ref[i], "outputs differ between configurations") end
    print(("round %d  %-14s %7.1f tok/s"):format(round, cfg.name, tps))
  end
end
print(("batched / one at a time: %.2fx (mean of %d rounds; outputs identical)"):format(sum[2] / sum[1], ROUNDS))
