-- harness.lua — minimal checks for Lua tests run with `luainfer run`.
-- check() records and goes on; finish() prints "NAME: N passed, N failed"
-- and exits non-zero when anything failed.
local H = { passed = 0, failed = 0 }

function H.check(cond, msg, ...)
  if cond then
    H.passed = H.passed + 1
  else
    H.failed = H.failed + 1
    io.stderr:write("FAIL: ", string.format(msg, ...), "\n", debug.traceback("", 2), "\n")
  end
  return cond
end

function H.eq_list(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

function H.finish(name)
  print(("%s: %d passed, %d failed"):format(name, H.passed, H.failed))
  os.exit(H.failed == 0 and 0 or 1)
end

-- The directory of the running script, to find repo files from tests.
function H.repo_root()
  local src = debug.getinfo(2, "S").source:sub(2)
  local dir = src:match("^(.*)/tests/lua/") or "."
  return dir
end

return H
