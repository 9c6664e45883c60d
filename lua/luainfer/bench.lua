-- luainfer.bench — what every benchmark program shares: the --json and
-- --plot options, and writing their files.
--
--   local bench = require("luainfer.bench")
--   local opts = bench.options(arg)   -- removes --json FILE / --plot FILE from arg
--   ... measure, printing the usual table ...
--   bench.finish(opts, { bench = "batching", rows = { ... } })
--
--   local p = bench.progress(n_runs, "batching")   -- progress on stderr
--   for ... do run(...); p:step() end
--   p:done()
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

-- Pulls the flags SPEC names out of args, in place (positional arguments
-- keep their order and indices 1..n). SPEC maps a flag to its kind: "flag"
-- (no value: true), "file" or "value" (a non-empty string), "count" (a
-- whole number >= 1). Returns { [flag] = value } for those given.
function M.take_flags(args, spec)
  local got, rest, i = {}, {}, 1
  while args[i] ~= nil do
    local a = args[i]
    local kind = spec[a]
    if kind == "flag" then
      got[a], i = true, i + 1
    elseif kind then
      local v = args[i + 1]
      if kind == "count" then
        v = tonumber(v)
        if not v or v < 1 or v ~= math.floor(v) then error(("%s needs a whole number >= 1"):format(a), 0) end
      elseif v == nil or v == "" then
        error(("%s needs %s"):format(a, kind == "file" and "a file name" or "a value"), 0)
      end
      got[a], i = v, i + 2
    else
      rest[#rest + 1], i = a, i + 1
    end
  end
  for k = #args, 1, -1 do args[k] = nil end
  for k, v in ipairs(rest) do args[k] = v end
  return got
end

-- A program's usage: its header comment (the leading "--" lines).
local function usage(script)
  local f = script and io.open(script, "rb")
  if not f then return ("%s: no usage text\n"):format(tostring(script)) end
  local out = {}
  for line in f:lines() do
    local t = line:match("^%-%- ?(.*)$")
    if not t then break end
    out[#out + 1] = t
  end
  f:close()
  return table.concat(out, "\n") .. "\n"
end

-- Pulls the shared options out of arg (take_flags). Returns
-- { json = FILE?, plot = FILE?, root }. --help or -h anywhere prints the
-- program's header comment and exits: positional arguments are read with
-- tonumber(arg[i]) or a default, so a flag they do not know would
-- otherwise start a full run with the defaults.
function M.options(args)
  for i = 1, #args do
    if args[i] == "--help" or args[i] == "-h" then
      io.stdout:write(usage(args[0]))
      os.exit(0)
    end
  end
  local f = M.take_flags(args, { ["--json"] = "file", ["--plot"] = "file" })
  return { root = root_of(args[0]), json = f["--json"], plot = f["--plot"] }
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

-- ---- progress ---------------------------------------------------------------

local function stderr_is_tty()
  local ok, ffi = pcall(require, "ffi")
  if not ok then return false end
  pcall(ffi.cdef, "int isatty(int fd);")
  local ok2, r = pcall(function() return ffi.C.isatty(2) end)
  return ok2 and r == 1
end

-- The one monotonic clock (seconds) and sleep of the benchmark programs:
-- clock_gettime and nanosleep declared here once, so no two scripts declare
-- them with different types (LuaJIT refuses a second declaration).
local ffi = require("ffi")
ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } li_bench_timespec;
int clock_gettime(int clk, li_bench_timespec *ts);
int nanosleep(const li_bench_timespec *req, li_bench_timespec *rem);
]]
local now_ts, sleep_ts = ffi.new("li_bench_timespec"), ffi.new("li_bench_timespec")

function M.now()
  ffi.C.clock_gettime(1, now_ts) -- CLOCK_MONOTONIC
  return tonumber(now_ts.tv_sec) + tonumber(now_ts.tv_nsec) * 1e-9
end

function M.sleep(seconds)
  if not (seconds > 0) then return end
  sleep_ts.tv_sec = math.floor(seconds)
  sleep_ts.tv_nsec = math.floor((seconds - math.floor(seconds)) * 1e9)
  ffi.C.nanosleep(sleep_ts, nil)
end

local function eta_text(s)
  if s ~= s or s == math.huge then return "?" end
  if s >= 3600 then return ("%dh%02dm"):format(math.floor(s / 3600), math.floor(s % 3600 / 60)) end
  if s >= 60 then return ("%dm%02ds"):format(math.floor(s / 60), math.floor(s % 60)) end
  return ("%ds"):format(math.floor(s + 0.5))
end

local Progress = {}
Progress.__index = Progress

-- A progress report on stderr for `total` units of work: on a terminal one
-- line redrawn in place (bar, count, rate, ETA); otherwise a plain line at
-- most every `every` seconds (default 10) and one at the end, so logs of
-- CI runs show it is alive without a flood. LUAINFER_PROGRESS=0 silences it.
function M.progress(total, label, every)
  local now = M.now
  local p = setmetatable({ total = total, label = label or "progress", n = 0, now = now, t0 = now(),
                           tty = stderr_is_tty(), every = every or 10,
                           off = os.getenv("LUAINFER_PROGRESS") == "0" }, Progress)
  p.last = p.t0
  return p
