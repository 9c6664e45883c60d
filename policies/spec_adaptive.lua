-- spec_adaptive.lua — speculative decoding chosen per request and per step:
-- the proposer and k from each request's recent acceptance, the batch size
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
-- for n-gram lookup; PRIOR_DRAFT until measured). The policy takes the
-- method and k in [0, max_k] with the best E(k) / C(k), and drafts only
-- when that beats one token per step by MIN_GAIN.
--
-- a is each request's own recent per-draft acceptance for the method, in
-- the model's sense: a round that accepted j drafts and then rejected one
-- is j successes and one failure (the drafts after the rejection were
-- never tested; accepted / verified would count them as failures and
-- underrate a good proposer: at a = 0.9 and k = 8 that ratio is 0.64).
-- Older trials fade by FORGET per newer one (a text that turns from
-- copying to writing, or back, is followed within a few rounds), and the
-- estimate starts from PRIOR_WEIGHT trials at a prior acceptance, fading
-- the same way: PRIOR_WANT for the method the request would use anyway,
-- PRIOR for the others (n-gram drafts at temperature > 0 start lower, at
-- PRIOR_SAMPLED_NGRAM: deterministic drafts are accepted with probability
-- p(draft) only, which copied text still makes high). So a method is
-- priced from its first round on, with no fixed probing. Medusa's nodes are
-- counted as a chain (its tree lists the top-1 chain first), at most
-- MAX_K.medusa of them. Scheduling is the engine's built-in FCFS.
--
--   luainfer serve --policy policies/spec_adaptive.lua --spec-layers 8 ...

local PRIOR_ROW = 0.06 -- an unmeasured row count: each row past the largest measured one costs this share of it
local MIN_GAIN = 1.05  -- below this expected speedup, no drafts
local FORGET = 0.9       -- a trial's weight fades by this per newer trial (memory ~10)
local PRIOR_WEIGHT = 4   -- trials' worth of the prior acceptance
local PRIOR_WANT = 0.6   -- the method the request would draft with anyway
local PRIOR = { ngram = 0.5, draft = 0.3, layerskip = 0.3, medusa = 0.3, eagle = 0.4 }
local PRIOR_SAMPLED_NGRAM = 0.3
-- a model proposer's cost per draft token, as a share of a step, until
-- measured: a method the request did not ask for is tried only when even
-- this makes it pay (layer skip runs most of the target per draft)
local PRIOR_DRAFT = { ngram = 0, draft = 0.3, layerskip = 0.5, medusa = 0.1, eagle = 0.1 }
local MAX_K = { medusa = 4 }
local METHODS = { "ngram", "draft", "layerskip", "medusa", "eagle" }

local function expected(a, k)
  if a >= 0.999 then return k + 1 end
  return (1 - a ^ (k + 1)) / (1 - a)
end

-- The relative cost of verifying k drafts per row, T(b * (1 + k)) / T(b),
-- for k = 1..K. T(n) is row_time[n] when measured, else the largest
-- measured count below n (at most 64) at PRIOR_ROW per extra row; without
-- either, 1 + k * b * PRIOR_ROW. One pass over the row counts, so a step
-- prices every method and k from one table (the policy runs in the
-- interpreter: a sandboxed policy is never compiled).
local function verify_table(rt, b, K)
  local est, lo = {}, nil
  for n = 1, b * (1 + K) do
    if n > 1 and n - 1 <= 64 and rt[n - 1] then lo = n - 1 end
    est[n] = rt[n] or (lo and rt[lo] * (1 + (n - lo) * PRIOR_ROW))
  end
  local v, base = {}, est[b]
  for k = 1, K do
    local more = est[b * (1 + k)]
    v[k] = (base and more) and more / base or 1 + k * b * PRIOR_ROW
  end
  return v
end

-- C(k) for a batch of b rows: the relative cost of b * (1 + k) rows,
-- plus the proposer's share.
local function round_cost(rt, b, k, draft)
  return verify_table(rt, b, k)[k] + k * draft
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

-- Per request id: per method, what the engine had counted at the last
-- call (drafted, accepted) and the faded successes and failures (S, F).
-- Dropped at finish.
local seen = {}

-- The recent per-draft acceptance of method m for request id, from the
-- engine's running totals (the drafts verified and the acceptance so far);
-- p is the prior.
local function recent(id, m, drafted, acceptance, p)
  local r = seen[id]
  if not r then r = {}; seen[id] = r end
  local t = r[m]
  if not t then t = { d = 0, a = 0, S = p * PRIOR_WEIGHT, F = (1 - p) * PRIOR_WEIGHT }; r[m] = t end
  local acc = drafted > 0 and math.floor(acceptance * drafted + 0.5) or 0
  local dd, da = drafted - t.d, math.max(acc - t.a, 0)
  if dd > 0 then
    local fail = da < dd and 1 or 0 -- the round ended on a rejected draft
    local f = FORGET ^ (da + fail)
    t.S, t.F = t.S * f + da, t.F * f + fail
  end
  t.d, t.a = drafted, acc
  return t.S / (t.S + t.F)
end

-- this step's verify_table (every request of a step shares it)
local vt_step, vt_b, vt_k, vt = -1, -1, -1, nil

local function speculate(req, state)
  local s, sp = req.speculation, state.spec
  if s.max_k < 1 then return false end
  local b, rt = math.max(sp.batch_size, 1), sp.row_time or {}
  if state.step ~= vt_step or b ~= vt_b or s.max_k > vt_k then
    vt_step, vt_b, vt_k, vt = state.step, b, s.max_k, verify_table(rt, b, s.max_k)
  end
  local choice, choice_k, choice_gain = nil, 0, MIN_GAIN
  for _, m in ipairs(METHODS) do
    if sp.available[m] then
      local p = m == s.method and s.k > 0 and PRIOR_WANT or PRIOR[m]
      if m == "ngram" and s.temperature > 0 then p = PRIOR_SAMPLED_NGRAM end
      local a = recent(req.id, m, s.drafted[m] or 0, s.acceptance[m] or -1, p)
      local dt = sp.draft_time[m] or 0
      local draft = (dt > 0 and sp.step_time > 0) and dt / sp.step_time or PRIOR_DRAFT[m]
      local k, gain = best_k(a, function(kk) return vt[kk] + kk * draft end,
                             math.min(s.max_k, MAX_K[m] or s.max_k))
      if k > 0 and gain > choice_gain then choice, choice_k, choice_gain = m, k, gain end
    end
  end
  if not choice then return false end
  return choice, choice_k
end

local function on_finish(req) seen[req.id] = nil end

return {
  speculate = speculate,
  on_finish = on_finish,
  -- for tests and benchmarks
  _recent = recent,
  _FORGET = FORGET,
  _expected = expected,
  _best_k = best_k,
  _round_cost = round_cost,
}
