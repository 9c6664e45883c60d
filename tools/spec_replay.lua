-- spec_replay.lua — speculation policies replayed offline: greedy output
-- does not depend on speculation, so each workload's text is generated once
-- and every setting's rounds (what n-gram lookup drafts, how much of it the
-- text then holds) are replayed on it and priced on one cost curve. Two
-- policies compare on the same texts and the same costs, free of this
-- machine's noise (on a shared 2-core machine two runs of `bench spec` can
-- differ by 10-20%; here the same inputs give the same numbers).
--
--   ./build/luainfer run tools/spec_replay.lua [--policy F[,F...]] [--k 4,8,16]
--       [--rows 1=1.85,2=2.17,...] [--tokens N] [--variants N] [--batch 1,4] [--cold] [--oracle]
--
-- Workloads: bench spec's proposers workloads (luainfer.bench's
-- spec_workloads). Batch 1 replays the prompt and its variants 1..N (N = 4
-- unless given) one at a time and prints the geometric mean over them;
-- batch 4 replays variants 1-4 in lockstep, one forward pass a step over
-- every running request's rows (with N >= 8, also 5-8 and every further
-- group of four, and prints the geometric mean over the groups: one group's
-- lockstep run turns on a few decisions). The hook sees n-gram lookup's
-- drafts and match (req.speculation.ngram, ngram_match) as the engine
-- shows them. A setting's time is the sum over its steps
-- of T(rows), T the cost curve in ms (--rows: row count = ms pairs, linear
-- between them and past the last at the last two's slope; default: session
-- 24's Zen 5 model clock); the ratio is to no drafts. n-gram lookup is the
-- engine's own (luainfer.ngram_draft, n 4 down to 2). A policy is called as
-- the engine calls it, speculate(req, state), with every row count
-- measured (state.spec.row_time: the curve, as an engine shows it after
-- timing the counts up front, spec_calibrate), or with --cold as an engine
-- without that shows them (a count's cost once it has run twice: the
-- engine does not time a count's first, cold pass), and n-gram the only
-- proposer;
-- a request's drafts are capped at 16 and at the room before max_tokens,
-- and cut after an end-of-generation id (as the engine cuts them).
-- --oracle adds a setting no policy can run: each round drafts exactly
-- the tokens the text then holds (none where the first would fail). At
-- batch 1 that is what any n-gram policy could reach on this lookup and
-- curve; at batch 4 it is not a bound (a request's accepted drafts make
-- every step dearer while it runs, and gain only as far as they end the
-- batch sooner).
-- Not modelled: the proposer's and the policy's own time, prefill, cold
-- passes, sampling (greedy only). The policy's own time is measured apart
-- and printed under each table (CPU microseconds a step in speculate, the
-- policy run interpreted as a sandboxed policy is): on a 2.7 ms batch-4
-- step, 40 us is 1.5%.
local luainfer = require("luainfer")
local bench = require("luainfer.bench")

local flags = bench.take_flags(arg, { ["--policy"] = "value", ["--k"] = "value", ["--rows"] = "value",
                                      ["--tokens"] = "value", ["--variants"] = "value", ["--batch"] = "value",
                                      ["--cold"] = "flag", ["--oracle"] = "flag" })
local cold = flags["--cold"]
local root = (arg[0]:match("^(.*)/tools/") or ".")
local function fail(msg) io.stderr:write("spec_replay: " .. msg .. "\n"); os.exit(2) end
local function numbers(s, what)
  local t, msg = bench.number_list(s, nil, what, function(n) return n >= 1 and n % 1 == 0 end, "whole numbers >= 1")
  if not t then fail(msg) end
  return t
end
local policies = {}
for f in (flags["--policy"] or (root .. "/policies/spec_adaptive.lua")):gmatch("[^,]+") do
  local fh = io.open(f, "r")
  if not fh then fail(("--policy %s: cannot open the file"):format(f)) end
  fh:close()
  policies[#policies + 1] = f
end
local fixed = numbers(flags["--k"] or "4,8,16", "--k")
local batches = numbers(flags["--batch"] or "1,4", "--batch")
for _, b in ipairs(batches) do if b ~= 1 and b ~= 4 then fail("--batch: 1 and/or 4") end end
local MAX = numbers(flags["--tokens"] or "128", "--tokens")[1]
local NV = tonumber(flags["--variants"] or "4")
if not NV or NV < 0 or NV % 1 ~= 0 then fail("--variants: want a whole number >= 0") end

local pts = {}
for a, b in (flags["--rows"] or "1=1.85,2=2.17,4=2.56,8=3.38,16=5.60,32=11.29"):gmatch("([^,=]+)=([^,]+)") do
  local n, ms = tonumber(a), tonumber(b)
  if not n or not ms or n < 1 or n % 1 ~= 0 or ms <= 0 or (#pts > 0 and n <= pts[#pts][1]) then
    fail(("--rows: want rising row counts = positive ms, got %s=%s"):format(a, b))
  end
  pts[#pts + 1] = { n, ms }
end
if #pts < 2 or pts[1][1] ~= 1 then fail("--rows: want at least two points, the first for 1 row") end
local function T(n)
  for i = 1, #pts - 1 do
    local a, b = pts[i], pts[i + 1]
    if n <= b[1] then return a[2] + (b[2] - a[2]) * (n - a[1]) / (b[1] - a[1]) end
  end
  local a, b = pts[#pts - 1], pts[#pts]
  return b[2] + (n - b[1]) * (b[2] - a[2]) / (b[1] - a[1])
end
local row_time = {}
for n = 1, 64 do row_time[n] = T(n) / 1000 end

-- the texts: prompt tokens, then the greedy output, then the end-of-generation
-- id it stopped on (the result leaves it out; the engine's last step draws it,
-- and a copy's drafts can reach it: the one the prompt's chat template ends its
-- turns with, the last such id in the prompt)
local SW = bench.spec_workloads()
local e = luainfer.engine{ max_num_seqs = 1 }
local EOG = e:info().eog_ids -- drafts are cut after one, as the engine cuts them
local texts = {} -- [kind] = { [v + 1] = { t = tokens, np = prompt tokens } } for v = 0..max(NV, 4)
for _, kind in ipairs(SW.kinds) do
  texts[kind] = {}
  for v = 0, math.max(NV, 4) do
    local prompt = v == 0 and SW.prompts[kind] or SW.variant(SW.prompts[kind], v)
    local id = e:add{ prompt = prompt, max_tokens = MAX, temperature = 0 }
    e:run()
    local t = e:tokenize(prompt)
    local np = #t
    local res = e:result(id)
    for _, x in ipairs(res.tokens) do t[#t + 1] = x end
    if res.finish_reason == "stop" then
      local eog = EOG[1]
      for i = np, 1, -1 do
        local hit = false
        for _, g in ipairs(EOG) do hit = hit or t[i] == g end
        if hit then eog = t[i]; break end
      end
      t[#t + 1] = eog
    end
    texts[kind][v + 1] = { t = t, np = np }
  end
end
e:close()

local function lookup(t, n, k) -- the drafts for the first n tokens of t, and the match they copy from
  local ctx = {}
  for i = 1, n do ctx[i] = t[i] end
  return luainfer.ngram_draft(ctx, 4, 2, k, EOG)
end

-- Replays requests in lockstep (one, or four). choose(i, r, max_k, step,
-- live, row_time) -> k, row_time the costs the engine would show (every
-- count, or with --cold the counts run twice so far). Returns ms, steps,
-- drafted, accepted.
local function replay(set, choose)
  local shown, runs = cold and {} or row_time, {}
  local st = {}
  for i, x in ipairs(set) do st[i] = { x = x, cur = x.np + 1, dr = 0, ac = 0 } end -- after prefill: one token out
  local ms, steps = 0, 0
  while true do
    local live = {}
    for i, r in ipairs(st) do if r.cur < #r.x.t then live[#live + 1] = i end end
    if #live == 0 then break end
    steps = steps + 1
    local rows, props = 0, {}
    for _, i in ipairs(live) do
      local r = st[i]
      -- the room before max_tokens, as the engine caps it (not before the text's end, which
      -- only the replay knows: capped there, the rounds at the end of a text that ends before
      -- max_tokens were priced as if the engine knew where its reply would stop)
      local k = choose(i, r, math.min(16, MAX - (r.cur - r.x.np)), steps, live, shown)
      props[i] = k > 0 and lookup(r.x.t, r.cur, k) or {}
      rows = rows + 1 + #props[i]
    end
    ms = ms + T(rows)
    runs[rows] = (runs[rows] or 0) + 1
    if cold and runs[rows] >= 2 and rows <= 64 then shown[rows] = row_time[rows] end
    for _, i in ipairs(live) do
      local r, p = st[i], props[i]
      local a = 0
      while a < #p and p[a + 1] == r.x.t[r.cur + a + 1] do a = a + 1 end
      r.dr, r.ac, r.cur = r.dr + #p, r.ac + a, r.cur + a + 1
    end
  end
  local d, a = 0, 0
  for _, r in ipairs(st) do d, a = d + r.dr, a + r.ac end
  return ms, steps, d, a
end

-- a policy file loaded as the engine runs it sandboxed: never compiled
-- (the JIT off for its chunk and every function in it)
local function load_policy(f)
  local chunk = assert(loadfile(f))
  jit.off(chunk, true)
  return chunk()
end

-- the hook's own time per policy file and batch: CPU seconds in speculate,
-- and the steps it was called in
local hook = {}
local next_id = 0
local function policy_chooser(P, h)
  local base = next_id
  next_id = next_id + 16
  local last_step
  return function(i, r, mk, step, live, shown)
    local running = {}
    for _, j in ipairs(live) do running[#running + 1] = { id = base + j } end
    local d, match = lookup(r.x.t, r.cur, mk)
    local req = { id = base + i, num_generated = r.cur - r.x.np, speculation = { method = "ngram", k = 0, max_k = mk,
                  temperature = 0, acceptance = { ngram = r.dr > 0 and r.ac / r.dr or -1 }, drafted = { ngram = r.dr },
                  ngram = #d, ngram_match = match } }
    local state = { step = step, running = running, spec = { batch_size = #live, row_time = shown,
                    step_time = row_time[#live], token_time = row_time[1], draft_time = { ngram = 0 },
                    available = { ngram = true } } }
    local t0 = os.clock()
    local m, k = P.speculate(req, state)
    h.s = h.s + (os.clock() - t0)
    if step ~= last_step then h.steps, last_step = h.steps + 1, step end
    if m == "ngram" and type(k) == "number" then return math.max(0, math.min(math.floor(k), mk)) end
    return 0
  end, function()
    if P.on_finish then for j = 1, 16 do P.on_finish({ id = base + j }) end end
  end
end

local names = {}
for _, K in ipairs(fixed) do names[#names + 1] = "k" .. K end
if flags["--oracle"] then names[#names + 1] = "oracle" end
for _, f in ipairs(policies) do names[#names + 1] = f:match("([^/]+)%.lua$") or f end
local curve = {}
for _, p in ipairs(pts) do curve[#curve + 1] = ("%d %.2f"):format(p[1], p[2]) end
print(("speculation replayed: greedy texts of up to %d tokens, n-gram lookup; each setting's decode time on the " ..
       "cost curve (rows ms: %s) over no drafts (acceptance)%s"):format(MAX, table.concat(curve, ", "),
       cold and "; the policies see the costs a fresh engine has measured" or ""))
for _, B in ipairs(batches) do
  print(B == 1 and ("batch 1: geometric mean over the prompt and %d variants"):format(NV)
        or NV >= 8 and ("batch 4: variants 1-4, 5-8, ... to %d, each group in lockstep (geometric mean over the " ..
                        "groups)"):format(4 * math.floor(NV / 4))
        or "batch 4: variants 1-4 in lockstep")
  local head = { ("%-8s"):format("workload") }
  for _, n in ipairs(names) do head[#head + 1] = ("%-22s"):format(n) end
  print(table.concat(head, " "))
  for _, kind in ipairs(SW.kinds) do
    local sets = {}
    if B == 1 then
      for v = 0, NV do sets[#sets + 1] = { texts[kind][v + 1] } end
    else
      for g = 0, math.max(1, math.floor(NV / 4)) - 1 do
        sets[#sets + 1] = { texts[kind][4 * g + 2], texts[kind][4 * g + 3], texts[kind][4 * g + 4],
                            texts[kind][4 * g + 5] }
      end
    end
    local line = { ("%-8s"):format(kind) }
    local function measure(make)
      local lr, d, a = 0, 0, 0
      for _, set in ipairs(sets) do
        local off = replay(set, function() return 0 end)
        local choose, done = make()
        local ms, _, d1, a1 = replay(set, choose)
        if done then done() end
        lr, d, a = lr + math.log(off / ms), d + d1, a + a1
      end
      line[#line + 1] = ("%-22s"):format(("%.2fx (%d%%)"):format(math.exp(lr / #sets), d > 0 and math.floor(100 * a / d + 0.5) or 0))
    end
    for _, K in ipairs(fixed) do measure(function() return function(_, _, mk) return math.min(K, mk) end end) end
    if flags["--oracle"] then -- k: the run of the lookup's drafts the text holds
      measure(function() return function(_, r, mk)
        local p, a = lookup(r.x.t, r.cur, mk), 0
        while a < #p and p[a + 1] == r.x.t[r.cur + a + 1] do a = a + 1 end
        return a
      end end)
    end
    for _, f in ipairs(policies) do
      hook[f] = hook[f] or { s = 0, steps = 0 }
      measure(function() return policy_chooser(load_policy(f), hook[f]) end)
    end
    print(table.concat(line, " "))
  end
  if #policies > 0 then
    local t = {}
    for _, f in ipairs(policies) do
      t[#t + 1] = ("%s %.1f"):format(f:match("([^/]+)%.lua$") or f, hook[f].s / math.max(1, hook[f].steps) * 1e6)
      hook[f] = nil
    end
    print("the hook's own time, us a step, interpreted as sandboxed (not in the ratios; the engine adds its " ..
          "marshalling, 14-20 us here): " .. table.concat(t, ", "))
  end
end
