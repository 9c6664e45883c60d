-- batch.lua — continuous batching from a script: several prompts added at
-- once, stepped together by one engine, each completion printed as it
-- finishes, then the engine's counters.
--
--   ./build/luainfer run examples/batch.lua [POLICY.lua]
--
-- The model is the default one (LUAINFER_MODEL picks another); the policy
-- defaults to policies/default.lua (first come, first served).
local luainfer = require("luainfer")

-- one line per text: newlines shown as \n
local function show(text) return '"' .. text:gsub("\n", "\\n") .. '"' end

local policy = arg[1] or "policies/default.lua"
local e = luainfer.engine{ policy = policy, max_num_seqs = 8 }

-- Requests of different lengths and settings share every step: one engine
-- step runs a forward pass over all running sequences at once (prefill
-- chunks and decode tokens together), and a request that finishes leaves
-- room for the next without the others waiting.
local requests = {
  { prompt = "The capital of France is", max_tokens = 12, temperature = 0 },
  { prompt = "Here is a list of three fruits:", max_tokens = 20, temperature = 0 },
  { prompt = "Once upon a time, in a small village,", max_tokens = 24, temperature = 0.8, seed = 7 },
  { prompt = "The three primary colors are", max_tokens = 10, temperature = 0 },
  { prompt = "def fibonacci(n):", max_tokens = 28, temperature = 0, stop = { "\n\n" } },
}

-- e:add queues a request and returns its id; nothing runs until a step.
local ids = {}
for i, r in ipairs(requests) do ids[i] = e:add(r) end

-- Step until every request is done. Each step the policy picks who runs;
-- e:stats() shows how many sequences ran side by side.
local done, max_running = {}, 0
while e:has_work() do
  e:step()
  local s = e:stats()
  if s.running > max_running then max_running = s.running end
  for i, id in ipairs(ids) do
    local r = not done[i] and e:result(id)
    if r and r.finished then
      done[i] = true
      print(("[%d] %s -> %s (%d tokens, %s, %.2f s)"):format(
        i, show(requests[i].prompt), show(r.text), #r.tokens, r.finish_reason, r.latency))
      e:release(id) -- frees its result; its KV blocks went back when it finished
    end
  end
end

local s = e:stats()
print(("steps %d, tokens computed %d, generated %d, at most %d running at once, preemptions %d"):format(
  s.steps, s.tokens_computed, s.tokens_generated, max_running, s.preemptions))
print(("forward %.2f s, policy %.4f s of %.2f s total; KV %d/%d blocks free"):format(
  s.time_forward, s.time_policy, s.time_total, s.kv_free_blocks, s.kv_total_blocks))
e:close()
