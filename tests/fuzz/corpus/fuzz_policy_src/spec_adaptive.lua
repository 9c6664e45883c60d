-- spec_adaptive.lua — speculative decoding chosen per request and per step:
-- the proposer and k from each request's recent acceptance, the batch size
-- and the step costs the engine measures, and no drafts when they would
-- slow the batch down.
--
-- A round of k drafts is worth E(k) tokens on average (k = 0: one token).
-- With each draft accepted independently with probability a,
--     E(k) = (1 - a^(k+1)) / (1 - a);
-- drafts are not independent (a round that copies accepts all of them, one
-- that does not fails at once), so the policy keeps, per request and
-- method, how often a round that reached draft i accepted it (h_i, rounds
-- fading by FORGET; a depth not reached yet inherits h_(i-1) at
-- DEPTH_PRIOR_WEIGHT, the first one a prior) and uses
--     E(k) = 1 + sum_{i<=k} h_1 * ... * h_i,
-- the formula above when one a describes every depth. (Rounds that fail at
-- the first draft half the time and accept 8 of 8 otherwise: E(8) = 5;
-- the independent formula at their per-draft acceptance says 7.4.)
--
-- Drafts are priced at what they add to this step. A step of B requests
-- computes R rows (B, plus the drafts granted to requests asked before
-- this one) expecting Tok tokens; k more drafts for this request give
--     gain(k) = [(Tok - 1 + E(k)) / Tok] / [(T(R + k) + k * draft * T(B)) / T(R)],
-- the step's tokens per second with them over without. T(n) is what a
-- forward pass of n rows costs (state.spec.row_time: the engine's moving
-- average per row count; a count not measured yet is estimated from the
-- largest measured one below it at PRIOR_ROW per extra row, optimistic on
-- purpose, so that it gets tried and measured) and `draft` the proposer's
-- measured seconds per draft token over the measured seconds per step (0
-- for n-gram lookup; PRIOR_DRAFT until measured). With one request this
-- is E(k) / C(k), C(k) = T(1 + k) / T(1) + k * draft. The policy takes the
-- method and k in [0, max_k] with the best gain, and drafts only when that
-- beats MIN_GAIN. (Session 12's version priced a batch as if every request
-- drafted the same k, T(B(1 + k)) / T(B): too dear where few requests have
-- anything to draft.)
--
-- The counts are each request's own, from the engine's running totals of
-- drafted and accepted per method: a round that accepted j drafts and then
-- rejected one reached depths 1..j + 1 and passed 1..j (the drafts after
-- the rejection were never tested; accepted / verified would count them as
-- failures and underrate a good proposer). Older rounds fade by FORGET per
-- newer one (a text that turns from copying to writing, or back, is
-- followed within a few rounds). h_1 starts from PRIOR_WEIGHT rounds at a
-- prior: PRIOR_WANT for the method the request would use anyway, PRIOR for
-- the others (n-gram drafts at temperature > 0 start lower, at
-- PRIOR_SAMPLED_NGRAM: deterministic drafts are accepted with probability
-- p(draft) only, which copied text still makes high). So a method is
-- priced from its first round on, with no fixed probing. Medusa's nodes are
-- counted as a chain (its tree lists the top-1 chain first), at most
-- MAX_K.medusa of them. Scheduling is the engine's built-in FCFS.
--
--   luainfer serve --policy policies/spec_adaptive.lua --spec-layers 8 ...

local PRIOR_ROW = 0.06 -- an unmeasured row count: each row past the largest measured one costs this share of it
local MIN_GAIN = 1.05  -- below this expected speedup, no drafts
local FORGET = 0.9       -- a round's weight fades by this per newer round (memory ~10)
local PRIOR_WEIGHT = 4   -- rounds' worth of the prior acceptance of a first draft
local DEPTH_PRIOR_WEIGHT = 1 -- rounds' worth of h_(i-1) in h_i
local PRIOR_WANT = 0.6   -- the method the request would draft with anyway
local PRIOR = { ngram = 0.5, draft = 0.3, layerskip = 0.3, medusa = 0.3, eagle = 0.4 }
local PRIOR_SAMPLED_NGRAM = 0.3
-- a model proposer's cost per draft token, as a share of a step, until
-- measured: a method the request did not ask for is tried only when even
-- this makes it pay (layer skip runs most of the target per draft)
local PRIOR_DRAFT = { ngram = 0, draft = 0.3, layerskip = 0.5, medusa = 0.1, eagle = 0.1 }
local MAX_K = { medusa = 4 }
local METHODS = { "ngram", "draft", "layerskip", "medusa", "eagle" }

-- Per request id: per method, what the engine had counted at the last
-- call (drafted d, accepted a) and the faded rounds that reached and passed
-- each depth (reach[i], pass[i]). Dropped at finish.
local seen = {}

