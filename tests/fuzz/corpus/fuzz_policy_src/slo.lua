-- slo.lua — SLO-aware scheduling: while prompts wait for their first token,
-- decodes ahead of their TPOT objective pause and the steps are prefill (a
-- first token waits for its prompt's last chunk; on a CPU a decode row costs
-- ~2 prompt tokens). A decode's slack: when its last token is due
-- (first_token + slo_tpot_ms * (max_tokens - 1)) - now - one step with
-- decodes (measured) per token to come. Each step serves:
--   1. decodes at risk (slack < RELAXED_S), arrival order, one slot kept for
--      a prompt; with some, a step takes <= URGENT_TOKENS prompt tokens;
--   2. prompts, earliest TTFT deadline first (equal objectives: FCFS, the
--      lowest worst TTFT for a backlog); past MIN_STEP tokens a step ends
--      with the prompt it finishes, so its first token waits for no other;
--   3. relaxed decodes, least slack first, only when no prompt can run:
--      paused, they keep their KV blocks and take no batch slot; their slack
--      shrinks as they wait, so they come back to (1): no starvation.
-- Short of KV blocks, only relaxed decodes may be preempted (most slack
-- first); under pressure queued requests are admitted against projected
-- blocks. Objectives a request does not give are DEFAULT_*.
local policy = require("luainfer.policy")
local DEFAULT_TTFT_MS, DEFAULT_TPOT_MS = 2000, 200
local RELAXED_S, ALPHA = 1.5, 0.2        -- slack that lets a decode pause; smoothing
local MIN_STEP, URGENT_TOKENS = 64, 64   -- prompt tokens per step (see 2 and 1)
local decode_s, last_now, last_decodes = 0.05, 0, false  -- s per step with decodes (measured)
local relaxed, prompts, decodes, taken, left = {}, false, false, 0, 0  -- the plan being built

local function slack(r, now)
  local due = r.first_token + (r.slo_tpot_ms or DEFAULT_TPOT_MS) / 1000 * math.max(r.max_tokens - 1, 1)
  return due - now - (r.max_tokens - r.num_generated) * decode_s
end
local function deadline(r) return r.arrival + (r.slo_ttft_ms or DEFAULT_TTFT_MS) / 1000 end
local function is_prompt(r) return r.state ~= "running" or r.num_computed < r.num_tokens - 1 end

local opts = { project = true, skip_blocked = true, may_preempt = function(_, v) return relaxed[v.id] ~= nil end,
  max_tokens = function(r) return is_prompt(r) and left or 1 end, on_run = function(r, n)
    if not is_prompt(r) then decodes = true; return end
    prompts, taken, left = true, taken + n, left - n
    if n >= r.num_tokens - r.num_computed and taken >= MIN_STEP then left = 0 end
  end }

return {
  schedule = function(state)
    local now, urgent, prompt, easy = state.now, {}, {}, {}
    if last_decodes and now > last_now then decode_s = (1 - ALPHA) * decode_s + ALPHA * (now - last_now) end
    last_now, relaxed = now, {}
    for _, r in ipairs(state.running) do
      local s = not is_prompt(r) and r.first_token and slack(r, now)
      if not s then prompt[#prompt + 1] = r
      elseif s > RELAXED_S then easy[#easy + 1] = r; relaxed[r.id] = s
      else urgent[#urgent + 1] = r end
    end
    prompt = policy.sort_by(policy.concat(prompt, state.preempted, state.waiting), deadline)
    local seqs = state.budget.max_num_seqs  -- a batch full of urgent decodes keeps a slot for a prompt
    if #urgent >= seqs and prompt[1] then table.insert(urgent, seqs, table.remove(prompt, 1)) end
    policy.sort_by(easy, function(r) return relaxed[r.id] end)
    prompts, decodes, taken, left = false, false, 0, #urgent > 0 and URGENT_TOKENS or state.budget.max_batched_tokens
    local plan = policy.greedy(state, policy.concat(urgent, prompt), opts)
    if not prompts then plan = policy.greedy(state, policy.concat(urgent, easy), opts) end
    last_decodes = decodes
    return plan
  end,
}
