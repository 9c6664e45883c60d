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

-- The luainfer binary running this test (/proc/$PPID/exe: `luainfer run`
-- starts the test's shell commands), or nil.
function H.luainfer_bin()
  local exe = io.popen("readlink /proc/$PPID/exe 2>/dev/null")
  local bin = exe:read("*l")
  exe:close()
  return bin and bin:match("luainfer$") and bin or nil
end

-- Runs `bin run TOOL FLAGS` from the repository root root; returns its
-- output (stdout and stderr) and exit status.
function H.run_tool(bin, root, tool, flags)
  local p = io.popen(("cd %q && %q run %s %s 2>&1; echo \"exit $?\""):format(root, bin, tool, flags))
  local out = p:read("*a")
  p:close()
  return out, tonumber(out:match("exit (%d+)%s*$"))
end

-- A draft for speculation tests: $LUAINFER_TEST_DRAFT, else the real model's
-- first 4 layers (tools/make_draft.py) in a temp file that finish() removes.
-- Exits 77 (ctest's skip) with the reason when .venv's Python cannot make it.
-- $ENV's file, else what `tool` (a command with %s for the output, run by
-- .venv's Python from the repository root) makes in a temp file that
-- finish() removes; exits 77 (ctest's skip) with the reason when it cannot.
local function test_file(name, env, tool, what)
  local path = os.getenv(env)
  if path and path ~= "" then
    local f = io.open(path, "rb")
    if f then f:close() return path end -- else ctest's shared file was not made: make one here
  end
  local root = H.repo_root()
  local made = os.tmpname()
  local cmd = ("cd '%s' && '%s/.venv/bin/python' " .. tool .. " >/dev/null 2>&1"):format(root, root, made)
  local ok = os.execute(cmd)
  if ok ~= true and ok ~= 0 then
    os.remove(made)
    print(("%s: SKIP: could not make %s (no .venv with the gguf package?)"):format(name, what))
    os.exit(77)
  end
  H.temp_files = H.temp_files or {}
  table.insert(H.temp_files, made)
  return made
end

function H.draft_model(name)
  return test_file(name, "LUAINFER_TEST_DRAFT",
                   "tools/make_draft.py models/SmolLM2-135M-Instruct.Q4_1.gguf '%s' --layers 4",
                   "a draft with tools/make_draft.py")
end

-- An untrained EAGLE draft over 4096 ids (tools/gen_eagle_draft.py):
-- $LUAINFER_TEST_EAGLE, else made as H.draft_model makes its draft.
function H.eagle_draft(name)
  return test_file(name, "LUAINFER_TEST_EAGLE",
                   "tools/gen_eagle_draft.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf --out '%s' --vocab 4096",
                   "an EAGLE draft with tools/gen_eagle_draft.py")
end

return H
