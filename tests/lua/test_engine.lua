-- test_engine.lua — continuous batching on the real model, under greedy:
--  * 32 concurrent requests give exactly the tokens each gives alone;
--  * a tiny KV budget forces preemption, and every request still finishes
--    with the same output;
--  * chunked prefill (small max_batched_tokens) changes nothing.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local H = require("harness")
local luainfer = require("luainfer")

local words = { "The", "river", "ran", "past", "old", "mills", "and", "quiet", "farms", "while",
                "children", "counted", "boats", "under", "a", "grey", "sky", "of", "late", "autumn" }
local function prompt(i)
  local t = {}
  for k = 1, 3 + (i * 7) % 40 do t[#t + 1] = words[(i * 3 + k * k) % #words + 1] end
  return table.concat(t, " ")
end

local N = 32
local reqs = {}
for i = 1, N do
  reqs[i] = { prompt = prompt(i), max_tokens = 4 + (i * 7) % 24, temperature = 0, ignore_eos = (i % 3 == 0) }
end

-- each alone
local solo_engine = luainfer.engine{ max_num_seqs = 1 }
local solo = {}
for i = 1, N do
  local _, r = luainfer.generate(solo_engine, reqs[i].prompt, reqs[i])
  solo[i] = r.tokens
end
solo_engine:close()

local function run_all(cfg, label)
  local e = luainfer.engine(cfg)
  local ids = {}
  for i = 1, N do ids[i] = e:add(reqs[i]) end
  local max_running = 0
  while e:has_work() do
    e:step()
    local s = e:stats()
    if s.running > max_running then max_running = s.running end
  end
  local same = 0
  for i = 1, N do
    local r = e:result(ids[i])
    H.check(r.finished, "%s: request %d finished", label, i)
    if H.eq_list(r.tokens, solo[i]) then same = same + 1
    else
      H.check(false, "%s: request %d differs: got %d tokens, alone %d", label, i, #r.tokens, #solo[i])
    end
  end
  local s = e:stats()
  print(("%s: %d/%d identical to solo, max running %d, preemptions %d, steps %d"):format(
    label, same, N, max_running, s.preemptions, s.steps))
  H.check(s.kv_free_blocks == s.kv_total_blocks, "%s: every block returned (%d/%d)", label,
          s.kv_free_blocks, s.kv_total_blocks)
  e:close()
  return s, max_running
end

local s, running = run_all({ max_num_seqs = 32, max_batched_tokens = 512 }, "batched")
H.check(running > 8, "requests really ran together (max running %d)", running)
-- the CPU's logits are host memory: nothing is sampled "on the device", whatever the key says
H.check(s.tokens_device_sampled == 0, "cpu: no token sampled on a device (%d)", s.tokens_device_sampled)
local ds = run_all({ max_num_seqs = 32, max_batched_tokens = 512, device_sampling = false }, "device_sampling off")
H.check(ds.tokens_device_sampled == 0, "device_sampling = false accepted")

-- chunked prefill: prompts longer than a step's budget
run_all({ max_num_seqs = 32, max_batched_tokens = 24 }, "chunked")

-- memory pressure: room for only a few sequences at a time
local info = luainfer.engine{ max_num_seqs = 1 }:info()
local per_token = 2 * info.n_layer * 3 * 64 * 2 -- f16, 3 kv heads x 64 dims
local budget = per_token * 16 * 24                -- 24 blocks of 16 tokens
s = run_all({ max_num_seqs = 32, kv_memory = budget }, "preempting")
H.check(s.preemptions > 0, "the tiny budget forced preemption (%d)", s.preemptions)

H.finish("engine")
