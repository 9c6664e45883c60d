-- default.lua — FCFS with chunked prefill and recompute preemption.
--
-- The same plan as the engine's built-in fallback, written in Lua so it can
-- be copied and changed. Each step:
--   1. running requests, in arrival order, get their next tokens: 1 for a
--      decode, the rest of the prompt (chunked to the token budget) for a
--      prefill. One that is short of KV blocks preempts the latest-arrived
--      running request (it will recompute later); if that is not enough and
--      not even one token fits, it preempts itself.
--   2. preempted, then waiting requests, in arrival order, are admitted with
--      chunked prefill while max_num_seqs, max_batched_tokens and the free
--      KV blocks last. The first one that does not fit stops admission
--      (nobody overtakes the head of the queue). Under KV pressure (someone
--      was preempted) a request fits only if it and the running set (and
--      those admitted before it), each carried to its end, never need more
--      blocks at once than are free (policy.peak_fits): a preempted request
--      resumes only when it can finish.
--
-- Every hook is optional; this file only schedules. To make a new policy,
-- copy it and change schedule(); `luainfer serve` reloads it live.

local policy = require("luainfer.policy")

return {
  -- Engine settings this policy wants (leave out to keep the engine's):
  -- config = { block_size = 16, kv_dtype = "f16", max_num_seqs = 64, max_batched_tokens = 512 },

  schedule = function(state)
    return policy.fcfs(state)
  end,
}