end

function Progress:line()
  local t = self.now() - self.t0
  local rate = t > 0 and self.n / t or 0
  local eta = rate > 0 and (self.total - self.n) / rate or math.huge
  local w = 24
  local fill = self.total > 0 and math.floor(w * math.min(self.n, self.total) / self.total) or 0
  return ("%s [%s%s] %d/%d  %.2f/s  %s %s"):format(self.label, ("#"):rep(fill), ("-"):rep(w - fill), self.n,
    self.total, rate, self.n >= self.total and "took" or "ETA", eta_text(self.n >= self.total and t or eta))
end

function Progress:step(k)
  self.n = self.n + (k or 1)
  if self.off then return end
  local t = self.now()
  if self.tty then
    io.stderr:write("\r", self:line(), "\27[K")
    io.stderr:flush()
  elseif t - self.last >= self.every and self.n < self.total then
    io.stderr:write(self:line(), "\n")
    self.last = t
  end
end

function Progress:done()
  if self.off or self.finished then return end
  self.finished = true
  if self.tty then io.stderr:write("\r", self:line(), "\27[K\n")
  else io.stderr:write(self:line(), "\n") end
  io.stderr:flush()
end

-- ---- results --------------------------------------------------------------

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

-- A comma-separated list of numbers (S, or DEFAULT when S is nil), each
-- passing OK(n): the list, or nil and "WHAT X: want WANT" for the first
-- item that is no number or fails OK (or "WHAT: empty").
function M.number_list(s, default, what, ok, want)
  local t = {}
  for v in (s or default):gmatch("[^,]+") do
    local n = tonumber(v)
    if not n or not ok(n) then return nil, ("%s %s: want %s"):format(what, v, want) end
    t[#t + 1] = n
  end
  if #t == 0 then return nil, what .. ": empty" end
  return t
end

-- The outputs of requests IDS of engine E: each one's tokens joined by
-- commas (to compare runs token for token) and the total token count.
function M.outputs(e, ids)
  local toks, n = {}, 0
  for i, id in ipairs(ids) do
    local r = e:result(id)
    toks[i] = table.concat(r.tokens, ",")
    n = n + #r.tokens
  end
  return toks, n
end

-- The median of the numbers XS (not changed; the mean of the middle two
-- for an even count).
function M.median(xs)
  local t = {}
  for i, x in ipairs(xs) do t[i] = x end
  table.sort(t)
  local n = #t
  if n % 2 == 1 then return t[(n + 1) / 2] end
  return (t[n / 2] + t[n / 2 + 1]) / 2
end

-- The 1, 5 and 15 minute load averages ("unknown" without /proc), for the
-- header of a benchmark whose wall times depend on the machine's load.
function M.loadavg()
  local f = io.open("/proc/loadavg", "r")
  if not f then return "unknown" end
  local s = f:read("*l") or ""
  f:close()
  return s:match("^(%S+ %S+ %S+)") or s
end

-- The workloads of `bench spec ... proposers` (and tools/spec_replay.lua):
-- prompts the model carries out (checked by reading its greedy outputs): it
-- rewrites the paragraph with its text, prints the JSON object back in the
-- same layout, writes the functions again with type hints; the story is
-- open-ended. kinds: their order; prompts[kind]: the chat prompt;
-- variant(prompt, i): the i-th of a batch (a line added before the
-- assistant's turn, so each request writes its own text).
function M.spec_workloads()
  local function chat(u) return "<|im_start|>user\n" .. u .. "<|im_end|>\n<|im_start|>assistant\n" end
  local code = [[
def parse_header(line):
    key, _, value = line.partition(":")
    return key.strip().lower(), value.strip()

def parse_headers(lines):
    headers = {}
    for line in lines:
        if not line:
            break
        key, value = parse_header(line)
        headers[key] = value
    return headers
]]
  local json_doc = '{\n  "name": "Ada Lovelace",\n  "born": 1815,\n  "city": "London",\n' ..
    '  "fields": ["mathematics", "computing"],\n  "notes": "wrote the first published algorithm for a machine"\n}'
  return {
    code = code, -- the functions the code prompt holds (bench spec's copy prompts repeat them)
    kinds = { "rewrite", "json", "code", "story" },
    prompts = {
      rewrite = chat("Rewrite this paragraph, fixing only the spelling mistakes:\nThe rivr ran past the old mils and " ..
        "the quiet farms, while the childen counted the boats under a grey sky of late autum. In the evening the " ..
        "lamps were lit along the bank, and the feryman called the last crossing of the day. The next morning the " ..
        "mist lay thick on the watter, and the first boat left the jetty before the sun had risen over the hils."),
      json = chat("Here is a JSON object:\n" .. json_doc .. "\nOutput the same JSON object with \"city\" changed " ..
        "to \"Paris\"."),
      code = chat("Here is some Python code:\n```python\n" .. code .. "```\nRewrite it with type hints added to " ..
        "every function."),
      story = chat("Write a short story about a lighthouse keeper who finds a message in a bottle."),
    },
    variant = function(prompt, i)
      return (prompt:gsub("<|im_start|>assistant", ("(variant %d)<|im_start|>assistant"):format(i)))
    end,
  }
end

return M
