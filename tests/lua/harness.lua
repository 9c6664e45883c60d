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
  for _, p in ipairs(H.temp_files or {}) do os.remove(p) end
  print(("%s: %d passed, %d failed"):format(name, H.passed, H.failed))
  os.exit(H.failed == 0 and 0 or 1)
end

-- The directory of the running script, to find repo files from tests.
function H.repo_root()
  local src = debug.getinfo(2, "S").source:sub(2)
  local dir = src:match("^(.*)/tests/lua/") or "."
  return dir
end

-- A draft for speculation tests: $LUAINFER_TEST_DRAFT, else the real model's
-- first 4 layers (tools/make_draft.py) in a temp file that finish() removes.
-- Exits 77 (ctest's skip) with the reason when .venv's Python cannot make it.
function H.draft_model(name)
  local draft = os.getenv("LUAINFER_TEST_DRAFT")
  if draft and draft ~= "" then
    local f = io.open(draft, "rb")
    if f then f:close() return draft end -- else ctest's shared draft was not made: make one here
  end
  local root = H.repo_root()
  local made = os.tmpname()
  local cmd = ("'%s/.venv/bin/python' '%s/tools/make_draft.py' '%s/models/SmolLM2-135M-Instruct.Q4_1.gguf' '%s' --layers 4 >/dev/null 2>&1")
    :format(root, root, root, made)
  local ok = os.execute(cmd)
  if ok ~= true and ok ~= 0 then
    os.remove(made)
    print(name .. ": SKIP: could not make a draft with tools/make_draft.py (no .venv with the gguf package?)")
    os.exit(77)
  end
  H.temp_files = H.temp_files or {}
  table.insert(H.temp_files, made)
  return made
end

return H
