-- test_policy_lab.lua — the policy lab's schedulers each do what they
-- promise on a small workload, and none changes a greedy output:
--  * lof.lua: with one sequence at a time, queued requests finish longest
--    output first;
--  * hrrn.lua: short jobs first, as SJF, but a long job that has waited long
--    enough goes before a short newcomer (SJF would take the newcomer);
--  * every policy gives each request the text policies/default.lua gives.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local H = require("harness")
local luainfer = require("luainfer")
local root = H.repo_root()

local function engine(policy)
  return luainfer.engine{ policy = root .. "/policies/" .. policy .. ".lua", max_num_seqs = 1 }
end

local function req(i, max_tokens)
  return { prompt = ("Request %d: the river town grew slowly"):format(i), max_tokens = max_tokens,
           temperature = 0, ignore_eos = true }
end

-- the ids in the order they finished
local function finish_order(e, ids)
  local order = {}
  for _, id in ipairs(ids) do order[#order + 1] = id end
  table.sort(order, function(a, b) return e:result(a).finish_time < e:result(b).finish_time end)
  return order
end

-- ---- lof: longest output first ------------------------------------------------
local lens = { 3, 9, 5, 7 }
local texts = {}
for _, policy in ipairs({ "default", "lof", "sjf" }) do
  local e = engine(policy)
  local ids = {}
  for i, n in ipairs(lens) do ids[i] = e:add(req(i, n)) end
  e:run()
  local order, got = finish_order(e, ids), {}
  for k, id in ipairs(order) do
    for i, x in ipairs(ids) do if x == id then got[k] = lens[i] end end
  end
  local want = ({ default = { 3, 9, 5, 7 }, lof = { 9, 7, 5, 3 }, sjf = { 3, 5, 7, 9 } })[policy]
  H.check(H.eq_list(got, want), "%s: finish order by output length %s, want %s", policy, table.concat(got, ","),
    table.concat(want, ","))
  texts[policy] = {}
  for i, id in ipairs(ids) do texts[policy][i] = e:result(id).text end
  e:close()
end

-- ---- hrrn: aging beats a short newcomer ------------------------------------------
-- X runs first (the only sequence slot); L (long) waits behind it for X's
-- 30 tokens; S (short) arrives on X's last step. L's ratio 1 + wait/service
-- is ~1.4 by then, S's ~1.1: HRRN runs L next, SJF runs S next.
for _, case in ipairs({ { policy = "hrrn", want = "XLS" }, { policy = "sjf", want = "XSL" } }) do
  local e = engine(case.policy)
  local x = e:add(req(1, 30))
  local l = e:add(req(2, 60))
  while #e:result(x).tokens < 29 do e:step() end
  local s = e:add(req(3, 4))
  e:run()
  local names = { [x] = "X", [l] = "L", [s] = "S" }
  local got = ""
  for _, id in ipairs(finish_order(e, { x, l, s })) do got = got .. names[id] end
  H.check(got == case.want, "%s: finish order %s, want %s", case.policy, got, case.want)
  for _, id in ipairs({ x, l, s }) do
    H.check(#e:result(id).tokens == ({ [x] = 30, [l] = 60, [s] = 4 })[id], "%s: every request ran to its length",
      case.policy)
  end
  e:close()
end

-- ---- no policy changes what is computed -------------------------------------------
for _, policy in ipairs({ "lof", "sjf" }) do
  for i = 1, #lens do
    H.check(texts[policy][i] == texts.default[i], "%s: request %d's greedy text is default.lua's", policy, i)
  end
end
do -- hrrn on the lof workload
  local e = engine("hrrn")
  local ids = {}
  for i, n in ipairs(lens) do ids[i] = e:add(req(i, n)) end
  e:run()
  for i, id in ipairs(ids) do
    H.check(e:result(id).text == texts.default[i], "hrrn: request %d's greedy text is default.lua's", i)
  end
  e:close()
end

H.finish("test_policy_lab")
