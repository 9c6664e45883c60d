-- test_draft.lua — luainfer.engine{ draft_model = PATH }: a draft model (the
-- real model's first 4 layers, tools/make_draft.py) runs next to the target
-- over the same KV blocks. It must not change what the target generates:
--  * greedy requests (batched, with a prefix hit) give the same tokens and
--    text as an engine without the draft;
--  * stats report the draft's KV storage (kv_draft_bytes > 0; 0 without);
--  * a missing file, a GGUF that is not a usable draft, and a non-string
--    path are Lua errors that name the draft; the engine is not left open.
-- The draft comes from $LUAINFER_TEST_DRAFT, else it is made in a temp file
-- (skipped, exit 77, when .venv's Python cannot run make_draft.py).
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local H = require("harness")
local luainfer = require("luainfer")

local root = H.repo_root()
local draft = H.draft_model("test_draft")

local prompts = {
  -- over two 16-token blocks, so the repeated request below hits the prefix cache
  "The river ran past old mills and quiet farms while children counted boats under a grey sky of late autumn, and",
  "Write a haiku about the sea:",
  "The capital of France is Paris. The capital of Spain is",
  "1, 2, 3, 4,",
}

local function run(cfg)
  local e = luainfer.engine(cfg)
  local ids = {}
  for i, p in ipairs(prompts) do ids[i] = e:add{ prompt = p, max_tokens = 12 + 3 * i, temperature = 0 } end
  e:run()
  local out = {}
  for i = 1, #prompts do out[i] = e:result(ids[i]) end
  -- a prefix hit after the batch is done: the first prompt again
  local again = e:add{ prompt = prompts[1], max_tokens = 12, temperature = 0 }
  e:run()
  out[#prompts + 1] = e:result(again)
  local s = e:stats()
  H.check(s.kv_free_blocks == s.kv_total_blocks, "every block returned (%d/%d)", s.kv_free_blocks, s.kv_total_blocks)
  e:close()
  return out, s
end

local base, sb = run{ max_num_seqs = 4 }
local with, sd = run{ max_num_seqs = 4, draft_model = draft }
for i = 1, #base do
  H.check(H.eq_list(base[i].tokens, with[i].tokens) and base[i].text == with[i].text,
          "request %d: the draft changed the output (%d vs %d tokens)", i, #base[i].tokens, #with[i].tokens)
  H.check(#base[i].tokens > 0, "request %d generated tokens", i)
end
H.check(sb.kv_draft_bytes == 0, "no draft: kv_draft_bytes 0, got %s", tostring(sb.kv_draft_bytes))
H.check(sd.kv_draft_bytes > 0, "with a draft: kv_draft_bytes > 0, got %s", tostring(sd.kv_draft_bytes))
H.check(sd.kv_draft_bytes < sd.kv_bytes, "4 of 30 layers: the draft's KV (%s) is smaller than the target's (%s)",
        tostring(sd.kv_draft_bytes), tostring(sd.kv_bytes))
H.check(sd.prefix_hit_tokens > 0, "the repeated prompt hit the prefix cache with a draft")

local function refused(cfg, want, label)
  local ok, msg = pcall(luainfer.engine, cfg)
  H.check(not ok and tostring(msg):find(want, 1, true) ~= nil, "%s: want an error with '%s', got %s", label, want,
          tostring(msg))
end
refused({ draft_model = root .. "/no/such/draft.gguf" }, "draft model", "missing file")
refused({ draft_model = root .. "/no/such/draft.gguf" }, "No such file", "missing file")
-- a vocabulary-only GGUF with another vocabulary: the loader refuses it
refused({ draft_model = root .. "/tests/golden/spm_tiny.gguf" }, "draft model", "not a usable draft")
refused({ draft_model = 5 }, "draft_model", "non-string path")

H.finish("test_draft")
