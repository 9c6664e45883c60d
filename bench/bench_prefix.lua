-- bench_prefix.lua — prefix caching off vs on, side by side in one run, on
-- four workloads; prints TTFT p50/p90 for each and the reduction, plus the
-- end-to-end throughput effect at concurrency 8.
--
--   ./build/luainfer run bench/bench_prefix.lua [REQUESTS_PER_SCENARIO] [ttft|lpm|both] [SCALE] [--json FILE] [--plot FILE]
-- (the second argument runs only one of the two parts; SCALE, default 1,
-- multiplies the four scenarios' text lengths, so a test can run small; the
-- lpm part keeps its sizes, which are set against its pool; --plot draws
-- TTFT p50/p90 with and without the cache per scenario)
--
-- TTFT is measured in the engine (first token time - arrival) with requests
-- arriving one after another (concurrency 1), so it is the prefill the cache
-- saves and nothing else; outputs are 8 greedy tokens.
local luainfer = require("luainfer")
local bench = require("luainfer.bench")
local opts = bench.options(arg)
local N = tonumber(arg[1]) or 12
local results = { bench = "prefix", n_requests = N, rows = {} }

local vocab = { "the", "market", "of", "river", "town", "grew", "slowly", "while", "merchants", "traded",
  "grain", "and", "salt", "under", "bright", "lanterns", "every", "evening", "a", "council", "met", "to",
  "settle", "disputes", "about", "water", "rights", "bridges", "taxes", "weather", "harvest", "roads" }
