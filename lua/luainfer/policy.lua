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
-- preempted before), a queued request whose projected_blocks exceed the
-- headroom (free blocks less state.kv.running_need, what the running set
-- still needs to reach its ends) does not fit, unless nothing runs yet.
-- Returns { run = { {id=, tokens=}, ... }, preempt = { id, ... } }.
local NO_OPTS = {}
local function running_may_preempt(req) return req.state == "running" end

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
      local held = project and not running and want > 0 and (pressure or #preempt > 0)
        and (r.projected_blocks or 0) > headroom and #run > 0
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
          if not running then headroom = headroom - (r.projected_blocks or 0) end
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
