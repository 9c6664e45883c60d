-- test_spec_replay.lua — tools/spec_replay.lua and luainfer.ngram_draft:
--  * ngram_draft is the engine's lookup (the latest match, n_max down to
--    n_min, k caps it, cut after a stop id) and refuses bad arguments;
--  * the replay prints every workload at batch 1 and 4, n-gram k8 gains on
--    the copying workloads and not on the story, and a policy that never
--    drafts reads 1.00x;
--  * the same inputs give the same output, byte for byte, but the lines of
--    the policies' own time (CPU time, printed under each table);
--  * bad flags exit with the reason.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local H = require("harness")
local luainfer = require("luainfer")
local root = H.repo_root()

local d = luainfer.ngram_draft({ 7, 8, 9, 7, 8 }, 4, 2, 8)
H.check(#d == 3 and d[1] == 9 and d[2] == 7 and d[3] == 8, "ngram_draft: what followed {7 8} (%d tokens)", #d)
d = luainfer.ngram_draft({ 5, 6, 1, 5, 6, 2, 5, 6 }, 2, 2, 1)
H.check(#d == 1 and d[1] == 2, "ngram_draft: the latest match, k caps it (%s)", tostring(d[1]))
H.check(#luainfer.ngram_draft({ 1, 2, 3, 4 }, 4, 2, 8) == 0, "ngram_draft: no repeat, no draft")
d = luainfer.ngram_draft({ 7, 8, 9, 7, 8 }, 4, 2, 8, { 7, 3 })
H.check(#d == 2 and d[1] == 9 and d[2] == 7, "ngram_draft: cut after a stop id (%d tokens)", #d)
d = luainfer.ngram_draft({ 7, 8, 9, 7, 8 }, 4, 2, 8, {})
H.check(#d == 3, "ngram_draft: no stop ids, no cut (%d tokens)", #d)
H.check(not pcall(luainfer.ngram_draft, { 7, 8, 9, 7, 8 }, 4, 2, 8, 7), "ngram_draft: stop must be a table")
for _, bad in ipairs({ { { 1, 2 }, 2, 3, 4 }, { { 1, 2 }, 4, 2, -1 }, { { 1, "x" }, 4, 2, 2 }, { 7, 4, 2, 2 } }) do
  local ok, err = pcall(luainfer.ngram_draft, bad[1], bad[2], bad[3], bad[4])
  H.check(not ok, "ngram_draft refuses bad arguments: %s", tostring(err))
end

local bin = H.luainfer_bin()
if not bin then
  print("SKIP: the replay's runs: cannot find the luainfer binary running this test (/proc/$PPID/exe)")
  H.finish("test_spec_replay")
  return
end
local never = os.tmpname()
local f = io.open(never, "w")
f:write("return { speculate = function() return false end }\n")
f:close()
local function replay(flags) return H.run_tool(bin, root, "tools/spec_replay.lua", flags) end
local flags = ("--tokens 48 --variants 1 --k 8 --policy %s,%s"):format(root .. "/policies/spec_adaptive.lua", never)
local out, rc = replay(flags)
H.check(rc == 0, "the replay runs (exit %s): %s", tostring(rc), out:sub(1, 300))
local rows = {}
local batch
for line in out:gmatch("[^\n]+") do
  batch = line:match("^batch (%d)") or batch
  local kind, r8, ra, rn = line:match("^(%a+)%s+([%d.]+)x %(%d+%%%)%s+([%d.]+)x %(%d+%%%)%s+([%d.]+)x")
  if kind and kind ~= "workload" then rows[batch .. kind] = { k8 = tonumber(r8), adaptive = tonumber(ra), never = tonumber(rn) } end
end
for _, b in ipairs({ "1", "4" }) do
  for _, kind in ipairs({ "rewrite", "json", "code", "story" }) do
    local r = rows[b .. kind]
    H.check(r and r.k8 > 0 and r.adaptive > 0 and r.never == 1, "batch %s %s: a row, and never drafting reads 1.00x", b, kind)
  end
end
H.check(rows["1rewrite"] and rows["1rewrite"].k8 > 1.5 and rows["1json"].k8 > 1.2,
        "n-gram k8 gains on copied text (rewrite %.2fx, json %.2fx)", rows["1rewrite"] and rows["1rewrite"].k8 or 0,
        rows["1json"] and rows["1json"].k8 or 0)
H.check(rows["1story"] and rows["1story"].k8 < 1.05, "and not on the story (%.2fx)", rows["1story"] and rows["1story"].k8 or 0)
-- under each table, the hook's own time (CPU time: the one line that varies)
local n_hook = 0
for a, b in out:gmatch("the hook's own time[^\n]-: spec_adaptive ([%d.]+), [^\n]- ([%d.]+)\n") do
  H.check(tonumber(a) > 0 and tonumber(b) >= 0, "the hook's time a step: adaptive %s us, never %s us", a, b)
  n_hook = n_hook + 1
end
H.check(n_hook == 2, "the hook's time under both tables (%d)", n_hook)
local function fixed(s) return (s:gsub("the hook's own time[^\n]*\n", "")) end
local again = replay(flags)
H.check(fixed(again) == fixed(out), "the same inputs, the same output (but the hook's time)")
-- --cold: the policy sees only the row counts run twice so far; never
-- drafting still reads 1.00x, and a fixed k is the same as without it
local cold, crc = replay(flags .. " --cold")
H.check(crc == 0 and cold:find("fresh engine", 1, true), "--cold runs (exit %s)", tostring(crc))
local ck8, cnever = cold:match("\nrewrite%s+([%d.]+)x %(%d+%%%)%s+[%d.]+x %(%d+%%%)%s+([%d.]+)x")
H.check(tonumber(ck8) == rows["1rewrite"].k8 and tonumber(cnever) == 1,
        "--cold: k8 as before (%s), never drafting 1.00x (%s)", tostring(ck8), tostring(cnever))
-- --oracle: every round drafts what the text holds, 100% accepted where it
-- drafts; at batch 1 at least every fixed k and the adaptive policy
local orc, orrc = replay(("--tokens 48 --variants 1 --k 4,8 --oracle --policy %s"):format(root .. "/policies/spec_adaptive.lua"))
H.check(orrc == 0, "--oracle runs (exit %s)", tostring(orrc))
local n_rows, ob = 0, nil
for line in orc:gmatch("[^\n]+") do
  ob = line:match("^batch (%d)") or ob
  local kind, k4, k8, o, pct, ad = line:match("^(%a+)%s+([%d.]+)x %(%d+%%%)%s+([%d.]+)x %(%d+%%%)%s+([%d.]+)x %((%d+)%%%)%s+([%d.]+)x")
  if kind then
    n_rows = n_rows + 1
    k4, k8, o, ad = tonumber(k4), tonumber(k8), tonumber(o), tonumber(ad)
    H.check((ob ~= "1" or (o >= k4 and o >= k8 and o >= ad)) and (pct == "100" or pct == "0"),
            "--oracle batch %s %s: %.2fx at %s%% against k4 %.2fx, k8 %.2fx, adaptive %.2fx", ob, kind, o, pct, k4, k8, ad)
  end
end
H.check(n_rows == 8, "--oracle: 8 rows (%d)", n_rows)
for _, bad in ipairs({ "--k 0", "--batch 2", "--rows 2=1,1=2", "--rows 1=1", "--policy /nonexistent.lua", "--variants x" }) do
  local o, code = replay(bad)
  H.check(code == 2 and o:find("spec_replay: ", 1, true), "%s: refused (exit %s): %s", bad, tostring(code),
          o:match("spec_replay: [^\n]*") or o:sub(1, 200))
end
os.remove(never)
H.finish("test_spec_replay")
