-- test_json.lua — luainfer.json (cJSON under the benchmarks' --json) and
-- luainfer.bench's option parsing, checked against Python's json module
-- where a second implementation helps: the text it writes parses back to
-- the same values, keys come out sorted, and values JSON cannot hold (NaN,
-- functions, NUL bytes, cycles) are errors rather than silent damage.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local H = require("harness")
local json = require("luainfer.json")
local bench = require("luainfer.bench")

-- round trip: what encode writes, decode reads back the same
local v = { b = 1, a = { 1, 2.5, -3e-7, "x\n\"\\/\t" }, [7] = true, e = json.array{}, n = json.null, big = 2 ^ 53,
            u = "h\xc3\xa9 \xe2\x82\xac" }
local text = json.encode(v)
H.check(text == '{"7":true,"a":[1,2.5,-3e-07,"x\\n\\"\\\\/\\t"],"b":1,"big":9007199254740992,"e":[],"n":null,'
  .. '"u":"h\xc3\xa9 \xe2\x82\xac"}', "encode: keys sorted, strings escaped: %s", text)
local back = json.decode(text)
H.check(back.a[2] == 2.5 and back.a[3] == -3e-7 and back.a[4] == "x\n\"\\/\t" and back.b == 1 and back["7"] == true,
  "decode gives back the values")
H.check(back.n == json.null and back.big == 2 ^ 53 and back.u == v.u, "null, 2^53 and UTF-8 survive")
H.check(json.encode(back.e) == "[]", "an empty array stays an array through decode")
H.check(json.encode(json.decode(json.encode(v, true))) == text, "pretty output parses to the same values")

-- Python's json reads what we write (an implementation nobody here wrote)
local tmp = os.tmpname()
local f = assert(io.open(tmp, "w")); f:write(json.encode(v, true)); f:close()
local py = H.repo_root() .. "/.venv/bin/python"
local fp = io.open(py, "rb")
if fp then
  fp:close()
  local p = io.popen(py .. " -c \"import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d, sort_keys=True,"
    .. " ensure_ascii=False, separators=(',', ':')))\" " .. tmp)
  local out = p:read("*l"); p:close()
  H.check(out == text, "Python's json reads the same document: %s", tostring(out))
else
  print("skip: Python's json cross-check: no .venv/bin/python (make setup)")
end
os.remove(tmp)

-- what JSON cannot hold is an error, never a cut or a guess
for name, bad in pairs({ nan = { x = 0 / 0 }, inf = { 1 / 0 }, fn = { f = print }, nul = { s = "a\0b" },
                         key = { [{}] = 1 } }) do
  local ok, err = pcall(json.encode, bad)
  H.check(not ok and tostring(err):match("^json%.encode: "), "%s: error %s", name, tostring(err))
end
local cyc = {}; cyc.self = cyc
H.check(not pcall(json.encode, cyc), "a cycle is an error")
for _, s in ipairs({ "{bad", "[1,]", '{"a":1} trailing', "", '"\\u12"' }) do
  local r, err = json.decode(s)
  H.check(r == nil and err:match("^json%.decode: invalid JSON at byte %d+$"), "decode %q: %s", s, tostring(err))
end

-- bench.options: --json/--plot come out, positional arguments keep their order
local args = { [0] = "/repo/bench/bench_x.lua", "6", "--plot", "a.png", "4", "--json", "r.json", "uniform" }
local o = bench.options(args)
H.check(o.plot == "a.png" and o.json == "r.json" and o.root == "/repo", "options parsed")
H.check(#args == 3 and args[1] == "6" and args[2] == "4" and args[3] == "uniform" and args[4] == nil,
  "positional arguments kept")
H.check(not pcall(bench.options, { [0] = "x", "--json" }), "--json without a file is an error")

-- finish writes the file whole (temporary name, then rename)
local out = os.tmpname()
bench.finish({ json = out, root = "." }, { bench = "t", rows = { { a = 1 } } })
local rf = assert(io.open(out)); local got = json.decode(rf:read("*a")); rf:close()
H.check(got.bench == "t" and got.rows[1].a == 1, "finish wrote the results")
os.remove(out)

H.finish("test_json")
