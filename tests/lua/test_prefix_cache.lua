-- test_prefix_cache.lua — prefix caching on the real model:
--  * greedy outputs are identical with and without the cache (shared system
--    prompt, multi-turn history, few-shot);
--  * a repeated prompt is served from the cache (hit = whole blocks, at least
--    one token left to compute);
--  * cache_salt isolates tenants;
--  * a variable id at the front defeats the cache, at the end it does not;
--  * under memory pressure the cache shrinks, requests still finish right.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local H = require("harness")
local luainfer = require("luainfer")

local words = { "apple", "river", "stone", "cloud", "maple", "lantern", "harbor", "meadow", "copper", "violet",
                "thunder", "garden", "silver", "window", "forest", "candle" }
local system = "You are a careful assistant. Answer in one short sentence, cite no sources, and never " ..
               "invent facts. If you do not know, say so. Keep a friendly tone and avoid jargon. "
local questions = { "What is a cache?", "Why is the sky blue?", "What is a prime number?", "Name a river.",
                    "How do plants grow?", "What is rain?" }

local function workload()
  local reqs = {}
  for i, q in ipairs(questions) do reqs[#reqs + 1] = { prompt = system .. q, max_tokens = 10 } end
  local history = "User: hello there\nAssistant: Hi! How can I help?\n"
  for turn = 1, 4 do
    history = history .. "User: tell me fact number " .. turn .. "\nAssistant:"
    reqs[#reqs + 1] = { prompt = history, max_tokens = 8 }
    history = history .. " Fact " .. turn .. " is interesting.\n"
  end
  for _, r in ipairs(reqs) do r.temperature = 0; r.ignore_eos = true end
  return reqs
end

local function run(cfg, reqs, sequential)
  local e = luainfer.engine(cfg)
  local out = {}
  if sequential then
    for i, r in ipairs(reqs) do local _, res = luainfer.generate(e, r.prompt, r); out[i] = res end
  else
    local ids = {}
    for i, r in ipairs(reqs) do ids[i] = e:add(r) end
    e:run()
    for i, id in ipairs(ids) do out[i] = e:result(id) end
  end
  local s = e:stats()
  e:close()
  return out, s
end

local reqs = workload()
local off = run({ prefix_caching = false, max_num_seqs = 1 }, reqs, true)
local on, s = run({ prefix_caching = true, max_num_seqs = 1 }, reqs, true)
local same = 0
for i = 1, #reqs do if H.eq_list(on[i].tokens, off[i].tokens) then same = same + 1 end end
H.check(same == #reqs, "identical outputs with and without the cache: %d/%d", same, #reqs)
H.check(s.prefix_hit_tokens > 0, "the shared system prompt hit the cache (%d tokens)", s.prefix_hit_tokens)
print(("sequential: hit rate %.2f (%d of %d tokens), cached blocks %d"):format(s.prefix_hit_rate,
      s.prefix_hit_tokens, s.prefix_query_tokens, s.kv_cached_blocks))
local sys_len = #luainfer.engine{ max_num_seqs = 1 }:tokenize(system)
for i = 2, #questions do
  H.check(on[i].cached_tokens >= math.floor(sys_len / 16) * 16 - 16,
          "question %d reused the system prompt (%d cached, system %d tokens)", i, on[i].cached_tokens, sys_len)
end
H.check(on[#reqs].cached_tokens > 0, "multi-turn: the last turn reused the history (%d)", on[#reqs].cached_tokens)

-- concurrent: the same outputs as concurrent without the cache
local conc_off = run({ prefix_caching = false, max_num_seqs = 16 }, reqs, false)
local conc = run({ prefix_caching = true, max_num_seqs = 16, max_batched_tokens = 64 }, reqs, false)
same = 0
for i = 1, #reqs do if H.eq_list(conc[i].tokens, conc_off[i].tokens) then same = same + 1 end end
H.check(same == #reqs, "concurrent with cache: %d/%d identical", same, #reqs)

-- a repeated prompt: whole blocks hit, at least one token recomputed
local e = luainfer.engine{ max_num_seqs = 4 }
local p = system .. questions[1]
local n = #e:tokenize(p)
local _, r1 = luainfer.generate(e, p, { max_tokens = 4, temperature = 0 })
local _, r2 = luainfer.generate(e, p, { max_tokens = 4, temperature = 0 })
H.check(r1.cached_tokens == 0, "first time: no hit")
H.check(r2.cached_tokens == math.floor((n - 1) / 16) * 16, "repeat: %d cached of %d", r2.cached_tokens, n)
H.check(H.eq_list(r1.tokens, r2.tokens), "repeat gives the same tokens")

-- cache_salt: other tenants never share blocks
local _, r3 = luainfer.generate(e, p, { max_tokens = 4, temperature = 0, cache_salt = "tenant-b" })
H.check(r3.cached_tokens == 0, "different salt: no hit (%d)", r3.cached_tokens)
local _, r4 = luainfer.generate(e, p, { max_tokens = 4, temperature = 0, cache_salt = "tenant-b" })
H.check(r4.cached_tokens > 0, "same salt again: hit (%d)", r4.cached_tokens)
H.check(H.eq_list(r3.tokens, r1.tokens), "salt changes nothing in the output")

-- the advice users need: variable parts at the end, not the front
local front, back = 0, 0
for i = 1, 5 do
  local _, a = luainfer.generate(e, "request-id " .. (1000 + i * 37) .. ". " .. system .. "Say hi.", { max_tokens = 2, temperature = 0 })
  local _, b = luainfer.generate(e, system .. "Say hi. request-id " .. (1000 + i * 37), { max_tokens = 2, temperature = 0 })
  if i > 1 then front = front + a.cached_tokens; back = back + b.cached_tokens end
end
H.check(front == 0, "id at the front: no hits (%d)", front)
H.check(back >= 4 * 32, "id at the end: hits (%d tokens over 4 requests)", back)
print(("variable prefix: %d cached tokens; variable suffix: %d"):format(front, back))
e:close()

-- memory pressure: 10 blocks for everything; the cache shrinks, outputs hold
local per_token = 2 * 30 * 3 * 64 * 2
local small, ss = run({ prefix_caching = true, max_num_seqs = 1, kv_memory = per_token * 16 * 10 }, reqs, true)
same = 0
for i = 1, #reqs do if H.eq_list(small[i].tokens, off[i].tokens) then same = same + 1 end end
H.check(same == #reqs, "under pressure: %d/%d identical", same, #reqs)
H.check(ss.prefix_evictions > 0, "under pressure the cache evicted (%d)", ss.prefix_evictions)
H.check(ss.kv_free_blocks == ss.kv_total_blocks, "all blocks available at the end")

-- eviction order under pressure: LRU (built in) vs LFU (policies/lfu.lua).
-- A prompt is used three times, B once, then C needs one cached block
-- evicted: LRU drops A's (released earlier), LFU drops B's (never hit), so
-- the next A finds its whole prefix only under LFU.
local root = H.repo_root()
local function evict_run(policy_file, isolation)
  local e = luainfer.engine{ max_num_seqs = 1, kv_memory = per_token * 16 * 6, policy = policy_file,
                             policy_isolation = isolation }
  -- prompts of 40 tokens: 2 full blocks cached, a third block for the rest
  local function prompt(head)
    local t, i = { head }, 0
    while #e:tokenize(table.concat(t, " ")) < 40 do i = i + 1; t[#t + 1] = words[(i * 5) % #words + 1] end
    return table.concat(t, " ")
  end
  local A, B, C = prompt("Alpha"), prompt("Beta"), prompt("Gamma")
  local n = #e:tokenize(A)
  H.check(n > 33 and n < 46, "prompt A is 3 blocks with 2 full (%d tokens)", n)
  local g = function(p) local _, r = luainfer.generate(e, p, { max_tokens = 2, temperature = 0, ignore_eos = true }); return r end
  g(A); g(A); g(A); g(B); g(C)
  local r = g(A)
  e:close()
  return r.cached_tokens
end
local lru = evict_run(nil)
local lfu = evict_run(root .. "/policies/lfu.lua")
print(("eviction: A's cached tokens after B and C: LRU %d, LFU %d"):format(lru, lfu))
H.check(lru == 16, "LRU evicted A's deepest block (%d cached)", lru)
H.check(lfu == 32, "LFU kept A's blocks (%d cached)", lfu)
-- the same evict hook in an isolated policy host (msgpack round trip)
local lfu_proc = evict_run(root .. "/policies/lfu.lua", "process")
H.check(lfu_proc == 32, "LFU in a policy-host process kept A's blocks (%d cached)", lfu_proc)

H.finish("prefix_cache")