-- Takes in method m's round since the last call for request id, from the
-- engine's running totals (the drafts verified and the acceptance so far).
local function observe(id, m, drafted, acceptance)
  local r = seen[id]
  if not r then r = {}; seen[id] = r end
  local t = r[m]
  if not t then t = { d = 0, a = 0, reach = {}, pass = {} }; r[m] = t end
  local acc = drafted > 0 and math.floor(acceptance * drafted + 0.5) or 0
  local dd, da = drafted - t.d, math.max(acc - t.a, 0)
  if dd > 0 then
    local reached = math.min(dd, da + 1) -- the round ended on draft da + 1 unless all passed
    local reach, pass = t.reach, t.pass
    for i = 1, math.max(#reach, dd) do
      reach[i], pass[i] = (reach[i] or 0) * FORGET, (pass[i] or 0) * FORGET
      if i <= reached then reach[i] = reach[i] + 1 end
      if i <= da then pass[i] = pass[i] + 1 end
    end
  end
  t.d, t.a = drafted, acc
end

-- E(1..K) for request id and method m from its rounds by depth, p the
-- first draft's prior
local function expected_by_depth(id, m, p, K)
  local t = seen[id] and seen[id][m]
  local reach, pass = t and t.reach or {}, t and t.pass or {}
  local e, surv, h = {}, 1, p
  for i = 1, K do
    local w = i == 1 and PRIOR_WEIGHT or DEPTH_PRIOR_WEIGHT
    h = ((pass[i] or 0) + w * h) / ((reach[i] or 0) + w)
    surv = surv * h
    e[i] = (e[i - 1] or 1) + surv
  end
  return e
end

-- T(n) for n = 1..N: row_time[n] when measured, else the largest measured
-- count below n (at most 64) at PRIOR_ROW per extra row; with nothing
-- measured, 1 + (n - 1) * PRIOR_ROW. One pass, once a step (the policy
-- runs in the interpreter: a sandboxed policy is never compiled).
local function row_estimates(rt, N)
  local est, lo = {}, nil
  for n = 1, N do
    if n > 1 and n - 1 <= 64 and rt[n - 1] then lo = n - 1 end
    est[n] = rt[n] or (lo and rt[lo] * (1 + (n - lo) * PRIOR_ROW))
  end
  if not est[1] then for n = 1, N do est[n] = est[n] or 1 + (n - 1) * PRIOR_ROW end end
  for n = 2, N do est[n] = est[n] or est[n - 1] * (1 + PRIOR_ROW) end
  return est
end

-- The k in [1, K] with the best gain(k) (above) for a request with E(1..K)
-- when the step holds R rows of b requests expecting Tok tokens; 0 and 1
-- when none beats 1.
local function best_k(E, est, b, R, Tok, draft, K)
  local best, gain = 0, 1
  for k = 1, math.min(K, #est - R) do
    local g = ((Tok - 1 + E[k]) / Tok) / ((est[R + k] + k * draft * est[b]) / est[R])
    if g > gain then best, gain = k, g end
  end
  return best, gain
end

-- this step: its T table up to b * (1 + max_k) rows, the rows granted so far
-- and the tokens they are expected to give (every request of a step shares it)
local st_step, st_b, st_k, est, R, Tok = -1, -1, -1, nil, 0, 0

local function speculate(req, state)
  local s, sp = req.speculation, state.spec
  if s.max_k < 1 then return false end
  local b, rt = math.max(sp.batch_size, 1), sp.row_time or {}
  if state.step ~= st_step or b ~= st_b or s.max_k > st_k then
    st_step, st_b, st_k, est = state.step, b, s.max_k, row_estimates(rt, b * (1 + s.max_k))
    R, Tok = b, b
  end
  local choice, choice_k, choice_gain, choice_e = nil, 0, MIN_GAIN, 1
  for _, m in ipairs(METHODS) do
    if sp.available[m] then
      local p = m == s.method and s.k > 0 and PRIOR_WANT or PRIOR[m]
      if m == "ngram" and s.temperature > 0 then p = PRIOR_SAMPLED_NGRAM end
      observe(req.id, m, s.drafted[m] or 0, s.acceptance[m] or -1)
      local dt = sp.draft_time[m] or 0
      local draft = (dt > 0 and sp.step_time > 0) and dt / sp.step_time or PRIOR_DRAFT[m]
      local K = math.min(s.max_k, MAX_K[m] or s.max_k)
      local E = expected_by_depth(req.id, m, p, K)
      local k, gain = best_k(E, est, b, R, Tok, draft, K)
      if k > 0 and gain > choice_gain then choice, choice_k, choice_gain, choice_e = m, k, gain, E[k] end
    end
  end
  if not choice then return false end
  R, Tok = R + choice_k, Tok - 1 + choice_e
  return choice, choice_k
end

local function on_finish(req) seen[req.id] = nil end

return {
  speculate = speculate,
  on_finish = on_finish,
  -- for tests and benchmarks
  _observe = observe,
  _FORGET = FORGET,
  _expected_by_depth = expected_by_depth,
  _row_estimates = row_estimates,
  _best_k = best_k,
}