local seed = 7
local function rnd(n) seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n end
local SCALE = tonumber(arg[3]) or 1
assert(SCALE > 0, "SCALE must be a number > 0")
local scale = SCALE -- the lpm part sets it back to 1
local function text(words)
  local t = {}
  for i = 1, math.max(1, math.floor(words * scale + 0.5)) do t[i] = vocab[rnd(#vocab) + 1] end
  return table.concat(t, " ")
end

local function pct(xs, p)
  local s = {}
  for i, x in ipairs(xs) do s[i] = x end
  table.sort(s)
  return s[math.max(1, math.ceil(p * #s))]
end

-- each scenario returns a function(i, prev_output) -> prompt
local scenarios = {
  { name = "system prompt", shared = "hundreds",
    make = function() local sys = "System: " .. text(330) .. "\n"
      return function(i) return sys .. "User: question " .. i .. " " .. text(8) .. "\nAssistant:" end end },
  { name = "RAG document", shared = "thousands",
    make = function() local doc = "Document:\n" .. text(1900) .. "\n"
      return function(i) return doc .. "Question " .. i .. ": " .. text(10) .. "?\nAnswer:" end end },
  { name = "multi-turn chat", shared = "history",
    make = function() local hist = "User: " .. text(40) .. "\n"
      return function(i, prev)
        if prev then hist = hist .. "Assistant:" .. prev .. "\nUser: " .. text(25) .. "\n" end
        return hist .. "Assistant:" end end },
  { name = "few-shot", shared = "hundreds",
    make = function() local shots = {}
      for k = 1, 8 do shots[k] = "Input: " .. text(20) .. "\nOutput: " .. text(12) end
      local ex = table.concat(shots, "\n") .. "\n"
      return function(i) return ex .. "Input: " .. text(20) .. "\nOutput:" end end },
}

local function run_ttft(sc, caching)
  seed = 7
  local e = luainfer.engine{ prefix_caching = caching, max_num_seqs = 1, max_batched_tokens = 512,
                             kv_memory = 256 * 1024 * 1024 }
  local prompt_of = sc.make()
  local ttft, prev, ptoks, hits = {}, nil, 0, 0
  for i = 1, N do
    local _, r = luainfer.generate(e, prompt_of(i, prev), { max_tokens = 8, temperature = 0, ignore_eos = true })
    ttft[#ttft + 1] = r.ttft * 1000
    prev = r.text
    ptoks = ptoks + r.prompt_tokens
    hits = hits + r.cached_tokens
  end
  e:close()
  -- the first request of a scenario fills the cache; TTFT over the rest
  table.remove(ttft, 1)
  return { p50 = pct(ttft, 0.5), p90 = pct(ttft, 0.9), prompt = ptoks / N, hit = hits / ptoks }
end

local function run_tput(sc, caching)
  seed = 7
  local e = luainfer.engine{ prefix_caching = caching, max_num_seqs = 8, max_batched_tokens = 512,
                             kv_memory = 256 * 1024 * 1024 }
  local prompt_of = sc.make()
  local ids = {}
  for i = 1, N do ids[i] = e:add{ prompt = prompt_of(i, "ok"), max_tokens = 32, temperature = 0, ignore_eos = true } end
  e:run()
  local s = e:stats()
  local gen = 0
  for _, id in ipairs(ids) do gen = gen + #e:result(id).tokens end
  e:close()
  return gen / s.time_total
end

local only = arg[2]
if only ~= "lpm" then
print(("prefix caching, %d requests per scenario, TTFT over requests 2..N (ms)"):format(N))
print(("%-16s %-9s %7s | %8s %8s | %8s %8s | %7s %7s | %6s | %s"):format("scenario", "shared", "prompt",
  "off p50", "off p90", "on p50", "on p90", "red p50", "red p90", "hit", "tput on/off @8"))
local progress = bench.progress(#scenarios, "prefix scenarios")
for _, sc in ipairs(scenarios) do
  local off, on = run_ttft(sc, false), run_ttft(sc, true)
  local t_off, t_on = run_tput(sc, false), run_tput(sc, true)
  progress:step()
  print(("%-16s %-9s %7.0f | %8.1f %8.1f | %8.1f %8.1f | %6.0f%% %6.0f%% | %5.0f%% | %.2fx"):format(
    sc.name, sc.shared, on.prompt, off.p50, off.p90, on.p50, on.p90,
    100 * (1 - on.p50 / off.p50), 100 * (1 - on.p90 / off.p90), 100 * on.hit, t_on / t_off))
  results.rows[#results.rows + 1] = { scenario = sc.name, shared = sc.shared, prompt = on.prompt,
    off_p50 = off.p50, off_p90 = off.p90, on_p50 = on.p50, on_p90 = on.p90, hit = on.hit, tput_on_off = t_on / t_off }
end
progress:done()
end

-- lpm.lua versus default.lua: several distinct shared prefixes interleaved
-- in arrival order, a KV pool too small to cache them all at once. All
-- requests arrive together; both runs see the same requests.
local root = opts.root
local function run_lpm(policy)
  scale = 1
  seed = 11
  local prefixes = {}
  for k = 1, 4 do prefixes[k] = "Context " .. k .. ": " .. text(260) .. "\n" end
  local e = luainfer.engine{ policy = root .. "/policies/" .. policy .. ".lua", max_num_seqs = 4,
                             max_batched_tokens = 512, kv_memory = 2 * 30 * 3 * 64 * 2 * 16 * 48 }
  local ids = {}
  for i = 1, 4 * N do
    ids[i] = e:add{ prompt = prefixes[(i - 1) % 4 + 1] .. "Q" .. i .. ": " .. text(6) .. "?", max_tokens = 8,
                    temperature = 0, ignore_eos = true }
  end
  e:run()
  local s = e:stats()
  local ttft = {}
  for i, id in ipairs(ids) do ttft[i] = e:result(id).ttft end
  e:close()
  return s, pct(ttft, 0.5), pct(ttft, 0.9)
end
if only == "ttft" then
  bench.finish(opts, results)
  return
end
local sd, d50, d90 = run_lpm("default")
local sl, l50, l90 = run_lpm("lpm")
print(("\nmixed prefixes (%d requests, 4 prefixes of ~300 tokens, pool of 48 blocks):"):format(4 * N))
print(("  default.lua: %.1f s, hit rate %.0f%%, TTFT p50 %.2f s p90 %.2f s"):format(sd.time_total, 100 * sd.prefix_hit_rate, d50, d90))
print(("  lpm.lua:     %.1f s, hit rate %.0f%%, TTFT p50 %.2f s p90 %.2f s"):format(sl.time_total, 100 * sl.prefix_hit_rate, l50, l90))
print(("  lpm/default throughput: %.2fx"):format(sd.time_total / sl.time_total))
results.lpm = { default_s = sd.time_total, lpm_s = sl.time_total, default_hit = sd.prefix_hit_rate,
                lpm_hit = sl.prefix_hit_rate, default_p50 = d50, lpm_p50 = l50 }
bench.finish(opts, results)
