-- test_spec_isolated.lua — the speculate(req, state) hook works the same in
-- an isolated policy host (policy_isolation = "process") as in-process:
--  * a deterministic hook (k from each request's progress) gives the same
--    drafts, acceptances and outputs (tokens and logprob bits) in both
--    modes, and the outputs are those without speculation;
--  * the hook sees the same req.speculation and state.spec through the wire
--    (a hook asserting their shape raises no error);
--  * policies/spec_adaptive.lua runs isolated: it drafts, exactly;
--  * a hostile hook (an unknown method, a table for k) is a policy error
--    each step in both modes: the requests' wants stand (here: no drafts),
--    the outputs do not change, and the engine carries on.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local H = require("harness")
local luainfer = require("luainfer")
local root = H.repo_root()

local prompts = {
  "Repeat this list exactly: apple, banana, cherry, dates, elderberry, fig, grape. Again: apple, banana,",
  "one two three four five six seven eight nine ten one two three four five six seven",
}

local function run(cfg)
  local e = luainfer.engine(cfg)
  local ids = {}
  for i, p in ipairs(prompts) do
    ids[i] = e:add{ prompt = p, max_tokens = 20, temperature = 0, ignore_eos = true, logprobs = 1 }
  end
  e:run()
  local out = {}
  for i = 1, #prompts do out[i] = e:result(ids[i]) end
  local s = e:stats()
  e:close()
  return out, s
end

local function same(a, b, label)
  for i = 1, #b do
    local ok = H.eq_list(a[i].tokens, b[i].tokens)
    for j, ent in ipairs(b[i].logprobs) do ok = ok and a[i].logprobs[j].logprob == ent.logprob end
    H.check(ok, "%s: request %d differs", label, i)
  end
end

local function policy_file(src)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(src)
  f:close()
  return path
end

local base = run{ max_num_seqs = 4 }

local det = policy_file([[
return { speculate = function(req, state)
  local s, sp = req.speculation, state.spec
  assert(type(s.method) == "string" and s.max_k >= 1 and s.acceptance.ngram and s.drafted.layerskip, "req.speculation")
  assert(sp.batch_size >= 1 and sp.step_time >= 0 and sp.draft_time.ngram and sp.available.ngram == true
         and sp.available.draft == false, "state.spec")
  -- a row's verification is timed once a request's drafts were verified:
  -- greedy rows only here
  local verified = 0
  for _, d in pairs(s.drafted) do verified = verified + d end
  assert(type(sp.verify_time) == "table" and sp.verify_time.sampled == nil, "state.spec.verify_time")
  assert(verified == 0 or (sp.verify_time.greedy or 0) > 0, "state.spec.verify_time.greedy after drafts verified")
  local rows = 0
  for n, t in pairs(sp.row_time) do
    assert(type(n) == "number" and n >= 1 and n <= 64 and n == math.floor(n) and t > 0, "state.spec.row_time entries")
    rows = rows + 1
  end
  -- decode steps of these few requests compute at most 64 rows each (a
  -- row count's first pass is not timed: it shows from its second)
  assert(rows >= 1 or req.num_generated < 8, "state.spec.row_time holds the decode steps measured so far")
  -- n-gram lookup's match crosses the wire: the answer turns on it, and
  -- both modes must draft the same
  assert(type(s.ngram_match) == "number" and s.ngram_match >= 0 and s.ngram_match <= 64 and
         (s.ngram == 0) == (s.ngram_match == 0), "req.speculation.ngram_match")
  local n = (req.num_generated + s.ngram_match) % 3
  if n == 0 then return false end
  return "ngram", n + 1
end }
]])
local outs, stats = {}, {}
for _, iso in ipairs({ "inprocess", "process" }) do
  outs[iso], stats[iso] = run{ max_num_seqs = 4, spec_disable_batch = 0, policy = det, policy_isolation = iso }
  same(outs[iso], base, iso .. ": deterministic hook vs speculation off")
  H.check(stats[iso].policy_errors == 0, "%s: no policy errors (%d)", iso, stats[iso].policy_errors)
  H.check(stats[iso].spec_by.ngram.drafted > 0, "%s: the hook made drafts (%d)", iso, stats[iso].spec_by.ngram.drafted)
end
for _, k in ipairs({ "drafted", "accepted" }) do
  H.check(stats.inprocess.spec_by.ngram[k] == stats.process.spec_by.ngram[k], "the same %s in both modes: %d, %d", k,
    stats.inprocess.spec_by.ngram[k], stats.process.spec_by.ngram[k])
end
H.check(stats.inprocess.steps == stats.process.steps, "the same steps in both modes: %d, %d", stats.inprocess.steps,
  stats.process.steps)
os.remove(det)

local ad, s_ad = run{ max_num_seqs = 4, spec_layers = 29, policy = root .. "/policies/spec_adaptive.lua",
                      policy_isolation = "process" }
same(ad, base, "spec_adaptive isolated")
H.check(s_ad.spec_drafted > 0 and s_ad.policy_errors == 0, "spec_adaptive isolated drafted (%d), no policy errors (%d)",
  s_ad.spec_drafted, s_ad.policy_errors)

for _, body in ipairs({ 'return "bogus", 2', "return {}", 'return "ngram", -1' }) do
  local bad = policy_file("return { speculate = function(req, state) " .. body .. " end }")
  for _, iso in ipairs({ "inprocess", "process" }) do
    local out, s = run{ max_num_seqs = 4, spec_disable_batch = 0, policy = bad, policy_isolation = iso }
    same(out, base, iso .. ": hostile hook '" .. body .. "'")
    H.check(s.policy_errors > 0 and s.spec_drafted == 0, "%s: '%s' is a policy error (%d), no drafts (%d)", iso, body,
      s.policy_errors, s.spec_drafted)
  end
  os.remove(bad)
end

H.finish("test_spec_isolated")
