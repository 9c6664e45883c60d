-- luainfer.policy — helpers for scheduling policies.
--
-- Policies run in a sandbox where `require("luainfer.policy")` is the one
-- module available. Everything here only *reads* the state table the engine
-- hands to schedule() and builds a plan table; the engine validates and
-- applies the plan (see docs/policy-protocol.md).
--
-- The state (fields the helpers use):
--   state.running / state.waiting / state.preempted   arrays of request tables, arrival order
--   state.kv.free_blocks, state.kv.block_size, state.kv.running_need
--   state.budget.max_num_seqs, state.budget.max_batched_tokens
-- A request: id, state ("waiting"|"running"|"preempted"), arrival, priority,
-- tenant, prompt_len, num_tokens, num_computed, blocks, max_tokens,
-- projected_blocks (blocks still needed to reach its end), preemptions, ...
--
-- A request is `num_computed` catching up with `num_tokens`: a decode wants
-- 1 token, a prefill wants the rest of its prompt (chunked to the budget).

local M = { version = 1 }

local ceil, floor, min, max = math.ceil, math.floor, math.min, math.max
local sort = table.sort

-- KV blocks a request must newly get to compute n more tokens.
function M.blocks_needed(req, n, block_size)
  local need = ceil((req.num_computed + n) / block_size) - req.blocks
  if need < 0 then return 0 end
  return need
end
local blocks_needed = M.blocks_needed

-- Tokens the request still has to compute before it can sample again.
function M.remaining(req)
  return req.num_tokens - req.num_computed
end

-- Work left in a request, in tokens: the prompt still to prefill plus what
-- it may still generate (the SJF key).
function M.job_size(req)
  local prefill = req.prompt_len - req.num_computed
  if prefill < 0 then prefill = 0 end
  return prefill + max(0, req.max_tokens - req.num_generated)
end

-- Sorts `list` in place by key(req) ascending, ties by arrival then id, so
-- the order is total and every run gives the same plan.
function M.sort_by(list, key)
  sort(list, function(a, b)
    local ka, kb = key(a), key(b)
    if ka ~= kb then return ka < kb end
    if a.arrival ~= b.arrival then return a.arrival < b.arrival end
    return a.id < b.id
  end)
  return list
end

-- Concatenates arrays into a new one.
function M.concat(...)
  local out, n = {}, 0
  for k = 1, select("#", ...) do
    local t = select(k, ...)
    for i = 1, #t do
      n = n + 1
      out[n] = t[i]
    end
  end
  return out
end

-- The greedy scheduler every shipped policy builds on.
--
-- `order` lists candidate requests (running and queued ones, any mix) in the
-- order they should be served. Walking it, each request gets
-- min(remaining, token budget) tokens while max_num_seqs, max_batched_tokens
-- and the free KV blocks last. When a request is short of blocks:
--   * it may preempt (recompute) running requests that come *later* in
--     `order`, latest first, if opts.may_preempt(req, victim) says so
--     (default: only a running request may preempt, any later running one);
--   * a prefill chunk shrinks to what the free blocks hold;
--   * a running request that cannot get even one token preempts itself;
--   * a queued request that does not fit stops admission of queued requests
--     for this step (no overtaking; opts.skip_blocked = true lets later
--     queued requests try instead; with opts.queue_key(req) only queued
--     requests with the same key are stopped). Running requests are still
--     served.
-- opts.max_tokens(req) may cap a request's tokens this step;
-- opts.on_run(req, tokens) is told each entry as it is added.
-- opts.project = true admits queued requests against projected blocks
-- (M.fcfs sets it; docs/kv-cache.md, "Admission under pressure"): while the
-- pool is under pressure (a request is preempted, or a live one was
-- preempted before), a queued request does not fit, unless nothing runs yet,
-- when it and the members (the running requests not preempted, and the
-- queued ones admitted before it), each carried to its end at one token a
-- step, would at some step need more blocks at once than are free
-- (M.peak_fits). Past PEAK_MAX members the test is the sum of projections:
-- projected_blocks over the headroom (free blocks less
-- state.kv.running_need, what the running set still needs to reach its ends).
-- Returns { run = { {id=, tokens=}, ... }, preempt = { id, ... } }.
-- ---- the projected peak (core/policy/fcfs.c says the same) ----------------------
-- A member goes from num_tokens - 1 tokens of KV (a prefill's rest computed
-- in this step) one token a step to its end, the KV of prompt + max_tokens
-- - 1 tokens (or less where its projection says: context, pool), then frees
-- every block it holds. The members' extra blocks rise between finishes and
-- drop at each, so the peak is at some member's last step.
local PEAK_MAX = 256
M.PEAK_MAX = PEAK_MAX

