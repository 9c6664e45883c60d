-- instr_step.lua: one of bench_cpu.lua's shapes, for tools/instr_builds.sh's callgrind counts:
--   luainfer run tools/instr_step.lua prefill N | decode S T   (CG_THREADS threads, default 1)
local luainfer = require("luainfer")
local mode, a, b = arg[1], tonumber(arg[2]), tonumber(arg[3])
local function prompt(s, n)
  local t = {}
  for i = 1, n do t[i] = 100 + (i * 7919 + s * 104729) % 40000 end
  return t
end
local S = mode == "prefill" and 1 or a
local e = luainfer.engine{ threads = tonumber(os.getenv("CG_THREADS") or "1"), max_num_seqs = S, max_batched_tokens = 512,
                           kv_memory = 256 * 1024 * 1024, prefix_caching = false }
if mode == "prefill" then
  local id = e:add{ tokens = prompt(1, a), max_tokens = 1, temperature = 0, ignore_eos = true }
  e:step()
  assert(e:result(id).finished)
else
  local ids = {}
  for s = 1, S do ids[s] = e:add{ tokens = prompt(1000 + s, 16), max_tokens = b + 1, temperature = 0, ignore_eos = true } end
  e:step()
  for _ = 1, b do e:step() end
  for s = 1, S do assert(#e:result(ids[s]).tokens == b + 1) end
end
e:close()
