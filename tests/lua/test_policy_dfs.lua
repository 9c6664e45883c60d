-- test_policy_dfs.lua — req.prefix_hashes and dfs_weight.lua:
--  * req.prefix_hashes lists the chain hashes of the prompt's full blocks
--    (all but the last token's block), 16-byte strings: equal exactly where
--    two prompts share the blocks, none for a one-block prompt, none with
--    prefix caching off; in-process and in an isolated policy process;
--  * dfs_weight.lua, with one sequence slot, admits the queued requests by
--    the weight of their prefix subtree (ties: cached, then first arrival),
--    where default.lua takes arrival order; greedy texts are default.lua's.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local H = require("harness")
local luainfer = require("luainfer")
local root = H.repo_root()

-- a "document" of 3 full blocks (48 tokens) per letter, then a question
local function doc(letter)
  local t = {}
  for k = 1, 48 do t[k] = 2000 + (letter:byte() * 131 + k * 977) % 20000 end
  return t
end
local function prompt(letter, q)
  local t = doc(letter)
  for k = 1, 5 do t[#t + 1] = 500 + q * 10 + k end
  return t
end

-- ---- the view: prefix_hashes --------------------------------------------------------
-- a spy: admit of a request of tenant "probe" is refused with what the
-- policy saw of every request's prefix_hashes, as "id:n:hex-of-hashes;..."
local SPY = [[
local policy = require("luainfer.policy")
local function hex(s) return (s:gsub(".", function(c) return string.format("%02x", c:byte()) end)) end
return {
  admit = function(req, state)
    if req.tenant ~= "probe" then return true end
    local out = {}
    for _, r in ipairs(state.requests) do
      local h = r.prefix_hashes
      local parts = {}
      -- 8 hex digits of each (the refusal reason holds 255 bytes)
      for i, x in ipairs(h) do parts[i] = #x == 16 and hex(x):sub(1, 8) or "BAD" end
      out[#out + 1] = r.id .. ":" .. #h .. ":" .. table.concat(parts, ",")
    end
    return false, table.concat(out, ";")
  end,
  schedule = function(state) return policy.fcfs(state) end,
}
]]
local spy = os.tmpname() .. ".lua"
H.temp_files = { spy }
do
  local f = assert(io.open(spy, "w"))
  f:write(SPY)
  f:close()
end

local function seen(iso, caching)
  local e = luainfer.engine{ policy = spy, policy_isolation = iso, max_num_seqs = 1, prefix_caching = caching }
  local function add(t) return e:add{ tokens = t, max_tokens = 2, temperature = 0, ignore_eos = true } end
  local ids = { add(prompt("A", 1)), add(prompt("A", 2)), add(prompt("B", 1)),
                add({ 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27 }) }
  e:step() -- every waiting request probed once
  local ok, err = pcall(e.add, e, { prompt = "x", max_tokens = 1, tenant = "probe" })
  e:run()
  e:close()
  H.check(not ok, "%s: the probe is refused", iso)
  local got = {}
  for id, n, hs in tostring(err):gmatch("(%d+):(%d+):([%x,]*)") do
    local list = {}
    for x in hs:gmatch("%x+") do list[#list + 1] = x end
    got[tonumber(id)] = { n = tonumber(n), h = list }
  end
  return ids, got
end

local views = {}
for _, iso in ipairs({ "inprocess", "process" }) do
  local ids, got = seen(iso, true)
  views[iso] = got
  local a1, a2, b1, short = got[ids[1]], got[ids[2]], got[ids[3]], got[ids[4]]
  if H.check(a1 and a2 and b1 and short, "%s: every request seen", iso) then
    -- 53 tokens: 3 full blocks before the last token's; 17 tokens: 1
    H.check(a1.n == 3 and a2.n == 3 and b1.n == 3 and short.n == 1, "%s: block counts %d %d %d %d", iso, a1.n,
      a2.n, b1.n, short.n)
    H.check(H.eq_list(a1.h, a2.h), "%s: the same document, the same hashes", iso)
    H.check(a1.h[1] ~= b1.h[1] and a1.h[3] ~= b1.h[3], "%s: other documents, other hashes", iso)
    H.check(a1.h[1] ~= a1.h[2] and #a1.h[1] == 8, "%s: a chain of 16-byte hashes", iso)
  end
end
-- the isolated process sees exactly what the in-process policy sees
for id, v in pairs(views.inprocess) do
  local w = views.process[id]
  H.check(w and H.eq_list(v.h, w.h), "request %d: in-process and isolated hashes differ", id)
end
local ids, off = seen("inprocess", false)
H.check(off[ids[1]] and off[ids[1]].n == 0, "prefix caching off: no hashes")

-- ---- dfs_weight: the promised order ------------------------------------------------
-- X holds the only sequence slot; then arrive A1 B1 A2 C1 A3 B2 (A: 3
-- requests share a document, B: 2, C: 1). dfs_weight admits by subtree
-- weight: A1 (A 3 > B 2 > C 1), A2 (A 2 = B 2, A's blocks cached), B1
-- (B 2 > A 1), then A3 B2 C1 (1 each: cached first, then first arrival);
-- default.lua: arrival order.
local arrivals = { { "A", 1 }, { "B", 1 }, { "A", 2 }, { "C", 1 }, { "A", 3 }, { "B", 2 } }
local texts = {}
for _, pol in ipairs({ "default", "dfs_weight", "lpm" }) do
  local e = luainfer.engine{ policy = root .. "/policies/" .. pol .. ".lua", max_num_seqs = 1 }
  local x = e:add{ tokens = prompt("X", 0), max_tokens = 3, temperature = 0, ignore_eos = true }
  e:step()
  local ids, name = {}, {}
  for i, a in ipairs(arrivals) do
    ids[i] = e:add{ tokens = prompt(a[1], a[2]), max_tokens = 3, temperature = 0, ignore_eos = true }
    name[ids[i]] = a[1] .. a[2]
  end
  e:run()
  local order = {}
  for i = 1, #ids do order[i] = ids[i] end
  table.sort(order, function(p, q) return e:result(p).finish_time < e:result(q).finish_time end)
  local got = {}
  for k, id in ipairs(order) do got[k] = name[id] end
  local want = pol == "default" and "A1 B1 A2 C1 A3 B2" or pol == "dfs_weight" and "A1 A2 B1 A3 B2 C1" or nil
  if want then
    H.check(table.concat(got, " ") == want, "%s: finish order %s, want %s", pol, table.concat(got, " "), want)
  end
  texts[pol] = {}
  for i, id in ipairs(ids) do texts[pol][i] = e:result(id).text end
  texts[pol].x = e:result(x).text
  if pol == "dfs_weight" then
    local hits = 0
    for _, id in ipairs(ids) do hits = hits + e:result(id).cached_tokens end
    -- A2, A3 and B2 find their document's 3 blocks cached
    H.check(hits >= 3 * 48, "dfs_weight: %d cached prompt tokens, want >= 144", hits)
  end
  e:close()
end
for i = 1, #arrivals do
  H.check(texts.dfs_weight[i] == texts.default[i], "request %d: dfs_weight's text differs from default's", i)
end
H.check(texts.dfs_weight.x == texts.default.x, "X's text differs")

H.finish("test_policy_dfs")
