-- spec_adaptive.lua — speculative decoding chosen per request and per step:
-- the proposer and k from each request's acceptance so far and the batch
-- size, and no drafts when they would slow the batch down.
--
-- A round of k drafts, each accepted with probability a, emits on average
--     E(k) = (1 - a^(k+1)) / (1 - a)           tokens (k = 0: one token)
-- and costs, relative to a plain decode step,
--     C(k) = 1 + k * (verify + draft)
-- where `verify` is what one more token in the batch costs (small while a
-- CPU forward pass is bound by reading weights, growing with the batch:
-- VERIFY_PER_SEQ per running request) and `draft` the proposer's measured
-- seconds per draft token over the measured seconds per step (0 for
-- n-gram lookup). The policy takes the k in [0, max_k] with the best
-- E(k) / C(k), and drafts only when that beats one token per step by
-- MIN_GAIN. A method never tried is probed with PROBE_K drafts until
-- PROBE_DRAFTS have been verified. Scheduling is the engine's built-in FCFS.
--
--   luainfer serve --policy policies/spec_adaptive.lua --spec-layers 8 ...

local VERIFY_PER_SEQ = 0.06 -- relative cost of one more token in the batch, per running request
local MIN_GAIN = 1.05       -- below this expected speedup, no drafts
local PROBE_K = 2
local PROBE_DRAFTS = 8
local PRIOR = { ngram = 0.5, draft = 0.3, layerskip = 0.3 }

local function expected(a, k)
  if a >= 0.999 then return k + 1 end
  return (1 - a ^ (k + 1)) / (1 - a)
end

-- The best k for acceptance a at per-draft cost c, and its gain over k = 0.
local function best_k(a, c, max_k)
  local best, gain = 0, 1
  for k = 1, max_k do
    local g = expected(a, k) / (1 + k * c)
    if g > gain then best, gain = k, g end
  end
  return best, gain
end

local function speculate(req, state)
  local s, sp = req.speculation, state.spec
  if s.max_k < 1 then return false end
  local verify = VERIFY_PER_SEQ * math.max(sp.batch_size, 1)
  local choice, choice_k, choice_gain = nil, 0, MIN_GAIN
  for _, m in ipairs({ "ngram", "draft", "layerskip" }) do
    if sp.available[m] then
      local drafted, a = s.drafted[m], s.acceptance[m]
      -- prompt lookup drafts are deterministic: at temperature > 0 they are
      -- only worth it once measured
      local sampled_ngram = m == "ngram" and s.temperature > 0
      if drafted < PROBE_DRAFTS then
        -- not measured yet: probe the method the request wants
        if m == s.method and not sampled_ngram then
          return m, math.min(PROBE_K, s.max_k)
        end
        a = sampled_ngram and 0 or PRIOR[m]
      end
      local draft = sp.step_time > 0 and (sp.draft_time[m] or 0) / sp.step_time or 0
      local k, gain = best_k(a, verify + draft, s.max_k)
      if k > 0 and gain > choice_gain then choice, choice_k, choice_gain = m, k, gain end
    end
  end
  if not choice then return false end
  return choice, choice_k
end

return {
  speculate = speculate,
  -- for tests and benchmarks
  _expected = expected,
  _best_k = best_k,
}
