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
-- fading by FORGET, a model proposer's by FORGET_MODEL; a depth not
-- reached yet inherits h_(i-1) at DEPTH_PRIOR_WEIGHT, a model proposer's
-- at DEPTH_PRIOR_WEIGHT_MODEL, the first one a prior) and uses
--     E(k) = 1 + sum_{i<=k} h_1 * ... * h_i,
-- the formula above when one a describes every depth. (Rounds that fail at
-- the first draft half the time and accept 8 of 8 otherwise: E(8) = 5;
-- the independent formula at their per-draft acceptance says 7.4.)
--
-- Drafts are priced by what they do to the step. A step of B requests
-- computing R rows expects Tok tokens; its speed is
--     V = Tok / (T(R) + D),
-- D the proposers' time (k * draft * T(B) a request). T(n) is what a
-- forward pass of n rows costs (state.spec.row_time: the engine's moving
-- average per row count, a count's first, cold pass not timed; a count not
-- measured yet is interpolated between measured ones, or extrapolated past
-- them at their measured cost per row: row_estimates) and `draft` the proposer's measured seconds per draft token
-- (its catch-up included) over the measured seconds per step (0 for n-gram
-- lookup; PRIOR_DRAFT until measured).
--
-- Each request's method is the one that pays best alone (E(k) / C(k) at the
-- step's start, C(k) = T(B + k) / T(B) + k * draft). Where n-gram is a
-- request's method and its lookup finds nothing to copy this step
-- (req.speculation.ngram 0), the best model proposer drafts instead, priced
-- at the step's margin (until session 25 n-gram kept those steps and drafted
-- nothing: with an EAGLE draft that passes 37% of its first drafts on a
-- story, the story ran without drafts, 0.97x where EAGLE k1 gives
-- 1.1-1.3x). The plan still knows the request as n-gram's: a JSON object
-- being copied finds nothing every few steps, and dropping it from the next
-- step's plan each time stalled four such requests (replayed cold: 1.13x
-- against 1.69x). Its k comes from the
-- step's plan, made at the step's first call for every running request
-- priced at its last one: from no drafts, each round grants the request
-- and k that raise V most (by MIN_ROUND at least), and the plan stands if
-- the step gains MIN_GAIN over no drafts. A request the plan did not know
-- (its first decode step) is priced at the margin of the plan's rows:
--     gain(k) = [(Tok - 1 + E(k)) / Tok] / [(T(R + k) + k * draft * T(B)) / T(R)].
-- With one request all of this is E(k) / C(k). (Session 12's version priced
-- a batch as if every request drafted the same k, T(B(1 + k)) / T(B): too
-- dear where few requests have anything to draft; session 16's priced each
-- request at the margin in call order, so the first requests took the
-- cheap rows and the last drafted nothing, whatever they would have given.)
--
-- The counts are each request's own, from the engine's running totals of
-- drafted and accepted per method: a round that accepted j drafts and then
-- rejected one reached depths 1..j + 1 and passed 1..j (the drafts after
-- the rejection were never tested; accepted / verified would count them as
-- failures and underrate a good proposer). Older rounds fade by FORGET per
-- newer one (a text that turns from copying to writing, or back, is
-- followed within a few rounds), a model proposer's by FORGET_MODEL.
-- h_1 starts from PRIOR_WEIGHT rounds at a
-- prior, which fades like a round (session 16's did not: with rounds
-- fading to a weight of 10 at most, h_1 could never pass (10 + 4p) / 14,
-- 0.86 at p = 0.5, and copied text was priced at E(8) = 5 where it gives
-- 9): PRIOR_WANT for the method the request would use anyway, PRIOR for
-- the others (n-gram drafts at temperature > 0 start lower, at
-- PRIOR_SAMPLED_NGRAM: deterministic drafts are accepted with probability
-- p(draft) only, which copied text still makes high; greedy n-gram drafts
-- after a lookup match of COPY_MATCH tokens or more start at PRIOR_COPY at
-- least: such first drafts passed 61-100% on bench spec's workloads against
-- 12-64% after a 2-token match, and with the row costs measured up front
-- (--spec-calibrate) the fixed prior priced four requests copying a
-- paragraph at batch 4 out of drafting at all, 0.95-0.97x against n-gram
-- k8's 1.30-1.37x; session 32), each moved towards
-- what the method's first drafts did for the other requests lately (their
-- last POP_ROUNDS rounds, fading by POP_FORGET, against POP_WEIGHT rounds
-- at the fixed prior): requests that arrive together to copy the same kind of
-- text are priced as the ones before them, not as strangers (session 23:
-- of four requests copying, the plan gave the first one's good record all
-- the drafts while the other three, priced at the prior, got none and fell
-- out of step). So a method is priced from its first round on, with no
-- fixed probing. A greedy request that does not draft while lookup offers
-- a copy still gets n-gram rounds: the next token judges the first draft it
-- would have made (observe_shadow), so a record of failed rounds does not
-- freeze. Medusa's nodes are
-- counted as a chain (its tree lists the top-1 chain first), at most
-- MAX_K.medusa of them. Scheduling is the engine's built-in FCFS.
--
--   luainfer serve policies/spec_adaptive.lua --spec-layers 8 ...
--   luainfer serve policies/spec_adaptive.lua --eagle DRAFT.gguf --eagle-lazy --spec-calibrate
--
-- The second is the configuration bench spec measured best with an EAGLE
-- draft (session 32, four runs: +2.0 to +4.8% over the engine's defaults,
-- the geometric mean over its eight greedy rows, the code edit at batch 4
-- 0.95-0.99x against 0.90-0.92x; session 33, with the depth decay: 0.96-0.98x,
-- the story at batch 4 0.97x).
--
-- With an EAGLE draft (--eagle FILE), --eagle-lazy leaves a request's
-- draft KV of its prompt until it first drafts with EAGLE: the requests
-- this policy keeps on n-gram lookup or off then never pay for it (2-5% on
-- the copying workloads and the code edit at batch 4 in bench spec,
-- docs/benchmarks.md, session 32), at the price docs/speculation.md
-- gives ("Idle requests": shared prefixes such requests computed keep
-- zeros in the draft's KV).

local PRIOR_ROW = 0.06 -- an unmeasured row count: each row past the largest measured one costs this share of it
local MIN_GAIN = 1.05  -- below this expected speedup, no drafts
local BAL_H1 = 0.5      -- a request whose first draft passes this often is planned with the others
local BAL_SLACK = 0.98  -- the even plan stands unless the greedy one is this much faster
local MIN_ROUND = 1.01 -- a planning round must gain this much to grant more
local MAX_DRAFTS = 16  -- drafts per request at most (the engine's LI_SPEC_MAX_TOKENS)
local FORGET = 0.9       -- a round's weight fades by this per newer round (memory ~10) ...
local FORGET_MODEL = 0.97 -- ... a model proposer's (memory ~33)
local PRIOR_WEIGHT = 4   -- rounds' worth of the prior acceptance of a first draft
local DEPTH_PRIOR_WEIGHT = 1 -- rounds' worth of h_(i-1) in h_i ...
local DEPTH_PRIOR_WEIGHT_MODEL = 4 -- ... for a model proposer
local UNSEEN_DECAY = 0.85 -- at batch 2+, h_i of a depth the request's rounds never reached: h_(i-1) times this ...
local LONG_MATCH = 12     -- ... unless a greedy lookup's match is this many tokens or more (16 until session 37)
local PRIOR_WANT = 0.6   -- the method the request would draft with anyway
local PRIOR = { ngram = 0.5, draft = 0.3, layerskip = 0.3, medusa = 0.3, eagle = 0.4 }
local PRIOR_SAMPLED_NGRAM = 0.3
local COPY_MATCH = 5     -- a greedy n-gram lookup matching this many tokens or more ...
local PRIOR_COPY = 0.8   -- ... prices its first draft at this at least
-- a model proposer's cost per draft token, as a share of a step, until
-- measured: a method the request did not ask for is tried only when even
-- this makes it pay (layer skip runs most of the target per draft)
local PRIOR_DRAFT = { ngram = 0, draft = 0.3, layerskip = 0.5, medusa = 0.1, eagle = 0.1 }
local POP_FORGET = 0.95  -- other requests' rounds, a method's first drafts: memory ~20 rounds
local POP_WEIGHT = 2     -- rounds' worth of the fixed prior in the population's
local POP_ROUNDS = 32    -- the population's rounds kept per method
local MAX_K = { medusa = 4 }
local METHODS = { "ngram", "draft", "layerskip", "medusa", "eagle" }

-- Per request id: per method, what the engine had counted at the last
-- call (drafted d, accepted a) and the faded rounds that reached and passed
-- each depth (reach[i], pass[i]). Dropped at finish.
local seen = {}
-- Per method (n-gram: greedy and sampled apart), the last POP_ROUNDS
-- rounds of every request: who drafted, and whether the first draft passed
-- (a ring: q.n rounds taken in, round j's at q.id[j % POP_ROUNDS + 1] and
-- q.pass[...], kept in place: no table per round).
local pop = {}

-- The prior of a method's first draft for request id: p moved towards what
-- the method's first drafts did lately for the other requests (rounds
-- fading by POP_FORGET per newer one; the request's own rounds are its
-- record already, and counted twice they would make a request alone its
-- own prior).
local pop_sums = {} -- per key: the ring's count when summed, and each id's sums (reach, pass) then
local function pop_prior(key, p, id)
  local q = pop[key]
  if not q then return p end
  -- summed once per request until the ring takes in a round (a step
  -- without rounds, every step of a batch that drafts nothing, reads the
  -- sums of the last one)
  -- (the sums' tables are kept per key and emptied when the ring moves)
  local c = pop_sums[key]
  if not c then c = { n = -1, reach = {}, pass = {} }; pop_sums[key] = c end
  if c.n ~= q.n then
    c.n = q.n
    for k in pairs(c.reach) do c.reach[k], c.pass[k] = nil, nil end
  end
  local who = id == nil and "none" or id
  local reach = c.reach[who]
  if not reach then
    local pass, w, qid, qpass = 0, 1, q.id, q.pass
    local slot = (q.n - 1) % POP_ROUNDS + 1 -- the newest round's, then back round the ring
    reach = 0
    for _ = q.n - 1, math.max(0, q.n - POP_ROUNDS), -1 do
      if qid[slot] ~= id then reach, pass = reach + w, pass + (qpass[slot] and w or 0) end
      w = w * POP_FORGET
      slot = slot == 1 and POP_ROUNDS or slot - 1
    end
    c.reach[who], c.pass[who] = reach, pass
  end
  return (c.pass[who] + POP_WEIGHT * p) / (reach + POP_WEIGHT)
end

-- A round of dd drafts of which the first da passed into t's record in
-- context ctx (older rounds and the prior fade by forget: FORGET, or
-- FORGET_MODEL for a model proposer's) and into the population pk.
-- Whether an n-gram copy goes on changes from one stretch of text to the
-- next; what a draft model or EAGLE passes depends on the model pair and
-- the kind of text, and changes slowly: faded over ~10 rounds, a run of
-- misses in an EAGLE draft that passes 42% overall (its code edit at k 1
-- has runs of 7) priced it below a row's cost, and then it never drafted
-- again (nothing new comes into a record while it does not draft).
local function take_round(id, t, ctx, pk, dd, da, forget)
  local c = t.by[ctx]
  if not c then c = { reach = {}, pass = {}, pw = PRIOR_WEIGHT }; t.by[ctx] = c end
  local reached = math.min(dd, da + 1) -- the round ended on draft da + 1 unless all passed
  local reach, pass = c.reach, c.pass
  for i = 1, math.max(#reach, dd) do
    reach[i], pass[i] = (reach[i] or 0) * forget, (pass[i] or 0) * forget
    if i <= reached then reach[i] = reach[i] + 1 end
    if i <= da then pass[i] = pass[i] + 1 end
  end
  c.pw = c.pw * forget -- the prior fades like a round
  local q = pop[pk] or { n = 0, id = {}, pass = {} }
  pop[pk] = q
  local slot = q.n % POP_ROUNDS + 1
  q.id[slot], q.pass[slot], q.n = id, da > 0, q.n + 1
end

-- Takes in method m's round since the last call for request id, from the
-- engine's running totals (the drafts verified and the acceptance so far);
-- key names its population (m unless given). A model proposer's rounds are
-- kept apart by what n-gram lookup found when they were drafted (ctx
-- "copy": the text had something to copy; ""): EAGLE drafts the text
-- between copies well and a copy badly, so one record for both priced it
-- for the copies by its record from the preamble. ctx (default "") is the
-- context of this call's round, taken in at the next call.
local function observe(id, m, drafted, acceptance, key, ctx)
  local r = seen[id]
  if not r then r = {}; seen[id] = r end
  local t = r[m]
  if not t then t = { d = 0, a = 0, by = {}, ctx = "" }; r[m] = t end
  local acc = drafted > 0 and math.floor(acceptance * drafted + 0.5) or 0
  local dd, da = drafted - t.d, math.max(acc - t.a, 0)
  if dd > 0 then take_round(id, t, t.ctx, (key or m) .. t.ctx, dd, da, m ~= "ngram" and FORGET_MODEL or FORGET) end
  t.d, t.a, t.ctx = drafted, acc, ctx or ""
end

-- A first draft n-gram lookup offered and the request did not draft: the
-- token that came tells whether it would have passed. The lookup copies the
-- tokens after the latest earlier occurrence of the request's tail, and
-- ngram_match measures how far back that occurrence matches; a token equal
-- to the first draft extends the match, any other ends it. Taken in as a
-- round that reached depth 1 (fading like one, and in the population), so a
-- record made of failed rounds is not frozen while nothing is drafted: at
-- batch 4 a JSON edit's first rounds (short matches at its start) failed,
-- the honest costs then priced every draft out, and the requests copied 55
-- steps without drafting while their matches grew to 18 tokens.
local shadow = {} -- per request id: the greedy lookup's match and drafted count at the last call (kept in place)
local function observe_shadow(id, key, match, drafted, ngram)
  local last = shadow[id]
  if not last then shadow[id] = { match = match, drafted = drafted, ngram = ngram }; return end
  local take = last.drafted == drafted and last.ngram > 0 and last.match >= COPY_MATCH
  local passed = match > last.match
  last.match, last.drafted, last.ngram = match, drafted, ngram
  local t = seen[id] and seen[id].ngram
  if take and t then take_round(id, t, "", key, 1, passed and 1 or 0, FORGET) end
end

-- Request id's record of method m in context ctx (default ""), or nil
local function record(id, m, ctx)
  local t = seen[id] and seen[id][m]
  return t and t.by[ctx or ""]
end

-- h_1: what the first draft passes with, from the record's first depth and
-- p, the prior, at its fading weight (p itself without a record)
local function first_depth(id, m, p, ctx)
  local t = record(id, m, ctx)
  if not t then return p end
  return ((t.pass[1] or 0) + t.pw * p) / ((t.reach[1] or 0) + t.pw)
end

-- E(1..K) (into e when given) for request id and method m in context ctx from its rounds by
-- depth: h_1 as above, each deeper h_i from the rounds that reached depth
-- i and h_(i-1) at DEPTH_PRIOR_WEIGHT (n-gram: a copy that passed its first
-- draft mostly passes the rest, learnt in a round or two) or
-- DEPTH_PRIOR_WEIGHT_MODEL (a model proposer's later drafts pass less
-- often than its first: with one round's worth, two lucky rounds priced
-- chains of 3-4 EAGLE drafts at batch 1 that then mostly failed). With decay < 1 (batches of 2 or
-- more: UNSEEN_DECAY), a depth no round of the request has reached takes
-- h_(i-1) times decay: a long round is priced as an unknown until one
-- gets there. (Inherited whole, two rounds of 4 and 6 drafts all passed
-- priced 12 drafts near sure; a code edit copying a function's signature
-- then drafted 12, 4 and 5 at batch 4 and passed 1, 0 and 0.) The caller
-- leaves decay at 1 for a greedy n-gram request whose lookup matches
-- LONG_MATCH tokens or more: a copy that long is verbatim, and decayed, the
-- depths past the first rounds' were never tried (four requests copying a
-- paragraph at batch 4 drafted 3 each for 20 steps, every round passing,
-- where 8 each is 6-11% faster on the calibrated curve). 12 since session
-- 37: replayed on three curves, warm and cold, it ramps four copying
-- requests up sooner than 16 did (batch 4 rewrite 1.63-1.69x -> 1.77-1.82x
-- on this Intel machine's curve; the code edit, whose matches stay under
-- 12, unchanged; 11 already costs it 2%).
local none = {}
local function expected_by_depth(id, m, p, K, ctx, decay, e)
  local t = record(id, m, ctx)
  local reach, pass = t and t.reach or none, t and t.pass or none
  local h = first_depth(id, m, p, ctx)
  local surv = h
  e = e or {}
  for i = #e, K + 1, -1 do e[i] = nil end
  e[1] = 1 + h
  local dw = m == "ngram" and DEPTH_PRIOR_WEIGHT or DEPTH_PRIOR_WEIGHT_MODEL
  for i = 2, K do
    local prior = ((reach[i] or 0) < 0.5 and decay or 1) * h
    h = ((pass[i] or 0) + dw * prior) / ((reach[i] or 0) + dw)
    surv = surv * h
    e[i] = e[i - 1] + surv
  end
  return e
end

-- T(n) for n = 1..N, in seconds (into est when given: the step's table,
-- kept from step to step): row_time[n] where measured; between two
-- measured counts, on the line through them; past the largest measured
-- count m, T(m) plus the measured cost of a row (the least-squares slope
-- over the measured counts, once they span 4 rows or more) per extra row,
-- or with less to go on, PRIOR_ROW of T(m) a row; below the smallest
-- measured count, T(m) less PRIOR_ROW of it per row fewer; with nothing
-- measured, 1 + (n - 1) * PRIOR_ROW. (Until session 24 a count past the
-- largest measured one cost PRIOR_ROW of T(m) a row: 0.42 ms a row past 20
-- rows on Zen 5, where a row costs 0.27 ms, so a batch of four copying
-- requests was planned at 4-5 drafts each, 20 rows, not 8 each.) One pass,
-- once a step (the policy runs in the interpreter: a sandboxed policy is
-- never compiled).
-- From count b (the batch: the count the engine runs most, its average the
-- freshest) T never falls as rows are added, nor rises as they are taken
-- away: a count run a while ago was timed when the machine may have been
-- faster, and a dearer T(b) with a cheaper T(b + 1) priced a draft's row
-- below nothing (session 26, the code edit at batch 4 on a shared machine:
-- T(4) 3.42 ms, T(5) 2.91 ms, and EAGLE drafted at a "gain" of 1.16).
local ms_kept = {}
local function row_estimates(rt, N, b, est)
  local ms, c, sx, sy, sxx, sxy = ms_kept, 0, 0, 0, 0, 0
  for n = 1, math.min(N, 64) do
    local t = rt[n]
    if t then
      c = c + 1
      ms[c] = n
      sx, sy, sxx, sxy = sx + n, sy + t, sxx + n * n, sxy + n * t
    end
  end
  ms[c + 1] = nil -- the loop below reads one past the last
  est = est or {}
  for n = #est, N + 1, -1 do est[n] = nil end
  if c == 0 then
    for n = 1, N do est[n] = 1 + (n - 1) * PRIOR_ROW end
    return est
  end
  local m0, m1 = ms[1], ms[c]
  local slope = PRIOR_ROW * rt[m1]
  if m1 - m0 >= 4 then slope = math.max(0, (c * sxy - sx * sy) / (c * sxx - sx * sx)) end
  for n = 1, math.min(m0 - 1, N) do est[n] = rt[m0] / (1 + (m0 - n) * PRIOR_ROW) end
  for i = 1, c do
    local a, b = ms[i], ms[i + 1]
    local ta = rt[a]
    est[a] = ta
    if b and b > a + 1 then -- (b <= N: the measured counts are N or fewer)
      local tb = rt[b]
      for n = a + 1, b - 1 do est[n] = ta + (tb - ta) * (n - a) / (b - a) end
    end
  end
  for n = m1 + 1, N do est[n] = rt[m1] + (n - m1) * slope end
  b = math.min(b or 1, N)
  for n = b + 1, N do -- (compares, not math.max / math.min: calls, interpreted)
    if est[n - 1] > est[n] then est[n] = est[n - 1] end
  end
  for n = b - 1, 1, -1 do
    if est[n + 1] < est[n] then est[n] = est[n + 1] end
  end
  return est
end

-- The cheapest of the rows b + 1 .. b + MAX_DRAFTS as a share of T(b):
-- with E(k) - 1 <= k h_1 (every h_i <= 1) and T(b + k) >= T(b) + k of
-- them, gain(k) (best_k, at the step's start) is at most
-- (1 + k h_1 / b) / (1 + k (floor + draft)), 1 or less for every k when
-- h_1 / b <= floor + draft.
local function cheapest_row(est, b)
  local f = math.huge
  for n = b, math.min(#est - 1, b + MAX_DRAFTS - 1) do
    local d = est[n + 1] - est[n]
    if d < f then f = d end
  end
  return f / est[b]
end

-- The k in [1, K] with the best gain(k) (above) for a request with E(1..K)
-- when the step holds R rows of b requests expecting Tok tokens; 0 and 1
-- when none beats 1.
local function best_k(E, est, b, R, Tok, draft, K)
  local best, gain, eb, eR = 0, 1, est[b], est[R]
  for k = 1, math.min(K, #est - R) do
    local g = ((Tok - 1 + E[k]) / Tok) / ((est[R + k] + k * draft * eb) / eR)
    if g > gain then best, gain = k, g end
  end
  return best, gain
end

-- Per request id, what its last call priced: the method it would draft
-- with alone, that method's E(1..K) and proposer share. The plan reads them.
local cand = {}

-- Grows a plan (k per id; R rows, Tok tokens, D proposer seconds, V its
-- speed) round by round: each round grants the one request the k that
-- most raises the step's expected tokens per second,
--     V = Tok / (T(R) + D),  R rows, Tok tokens, D the proposers' time,
-- while that gains at least MIN_ROUND.
local function grow(ids, k, b, est, R, Tok, D, V)
  local n_est, eb = #est, est[b] -- (the loop's lookups in locals: the same arithmetic, in the same order)
  while true do
    local bi, bk, bv, bt, bd = nil, 0, V * MIN_ROUND, 0, 0
    for j = 1, #ids do
      local id = ids[j]
      local c, k0 = cand[id], k[id]
      local E, cd = c.E, c.draft
      local e0 = k0 > 0 and E[k0] or 1
      for kk = k0 + 1, math.min(c.K, n_est - R + k0) do
        local nT, nD = Tok + E[kk] - e0, D + (kk - k0) * cd * eb
        local v = nT / (est[R + kk - k0] + nD)
        if v > bv then bi, bk, bv, bt, bd = id, kk, v, nT, nD end
      end
    end
    if not bi then return R, Tok, D, V end
    R, Tok, D, V = R + bk - k[bi], bt, bd, bv
    k[bi] = bk
  end
end

-- The step's drafts, planned at its first call for every running request
-- priced at its last call: grown from none, and grown from the same k for
-- every request likely to pass its first draft (below); the plan stands if
-- the step gains MIN_GAIN over no drafts. Unlike pricing each request at
-- the margin in call order (session 16), no request's drafts depend on
-- where it sits in the batch: four requests copying text get the same
-- drafts (4-5 each on an AVX2 cost curve), not 15 for the first two and
-- none for the rest. Returns each planned id's k, and the plan's rows and
-- tokens.
local function plan(state, b, est)
  local ids, k = {}, {}
  for _, r in ipairs(state.running or {}) do
    local c = cand[r.id]
    if c and c.method then ids[#ids + 1] = r.id; k[r.id] = 0 end
  end
  local V0 = b / est[b]
  local R, Tok, D, V = grow(ids, k, b, est, b, b, 0, V0)
  -- the same k for every request likely to pass its first draft (the k
  -- that makes the step fastest), then grown; it stands unless the plan
  -- grown from nothing is faster by more than BAL_SLACK. Where rows are
  -- cheap up to a point and dearer past it (Zen 5: 0.28 ms a row to 16
  -- rows, 0.36 past), one request's 12 drafts make the step as fast as
  -- four requests' 8 each, so the greedy plan gave one request all the
  -- drafts: the others fell behind, and the batch ended with requests
  -- running alone (tools/spec_replay.lua, four copying requests: 1.52x
  -- against 1.74x for n-gram k 8; with the even plan, 1.74x).
  local good = {}
  for _, id in ipairs(ids) do if cand[id].E[1] >= BAL_H1 + 1 then good[#good + 1] = id end end
  if #good > 1 then
    local bu, bvu = 0, V0
    for u = 1, MAX_DRAFTS do
      local r, t, d = b, b, 0
      for _, id in ipairs(good) do
        local c = cand[id]
        local kk = math.min(u, c.K)
        r, t, d = r + kk, t + c.E[kk] - 1, d + kk * c.draft * est[b]
      end
      if r > #est then break end
      local v = t / (est[r] + d)
      if v > bvu then bu, bvu = u, v end
    end
    if bu > 0 then
      local k2, r, t, d = {}, b, b, 0
      for _, id in ipairs(ids) do k2[id] = 0 end
      for _, id in ipairs(good) do
        local c = cand[id]
        k2[id] = math.min(bu, c.K)
        r, t, d = r + k2[id], t + c.E[k2[id]] - 1, d + k2[id] * c.draft * est[b]
      end
      local R2, Tok2, D2, V2 = grow(ids, k2, b, est, r, t, d, t / (est[r] + d))
      if V2 >= BAL_SLACK * V then k, R, Tok, V = k2, R2, Tok2, V2 end
    end
  end
  if V < MIN_GAIN * V0 then
    for id in pairs(k) do k[id] = 0 end
    return k, b, b
  end
  return k, R, Tok
end

-- this step: its T table up to b * (1 + MAX_DRAFTS) rows, the plan (each
-- planned id's k, and the method it was planned with), and the rows and
-- tokens granted (planned, then to requests the plan did not know, at the
-- margin)
local st_step, est, planned, planned_m, planned_e, R, Tok = -1, {}, {}, {}, {}, 0, 0
-- per request id, per method: its E(1..K) table, rewritten at each call
-- (a step allocates nothing for them: the hook runs interpreted, where a
-- table's allocation and collection are a good part of its time)
local ebuf = {}
-- key .. ctx, made once (a concatenation makes a string each call)
local keycat = {}
local function cat(a, b)
  local t = keycat[a]
  if not t then t = {}; keycat[a] = t end
  local v = t[b]
  if not v then v = a .. b; t[b] = v end
  return v
end
-- this step's cheapest extra row (cheapest_row): a method whose h_1 / b is
-- at most this plus its draft share gains nothing alone and is not priced
-- further (the same choices; at batch 4 with nothing worth drafting the
-- hook took 65 us a step, 45 with this and pop_prior's sums kept)
local row_floor = 0

local function speculate(req, state)
  local s, sp = req.speculation, state.spec
  if s.max_k < 1 then return false end
  local b, rt = math.max(sp.batch_size, 1), sp.row_time or {}
  local new_step = state.step ~= st_step
  if new_step then
    st_step, est = state.step, row_estimates(rt, b * (1 + MAX_DRAFTS), b, est)
    row_floor = cheapest_row(est, b)
  end
  -- the methods, each alone at the step's start: the request's best, and
  -- the best model proposer (alt: the step's proposer where n-gram lookup
  -- finds nothing to copy)
  local best_m, best_gain, bE, bK, bD = nil, 1, nil, 0, 0
  local alt_m, alt_gain, aE, aK, aD = nil, 1, nil, 0, 0
  local nothing = s.ngram == 0 -- n-gram drafts nothing this step
  -- a draft's row is also verified on the host: at temperature > 0 its
  -- whole distribution (0.03 ms on Zen 5, an eighth of a row's forward
  -- pass at batch 4)
  local vt = sp.verify_time and sp.verify_time[s.temperature > 0 and "sampled" or "greedy"] or 0
  for _, m in ipairs(METHODS) do
    if sp.available[m] then
      local p = m == s.method and s.k > 0 and PRIOR_WANT or PRIOR[m]
      local key = m
      if m == "ngram" and s.temperature > 0 then p, key = PRIOR_SAMPLED_NGRAM, "ngram sampled" end
      if m == "ngram" and s.temperature <= 0 and (s.ngram_match or 0) >= COPY_MATCH then p = math.max(p, PRIOR_COPY) end
      local ctx = (m ~= "ngram" and (s.ngram or 0) > 0) and "copy" or ""
      p = pop_prior(cat(key, ctx), p, req.id)
      observe(req.id, m, s.drafted[m] or 0, s.acceptance[m] or -1, key, ctx)
      if m == "ngram" and s.temperature <= 0 and s.ngram_match then
        observe_shadow(req.id, key, s.ngram_match, s.drafted[m] or 0, s.ngram or 0)
      end
      local dt = sp.draft_time[m] or 0
      local draft = (dt > 0 and sp.step_time > 0) and dt / sp.step_time or PRIOR_DRAFT[m]
      if vt > 0 and sp.step_time > 0 then draft = draft + vt / sp.step_time end
      local K = math.min(s.max_k, MAX_K[m] or s.max_k, MAX_DRAFTS)
      if first_depth(req.id, m, p, ctx) / b + 1e-12 >= row_floor + draft then
        local long = m == "ngram" and s.temperature <= 0 and (s.ngram_match or 0) >= LONG_MATCH
        local eb = ebuf[req.id]
        if not eb then eb = {}; ebuf[req.id] = eb end
        local E = expected_by_depth(req.id, m, p, K, ctx, (b > 1 and not long) and UNSEEN_DECAY or 1, eb[m])
        eb[m] = E
        local k, gain = best_k(E, est, b, b, b, draft, K)
        if k > 0 and gain > best_gain then best_m, best_gain, bE, bK, bD = m, gain, E, K, draft end
        if m ~= "ngram" and k > 0 and gain > alt_gain then alt_m, alt_gain, aE, aK, aD = m, gain, E, K, draft end
      end
    end
  end
  -- the plan knows the request by its method for the steps that have a
  -- copy ahead (n-gram's record), whatever this step's lookup finds
  local c = cand[req.id]
  if not c then c = {}; cand[req.id] = c end
  c.method, c.E, c.K, c.draft = best_m, bE, bK, bD
  if new_step then
    planned, R, Tok = plan(state, b, est)
    planned_m, planned_e = {}, {}
    for id, k in pairs(planned) do
      planned_m[id] = cand[id].method
      planned_e[id] = k > 0 and cand[id].E[k] or 1
    end
  end
  local k, m = planned[req.id], planned_m[req.id]
  if k and not (m == "ngram" and nothing and alt_m) then
    -- the plan's word (its method: the one its k was priced for), within what fits now
    k = math.min(k, s.max_k)
    return k > 0 and m or false, k
  end
  if k and k > 0 then -- n-gram planned, nothing to copy: its rows back, the model proposer at the margin
    R, Tok = R - k, Tok - (planned_e[req.id] - 1)
    planned[req.id] = 0
  end
  if best_m == "ngram" and nothing then best_m, bE, bK, bD = alt_m, aE, aK, aD end
  if not best_m then return false end
  -- a request the plan did not know: its drafts at the step's margin
  local kk, gain = best_k(bE, est, b, R, Tok, bD, bK)
  if kk == 0 or gain < MIN_GAIN then return false end
  R, Tok = R + kk, Tok - 1 + bE[kk]
  return best_m, kk
end

local function on_finish(req) seen[req.id], cand[req.id], shadow[req.id], ebuf[req.id] = nil, nil, nil, nil end

return {
  speculate = speculate,
  on_finish = on_finish,
  -- for tests and benchmarks
  _observe = observe,
  _observe_shadow = observe_shadow,
  _pop_prior = pop_prior,
  _FORGET = FORGET,
  _expected_by_depth = expected_by_depth,
  _row_estimates = row_estimates,
  _best_k = best_k,
  _first_depth = first_depth,
  _cheapest_row = cheapest_row,
  _plan = plan,
  _cand = cand,
}