-- base, end (tokens), held (blocks), life (steps to its end, >= 1) and
-- projected blocks of r.
function M.peak_of(r, bs)
  local held, proj = r.blocks, r.projected_blocks or 0
  local e = min(r.prompt_len + r.max_tokens - 1, (held + proj) * bs)
  if e < r.num_tokens then e = r.num_tokens end
  local base = r.num_tokens - 1
  return base, e, held, e - base, proj
end
local peak_of = M.peak_of

-- Blocks a member needs beyond those it holds during step t (finished: it
-- gives them back, negative); it never returns blocks early, nor takes more
-- than its projection (so this never holds what the sum of projections admits).
local function peak_extra(base, e, held, life, proj, t, bs)
  if t > life then return -held end
  local need = min(ceil(min(e, base + t) / bs) - held, proj)
  if need < 0 then return 0 end
  return need
end

-- The members: arrays reused from step to step.
local pk_base, pk_end, pk_held, pk_life, pk_proj, pk_x = {}, {}, {}, {}, {}, {}
local pk_n = 0

local function peak_clear() pk_n = 0 end

-- Whether request r fits beside the members with `avail` blocks free.
local function peak_fits(r, bs, avail)
  local cb, ce, ch, cl, cp = peak_of(r, bs)
  local xc = peak_extra(cb, ce, ch, cl, cp, cl, bs)
  for j = 1, pk_n do xc = xc + peak_extra(pk_base[j], pk_end[j], pk_held[j], pk_life[j], pk_proj[j], cl, bs) end
  if xc > avail then return false end
  for j = 1, pk_n do
    if pk_x[j] + peak_extra(cb, ce, ch, cl, cp, pk_life[j], bs) > avail then return false end
  end
  return true
end

-- r joins the members (the caller checks pk_n < PEAK_MAX).
local function peak_add(r, bs)
  local cb, ce, ch, cl, cp = peak_of(r, bs)
  local xc = peak_extra(cb, ce, ch, cl, cp, cl, bs)
  for j = 1, pk_n do
    xc = xc + peak_extra(pk_base[j], pk_end[j], pk_held[j], pk_life[j], pk_proj[j], cl, bs)
    pk_x[j] = pk_x[j] + peak_extra(cb, ce, ch, cl, cp, pk_life[j], bs)
  end
  pk_n = pk_n + 1
  pk_base[pk_n], pk_end[pk_n], pk_held[pk_n], pk_life[pk_n], pk_proj[pk_n], pk_x[pk_n] = cb, ce, ch, cl, cp, xc
end

