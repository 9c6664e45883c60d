-- luainfer.bench — what every benchmark program shares: the --json and
-- --plot options, and writing their files.
--
--   local bench = require("luainfer.bench")
--   local opts = bench.options(arg)   -- removes --json FILE / --plot FILE from arg
--   ... measure, printing the usual table ...
--   bench.finish(opts, { bench = "batching", rows = { ... } })
--
-- --json FILE writes the results table as JSON (luainfer.json: keys sorted,
-- so the same results give the same text). --plot FILE writes a PNG made by
-- tools/plot_bench.py (matplotlib, from the project's .venv) from the same
-- table; `bench` names the plot. Both write a temporary file and rename it,
-- so a failed run never leaves half a file.
local json = require("luainfer.json")

local M = {}

-- The repository root: bench programs live in <root>/bench/.
local function root_of(script)
  return (script or ""):match("^(.*)/bench/[^/]*$") or (script or ""):match("^(.*)/examples/[^/]*$") or "."
end

-- Pulls the shared options out of arg (in place: positional arguments keep
-- their order and indices 1..n). Returns { json = FILE?, plot = FILE?, root }.
function M.options(args)
  local opts, rest, i = { root = root_of(args[0]) }, {}, 1
  while args[i] ~= nil do
    local a = args[i]
    local key = a == "--json" and "json" or a == "--plot" and "plot" or nil
    if key then
      local v = args[i + 1]
      if v == nil or v == "" then error(("%s needs a file name"):format(a), 0) end
      opts[key] = v
      i = i + 2
    else
      rest[#rest + 1] = a
      i = i + 1
    end
  end
  for k = #args, 1, -1 do args[k] = nil end
  for k, v in ipairs(rest) do args[k] = v end
  return opts
end

local function write_file(path, text)
  local tmp = ("%s.tmp.%d"):format(path, math.random(1, 1e9))
  local f, err = io.open(tmp, "wb")
  if not f then error(("cannot write %s: %s"):format(path, err), 0) end
  local ok, werr = f:write(text)
  f:close()
  if not ok then
    os.remove(tmp)
    error(("cannot write %s: %s"):format(path, werr), 0)
  end
  local rok, rerr = os.rename(tmp, path)
  if not rok then
    os.remove(tmp)
    error(("cannot write %s: %s"):format(path, rerr), 0)
  end
end

local function shell_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function python(root)
  local env = os.getenv("LUAINFER_PYTHON")
  if env and env ~= "" then return env end
  local venv = root .. "/.venv/bin/python"
  local f = io.open(venv, "rb")
  if f then f:close(); return venv end
  return "python3"
end

-- Writes what opts asks for from results (a table with a `bench` name).
function M.finish(opts, results)
  assert(type(results) == "table" and type(results.bench) == "string", "results need a bench name")
  local text = json.encode(results, true) .. "\n"
  if opts.json then
    write_file(opts.json, text)
    print(("results written to %s"):format(opts.json))
  end
  if opts.plot then
    local data = os.tmpname()
    write_file(data, text)
    local cmd = ("%s %s %s %s"):format(shell_quote(python(opts.root)), shell_quote(opts.root .. "/tools/plot_bench.py"),
      shell_quote(data), shell_quote(opts.plot))
    local ok, how, code = os.execute(cmd)
    os.remove(data)
    -- LuaJIT returns the status (0 = success) unless built with 5.2 compatibility
    local success = ok == 0 or ok == true
    if not success then
      error(("--plot %s: tools/plot_bench.py failed (%s %s): is matplotlib in the .venv? (make setup)")
        :format(opts.plot, tostring(how), tostring(code)), 0)
    end
    print(("plot written to %s"):format(opts.plot))
  end
end

return M
