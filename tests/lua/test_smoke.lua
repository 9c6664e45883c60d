-- test_smoke.lua — a short tour of the engine for the sanitizer build:
-- batching with preemption, chunked prefill, prefix-cache hits, n > 1
-- samples sharing blocks (copy-on-write), stop strings, cancellation, a
-- Lua policy, and every block back in the pool at the end.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local H = require("harness")
local luainfer = require("luainfer")
local root = H.repo_root()

local per_token = 2 * 30 * 3 * 64 * 2
local e = luainfer.engine{ max_num_seqs = 4, max_batched_tokens = 24, kv_memory = per_token * 16 * 12,
                           policy = root .. "/policies/default.lua" }
local base = "A short story about a lighthouse keeper who counts ships every night, writes their names in a blue book, and waits for the storm season to end so that his daughter can come home"
local alone = {}
for i = 1, 3 do
  local _, r = luainfer.generate(e, base .. " " .. i, { max_tokens = 6, temperature = 0, ignore_eos = true })
  alone[i] = r.tokens
end
local ids = {}
for i = 1, 3 do ids[i] = e:add{ prompt = base .. " " .. i, max_tokens = 6, temperature = 0, ignore_eos = true } end
local fork = e:add{ prompt = base, max_tokens = 5, temperature = 1.0, seed = 3, n = 3, ignore_eos = true }
local stop = e:add{ prompt = base, max_tokens = 30, temperature = 0, stop = { " the" } }
local cancel = e:add{ prompt = base, max_tokens = 30, temperature = 0 }
e:step()
H.check(e:cancel(cancel), "cancel a live request")
e:run()
for i = 1, 3 do H.check(H.eq_list(e:result(ids[i]).tokens, alone[i]), "batched request %d = alone", i) end
for k = 0, 2 do
  local r = e:result(fork + k)
  H.check(r and r.finished and #r.tokens == 5, "sample %d of n=3 finished with 5 tokens", k)
end
local rs = e:result(stop)
H.check(rs.finish_reason == "stop" and not rs.text:find(" the", 1, true), "stop string cut: %q", rs.text)
H.check(e:result(cancel).finish_reason == "cancelled", "cancelled")
local s = e:stats()
H.check(s.prefix_hit_tokens > 0, "prefix cache hit (%d)", s.prefix_hit_tokens)
H.check(s.kv_free_blocks == s.kv_total_blocks, "all blocks back (%d/%d)", s.kv_free_blocks, s.kv_total_blocks)
H.check(s.policy_errors == 0, "policy ran clean")
local ok, err = pcall(e.add, e, { prompt = "", max_tokens = 1 })
H.check(not ok and tostring(err):find("empty"), "empty prompt refused: %s", tostring(err))
ok, err = pcall(e.add, e, { tokens = { 1, 99999999 } })
H.check(not ok and tostring(err):find("vocabulary"), "bad token refused: %s", tostring(err))
ok, err = pcall(e.add, e, { prompt = "x", temperature = "hot" })
H.check(not ok and tostring(err):find("temperature"), "bad option type refused: %s", tostring(err))
e:close()
H.finish("smoke")