-- For a policy of its own: whether `req` can be carried to its end beside
-- `members` (a list of requests, e.g. state.running) with `avail` free blocks.
function M.peak_fits(req, members, avail, block_size)
  peak_clear()
  for i = 1, min(#members, PEAK_MAX) do peak_add(members[i], block_size) end
  return peak_fits(req, block_size, avail)
end

local NO_OPTS = {}
local function running_may_preempt(req) return req.state == "running" end

-- The members at the first queued request: every running request the plan
-- does not preempt. Returns the blocks free for them (free now + what the
-- preempted give back) and whether they are past PEAK_MAX.
local function peak_build(state, preempt, bs)
  peak_clear()
  local avail, over = state.kv.free_blocks, false
  local rs = state.running or NO_OPTS
  for k = 1, #rs do
    local v = rs[k]
    local gone = false
    for q = 1, #preempt do
      if preempt[q] == v.id then gone = true; break end
    end
    if gone then avail = avail + v.blocks
    elseif pk_n == PEAK_MAX then over = true
    else peak_add(v, bs) end
  end
  return avail, over
end

-- Marks by position in `order`, stamped with a per-call generation so the
-- arrays are reused from step to step (no garbage, no rehashing).
local marked_gen, gen = {}, 0

function M.greedy(state, order, opts)
  opts = opts or NO_OPTS
  local may_preempt = opts.may_preempt or running_may_preempt
  local cap = opts.max_tokens
  local queue_key, on_run = opts.queue_key, opts.on_run
  local bs = state.kv.block_size
  local budget = state.budget.max_batched_tokens
  local seqs = state.budget.max_num_seqs
  local free = state.kv.free_blocks
  local project = opts.project
  local headroom = free - (state.kv.running_need or 0)
  local pressure = false
  if project then
    local all = state.requests or NO_OPTS
    for i = 1, #all do
      local r = all[i]
      if r.state == "preempted" or (r.preemptions or 0) > 0 then pressure = true; break end
    end
  end
  local run, preempt = {}, {}
  local admitting, blocked = true, nil
  -- the projected peak's members, built at the first queued request under
  -- pressure; pk_over: past PEAK_MAX members, headroom decides
  local pk_built, pk_over, pk_avail = false, false, 0
  local n = #order
  gen = gen + 1
  local g = gen
  for i = #marked_gen + 1, n do marked_gen[i] = 0 end
  for i = 1, n do
    if budget <= 0 or seqs <= 0 then break end
    local r = order[i]
    local running = r.state == "running"
    if marked_gen[i] ~= g and (running or (admitting and not (blocked and blocked[queue_key(r)]))) then
      local want = min(r.num_tokens - r.num_computed, budget)
      if cap then want = min(want, cap(r)) end
      -- projected: it cannot be carried to its end beside the running set
      local pressed = project and not running and want > 0 and (pressure or #preempt > 0)
      if pressed and not pk_built then
        pk_built = true
        pk_avail, pk_over = peak_build(state, preempt, bs)
      end
      local held = false
      if pressed and #run > 0 then
        if not pk_over and pk_n < PEAK_MAX then held = not peak_fits(r, bs, pk_avail)
        else held = (r.projected_blocks or 0) > headroom end
      end
      if held then
        if queue_key then
          blocked = blocked or {}
          blocked[queue_key(r)] = true
        elseif not opts.skip_blocked then
          admitting = false
        end
        want = 0
      end
      if want > 0 then
        local need = blocks_needed(r, want, bs)
        local j = n
        while need > free and j > i do
          local v = order[j]
          if marked_gen[j] ~= g and v.state == "running" and may_preempt(r, v) then
            preempt[#preempt + 1] = v.id
            marked_gen[j] = g
            free = free + v.blocks
            headroom = headroom + v.blocks + (v.projected_blocks or 0)
          end
          j = j - 1
        end
        if need > free then
          -- a prefill chunk can shrink to what fits; a decode cannot
          local fit = (r.blocks + free) * bs - r.num_computed
          if fit > 0 then
            want = fit
            need = blocks_needed(r, want, bs)
          elseif running then
            preempt[#preempt + 1] = r.id
            marked_gen[i] = g
            free = free + r.blocks
            headroom = headroom + r.blocks + (r.projected_blocks or 0)
            want = 0
          else
            if queue_key then
              blocked = blocked or {}
              blocked[queue_key(r)] = true
            elseif not opts.skip_blocked then
              admitting = false
            end
            want = 0
          end
        end
        if want > 0 then
          run[#run + 1] = { id = r.id, tokens = want }
          marked_gen[i] = g
          budget = budget - want
          seqs = seqs - 1
          free = free - need
          if not running then
            headroom = headroom - (r.projected_blocks or 0)
            if pressed then
              if not pk_over and pk_n < PEAK_MAX then peak_add(r, bs) else pk_over = true end
            end
          end
          if on_run then on_run(r, want) end
        end
      end
    end
  end
  return { run = run, preempt = preempt }
end

-- FCFS with chunked prefill and recompute preemption: the same plan as the
-- engine's built-in fallback. Running requests in arrival order first
-- (a running request short of blocks preempts the latest-arrived running
-- one), then preempted, then waiting requests in arrival order; the first
-- queued request that does not fit stops admission. Under KV pressure a
-- queued request fits only if its projected blocks do (opts.project), so a
-- preempted request resumes only when it can finish.
local FCFS_OPTS = { project = true }
function M.fcfs(state, opts)
  local order = M.concat(state.running, state.preempted, state.waiting)
  if opts == nil then opts = FCFS_OPTS
  elseif opts.project == nil then
    local o = { project = true }
    for k, v in pairs(opts) do o[k] = v end
    opts = o
  end
  return M.greedy(state, order, opts)
end

return M
