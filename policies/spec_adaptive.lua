-- spec_adaptive.lua — speculative decoding chosen per request and per step:
-- the proposer and k from each request's acceptance so far, the batch size
-- and the step costs the engine measures, and no drafts when they would
-- slow the batch down.
--
-- A round of k drafts, each accepted with probability a, emits on average
--     E(k) = (1 - a^(k+1)) / (1 - a)           tokens (k = 0: one token)
-- and costs, relative to a plain decode step of the batch's B rows,
--     C(k) = T(B * (1 + k)) / T(B) + k * draft
-- where T(n) is what a forward pass of n tokens costs (state.spec.row_time:
-- the engine's moving average per row count; a count not measured yet is
-- estimated from the largest measured one below it at PRIOR_ROW per extra
-- row, optimistic on purpose, so that it gets tried and measured), each
-- running request assumed to draft the same k, and `draft` the proposer's
-- measured seconds per draft token over the measured seconds per step (0
-- for n-gram lookup). The policy takes the method and k in [0, max_k] with
-- the best E(k) / C(k), and drafts only when that beats one token per step
-- by MIN_GAIN. A method never tried is probed with PROBE_K drafts until
-- PROBE_DRAFTS have been verified, if the request asks for it; the others
-- start from PRIOR acceptance and PRIOR_DRAFT cost. Medusa's nodes are counted as a chain (its tree lists
-- the top-1 chain first), at most MAX_K.medusa of them. Scheduling is the
-- engine's built-in FCFS.
--
--   luainfer serve --policy policies/spec_adaptive.lua --spec-layers 8 ...

local PRIOR_ROW = 0.06 -- an unmeasured row count: each row past the largest measured one costs this share of it
local MIN_GAIN = 1.05  -- below this expected speedup, no drafts
local PROBE_K = 2
local PROBE_DRAFTS = 8
local PRIOR = { ngram = 0.5, draft = 0.3, layerskip = 0.3, medusa = 0.3 }
-- a model proposer's cost per draft token, as a share of a step, until
-- measured: a method the request did not ask for is tried only when even
-- this makes it pay (layer skip runs most of the target per draft)
local PRIOR_DRAFT = { ngram = 0, draft = 0.3, layerskip = 0.5, medusa = 0.1 }
local MAX_K = { medusa = 4 }
local METHODS = { "ngram", "draft", "layerskip", "medusa" }

local function expected(a, k)
  if a >= 0.999 then return k + 1 end
  return (1 - a ^ (k + 1)) / (1 - a)
end

-- Seconds of a forward pass of n rows, from row_time ({[n] = s}); nil when
-- nothing at or below n was measured.
local function row_cost(rt, n)
  if rt[n] then return rt[n] end
  for lo = math.min(n - 1, 64), 1, -1 do
    if rt[lo] then return rt[lo] * (1 + (n - lo) * PRIOR_ROW) end
  end
  return nil
end

-- C(k) for a batch of b rows: the relative cost of b * (1 + k) rows,
-- plus the proposer's share.
local function round_cost(rt, b, k, draft)
  local base, more = row_cost(rt, b), row_cost(rt, b * (1 + k))
  local verify = (base and more) and more / base or 1 + k * b * PRIOR_ROW
  return verify + k * draft
end

-- The best k in [1, max_k] for acceptance a, cost(k) the round's relative
-- cost, and its gain E(k) / C(k) (k = 0 and gain 1 when none beats 1).
local function best_k(a, cost, max_k)
  local best, gain = 0, 1
  for k = 1, max_k do
    local g = expected(a, k) / cost(k)
    if g > gain then best, gain = k, g end
  end
  return best, gain
end

local function speculate(req, state)
  local s, sp = req.speculation, state.spec
  if s.max_k < 1 then return false end
  local b, rt = math.max(sp.batch_size, 1), sp.row_time or {}
  local choice, choice_k, choice_gain = nil, 0, MIN_GAIN
  for _, m in ipairs(METHODS) do
    if sp.available[m] then
      local drafted, a = s.drafted[m] or 0, s.acceptance[m] or -1
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
      local dt = sp.draft_time[m] or 0
      local draft = (dt > 0 and sp.step_time > 0) and dt / sp.step_time or PRIOR_DRAFT[m]
      local k, gain = best_k(a, function(kk) return round_cost(rt, b, kk, draft) end,
                             math.min(s.max_k, MAX_K[m] or s.max_k))
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
  _round_cost = round_cost,
}
