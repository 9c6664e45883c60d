#!/usr/bin/env python3
"""Writes the generated seed corpora of tests/fuzz, so the fuzzers start from
real layouts rather than from noise:

- fuzz_gguf: small valid GGUF files made with the `gguf` package (the
  reference writer);
- fuzz_policy_wire: byte streams a policy host sends the engine (4-byte
  big-endian length + one msgpack map per frame, docs/policy-protocol.md),
  made with the `msgpack` package: valid starts, plans, admit and evict
  answers, and corrupt ones (truncated frames, wrong types, huge declared
  counts, unknown ids, deep nesting);
- fuzz_policy_src: a few small policies that hit every hook and the
  sandbox's edges. The shipped policies (policies/) and the hostile ones of
  issue 18 (tests/policies/hostile/) are seeds too, read where they live:
  ctest passes both directories (CMakeLists.txt); with libFuzzer, name them
  after the corpus directory.
- fuzz_safetensors: small .safetensors files made with the `safetensors`
  package (F32, F16, BF16 through its TensorSpec API, metadata, a scalar, an
  empty tensor, an empty file), so mutations hit real headers.

    .venv/bin/python tools/gen_fuzz_corpus.py

The output is deterministic and committed; rerun after changing this file.
Files stay under a few KiB so the fuzz driver gets through its mutations fast.
"""
import os
import struct
import sys

import msgpack
import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_eagle_draft import add_draft  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fuzz", "corpus", "fuzz_gguf")
OUT_WIRE = os.path.join(ROOT, "tests", "fuzz", "corpus", "fuzz_policy_wire")
OUT_SRC = os.path.join(ROOT, "tests", "fuzz", "corpus", "fuzz_policy_src")
OUT_ST = os.path.join(ROOT, "tests", "fuzz", "corpus", "fuzz_safetensors")


def write(name, build, arch="llama"):
    path = os.path.join(OUT, name)
    w = GGUFWriter(path, arch)
    build(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{os.path.relpath(path, ROOT)}: {os.path.getsize(path)} bytes")


def raw(n_bytes, seed):
    """Deterministic bytes standing in for quantized blocks."""
    return np.random.default_rng(seed).integers(0, 256, n_bytes, dtype=np.uint8)


def minimal(w):
    w.add_name("minimal")
    w.add_uint32("llama.block_count", 1)


def all_types(w):
    # a key of every scalar type
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_float32("t.f32", 1.5)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "hello gguf")
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -5)
    w.add_float64("t.f64", -2.25)
    # arrays: strings, ints, floats
    w.add_array("t.strings", ["a", "", "<|im_start|>", "\u0120the"])
    w.add_array("t.ints", [1, 2, 3, -4])
    w.add_array("t.floats", [0.5, -1.0, 2.0])
    # tensors of types F32, Q4_0 and Q8_0; quantized data goes in as raw
    # blocks shaped (rows, bytes per row): 18 bytes per 32 Q4_0 values, 34 per
    # 32 Q8_0 values, so these are 2 x 64 and 1 x 32 elements
    w.add_tensor("w.f32", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.add_tensor("w.q4_0", raw(2 * 36, 1).reshape(2, 36), raw_dtype=GGMLQuantizationType.Q4_0)
    w.add_tensor("w.q8_0", raw(34, 2).reshape(1, 34), raw_dtype=GGMLQuantizationType.Q8_0)


def aligned64(w):
    w.add_custom_alignment(64)
    w.add_uint32("llama.embedding_length", 8)
    w.add_tensor("a", np.ones(3, dtype=np.float32))
    w.add_tensor("b", np.full((2, 5), 2.0, dtype=np.float32))


def tokenizer(w):
    # the shape of a model's tokenizer metadata, with a tiny vocabulary
    tokens = ["<unk>", "<s>", "</s>", "a", "b", "ab", "\u0120", "\u0120ab"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([2, 3, 3, 1, 1, 1, 1, 1])
    w.add_token_merges(["a b", "\u0120 ab"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 32), dtype=np.float16))
    w.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))


# ---- fuzz_policy_wire: what a policy host sends the engine ------------------

def pack(obj):
    return msgpack.packb(obj, use_bin_type=True)


def frame(body):
    """One frame around msgpack bytes (or an object to pack)."""
    if not isinstance(body, bytes):
        body = pack(body)
    return struct.pack(">I", len(body)) + body


def raw_map(*pairs):
    """A map whose values may be raw msgpack bytes (for hand-made corruption)."""
    out = bytes([0x80 | len(pairs)])
    for k, v in pairs:
        out += pack(k) + (v if isinstance(v, bytes) else pack(v))
    return out


HELLO = {"type": "hello", "version": 1, "pid": 4242, "ok": True, "error": None,
         "name": "", "config": {}, "hooks": []}
LOADED = {"type": "reload", "seq": 1, "ok": True, "error": None, "name": "policies/lfu.lua",
          "config": {"block_size": 16, "kv_dtype": "f16", "max_num_seqs": 64,
                     "max_batched_tokens": 512},
          "hooks": ["schedule", "admit", "on_finish", "evict"]}
START = frame(HELLO) + frame(LOADED)
# the engine's requests in these seeds are ids 3, 5, 8 and 13
PLAN = {"type": "plan", "seq": 2,
        "plan": {"run": [{"id": 3, "tokens": 1}, {"id": 5, "tokens": 64}, {"id": 8, "tokens": 0}],
                 "preempt": [13]}}


def wire_seeds():
    s = {}
    # valid
    s["start.bin"] = START
    s["plan.bin"] = START + frame(PLAN)
    s["plan_floats_nil.bin"] = START + frame(
        {"type": "plan", "seq": 2, "plan": {"run": [{"id": 3.0, "tokens": 2.0}], "preempt": None,
                                            "speculate": {"future": 1}}})
    s["plan_empty.bin"] = START + frame({"type": "plan", "seq": 2, "plan": {}})
    s["admit.bin"] = START + frame({"type": "admit", "seq": 3, "accept": False, "reason": "tenant over quota"}) \
        + frame({"type": "admit", "seq": 4, "accept": True, "reason": ""})
    s["order.bin"] = START + frame({"type": "order", "seq": 5, "order": [5, 2, 7, 1, 0, 6, 3, 4]})
    s["error_reply.bin"] = START + frame({"type": "error", "seq": 2, "message": "schedule: x.lua:3: boom"})
    s["reload_failed.bin"] = frame(HELLO) + frame(
        {"type": "reload", "seq": 1, "ok": False, "error": "policies/x.lua:12: '}' expected near 'end'",
         "name": "policies/x.lua", "config": {}, "hooks": []})
    s["stale_then_plan.bin"] = START + frame({"type": "plan", "seq": 1, "plan": {}}) + frame(PLAN)
    # corrupt: framing
    whole = frame(PLAN)
    s["truncated_frame.bin"] = START + whole[:len(whole) // 2]
    cut = pack(PLAN)[:-5]
    s["truncated_body.bin"] = START + struct.pack(">I", len(cut)) + cut
    s["zero_length.bin"] = struct.pack(">I", 0) + START
    s["over_limit.bin"] = START + struct.pack(">I", 0xFFFFFFFF) + b"\x80"
    s["not_a_map.bin"] = frame([1, 2, 3]) + START
    s["trailing_bytes.bin"] = START + struct.pack(">I", len(pack(PLAN)) + 2) + pack(PLAN) + b"\xc0\xc0"
    s["not_msgpack.bin"] = START + frame(b"\x81\xc1\xc1")
    # corrupt: types and ranges
    s["wrong_types.bin"] = START + b"".join(frame(m) for m in [
        {"type": "plan", "seq": 2, "plan": {"run": "all"}},
        {"type": "plan", "seq": 2, "plan": {"run": [{"id": "3", "tokens": 1}]}},
        {"type": "plan", "seq": 2, "plan": {"run": [{"id": 3, "tokens": -1}]}},
        {"type": "plan", "seq": 2, "plan": {"run": [{"id": 3, "tokens": 2**31}]}},
        {"type": "plan", "seq": 2, "plan": {"run": [{"id": 3, "tokens": 1.5}]}},
        {"type": "plan", "seq": 2, "plan": {"run": [{"id": 3, "tokens": float("nan")}]}},
        {"type": "plan", "seq": 2, "plan": {"run": [[3, 1]], "preempt": {"1": 13}}},
        {"type": "plan", "seq": 2, "plan": "nope"},
        {"type": "admit", "seq": 3, "accept": 1},
        {"type": "order", "seq": 5, "order": {"1": 5}},
        {"type": 7, "seq": "2"},
        {b"type": b"plan", "seq": 2},
    ])
    s["unknown_ids.bin"] = START + frame({"type": "plan", "seq": 2, "plan": {
        "run": [{"id": 0, "tokens": 1}, {"id": 999999, "tokens": 5}, {"id": 2**53, "tokens": 2**31 - 1},
                {"id": 3, "tokens": 1}, {"id": 3, "tokens": 1}],
        "preempt": [2**53, 0, 3]}}) + frame({"type": "plan", "seq": 2, "plan": {"run": [{"id": 2**53 + 1, "tokens": 1}]}}) \
        + frame({"type": "plan", "seq": 2, "plan": {"preempt": [-1]}}) \
        + frame({"type": "order", "seq": 5, "order": [99, -1, 2**31, 2**31 - 1, "3", 2.0, None, 4, 4, 4, 4, 4, 4, 4, 4]})
    s["bad_start.bin"] = frame({"type": "hello", "version": 2}) + frame({"type": "hello", "version": "1"}) \
        + frame(LOADED) + frame(HELLO) \
        + frame(dict(LOADED, config={"block_size": -1, "kv_dtype": "a-very-long-dtype"})) \
        + frame(HELLO) + frame(dict(LOADED, ok="yes")) + frame(HELLO) + frame(dict(LOADED, seq=2, hooks=[1, "nope", "evict"]))
    # corrupt: sizes declared in headers (msgpack-c allocates a declared count before it checks the bytes)
    head = raw_map(("type", "plan"), ("seq", 2), ("plan", raw_map(("run", b"\xdd\xff\xff\xff\xff"))))
    s["huge_array.bin"] = START + frame(head + b"\x80" * 8)
    s["huge_map.bin"] = START + frame(raw_map(("type", "order"), ("seq", 5), ("order", b"\xdf\x7f\xff\xff\xff")))
    s["huge_str.bin"] = START + frame(raw_map(("type", "error"), ("seq", 2), ("message", b"\xdb\xff\xff\xff\xf0abc")))
    s["huge_plan.bin"] = START + frame({"type": "plan", "seq": 2, "plan": {
        "run": [{"id": i % 16, "tokens": 1} for i in range(300)], "preempt": list(range(200))}})
    # corrupt: nesting
    deep = []
    for _ in range(40):
        deep = [deep]
    s["deep.bin"] = START + frame({"type": "plan", "seq": 2, "plan": {"run": deep}})
    nest = {}
    for _ in range(20):
        nest = {"a": nest}
    s["deep_map.bin"] = START + frame({"type": "admit", "seq": 3, "accept": False, "reason": nest})
    return s


def write_wire():
    os.makedirs(OUT_WIRE, exist_ok=True)
    for name, data in sorted(wire_seeds().items()):
        path = os.path.join(OUT_WIRE, name)
        with open(path, "wb") as f:
            f.write(data)
        print(f"{os.path.relpath(path, ROOT)}: {len(data)} bytes")


# small policies that reach every hook and the sandbox's edges
SRC_SEEDS = {
    "all_hooks.lua": """local policy = require("luainfer.policy")
local n = 0
return {
  config = { max_num_seqs = 8 },
  admit = function(req, state) return req.priority >= 0, "low priority" end,
  schedule = function(state) n = n + 1; return policy.fcfs(state) end,
  evict = function(cands, need)
    table.sort(cands, function(a, b) return a.hits < b.hits end)
    local out = {}
    for i, c in ipairs(cands) do out[i] = c.block end
    return out
  end,
  on_finish = function(req, stats) n = n + stats.num_generated end,
}
""",
    "shorthand.lua": """return { schedule = function(state)
  local run = {}
  for i, r in ipairs(state.running) do run[i] = { r.id, 1 } end
  return { run = run, preempt = { state.requests[1] and state.requests[1].id } }
end }
""",
    "patterns.lua": """return { schedule = function(state)
  for _, r in ipairs(state.requests) do
    local a, b = r.tenant:match("^(%w*)-?(%d*)$")
    local s = (r.tenant .. "x"):rep(8):gsub("x", { x = "y" })
    local f = string.format("%s %d %q", tostring(r.id), r.prompt_len, r.tenant)
    string.find(f, "[%d]+", 1, true)
  end
  return {}
end }
""",
    "sandbox_escape.lua": """local ok = {}
for _, name in ipairs({ "io", "os.execute", "debug", "load", "loadstring", "ffi", "jit", "package" }) do
  ok[name] = pcall(function() return _G[name] end)
end
return { schedule = function(state) return { run = { { id = 10, tokens = 1 } }, preempt = { 11 } } end }
""",
    "garbage_plan.lua": """return { schedule = function(state) return { run = { { id = 0/0, tokens = 1 }, { id = -1 } } } end }
""",
    "deep_pcall.lua": """local function f(n) if n == 0 then error({}) end return pcall(f, n - 1) end
return { schedule = function(state) f(10000); return {} end }
""",
}


def write_src():
    os.makedirs(OUT_SRC, exist_ok=True)
    for name, text in sorted(SRC_SEEDS.items()):
        path = os.path.join(OUT_SRC, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"{os.path.relpath(path, ROOT)}: {len(text)} bytes")
def write_safetensors():
    import safetensors
    from safetensors.numpy import save
    os.makedirs(OUT_ST, exist_ok=True)
    rng = np.random.default_rng(7)
    seeds = {
        "empty.safetensors": save({}),
        "f32.safetensors": save({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, metadata={"format": "pt"}),
        "mixed.safetensors": save({
            "model.norm.weight": rng.standard_normal(8).astype(np.float32),
            "model.layers.0.mlp.up_proj.weight": rng.standard_normal((4, 8)).astype(np.float16),
            "scalar": np.array(1.5, dtype=np.float32),
            "empty": np.zeros((0, 3), dtype=np.float16),
        }),
    }
    bits = np.arange(12, dtype=np.uint16) + 0x3F80
    seeds["bf16.safetensors"] = bytes(safetensors.serialize(
        {"q": safetensors.TensorSpec(dtype="bfloat16", shape=[3, 4], data_ptr=bits.ctypes.data, data_len=bits.nbytes)},
        metadata={"format": "pt"}))
    for name, data in seeds.items():
        path = os.path.join(OUT_ST, name)
        with open(path, "wb") as f:
            f.write(data)
        print(f"{os.path.relpath(path, ROOT)}: {len(data)} bytes")


def eagle_draft(w):
    """A tiny EAGLE draft (docs/eagle.md's layout, gen_eagle_draft.add_draft):
    d 32, 2 heads of 8 (1 KV head), FFN 64, 2 feature blocks of a 4-block
    base, a vocabulary of 16 with a draft vocabulary of 5; fuzz_gguf checks
    it against its own claims."""
    rng = np.random.default_rng(7)
    add_draft(w, d=32, nv=16, n_head=2, n_kv=1, head_dim=8, n_ff=64, feats=[1, 3], n_layer=4, base_name="fuzz base",
              vocab_hash="0123456789abcdef",
              mat=lambda rows, cols: rng.standard_normal((rows, cols)).astype(np.float16),
              vocab=lambda: np.array([0, 2, 3, 9, 15], dtype=np.int32))


def medusa_heads(w):
    """Two tiny Medusa heads (n_embd 32, vocabulary 16)."""
    for k, v in (("version", 1), ("n_heads", 2), ("n_embd", 32), ("n_vocab", 16)):
        w.add_uint32(f"medusa.{k}", v)
    w.add_string("medusa.base.name", "fuzz base")
    w.add_string("medusa.base.vocab_hash", "0123456789abcdef")
    w.add_string("medusa.hidden", "post_norm")
    rng = np.random.default_rng(8)
    for k in range(2):
        w.add_tensor(f"medusa.{k}.weight", rng.standard_normal((32, 32)).astype(np.float32))
        w.add_tensor(f"medusa.{k}.bias", np.zeros(32, dtype=np.float32))


def main():
    os.makedirs(OUT, exist_ok=True)
    write("minimal.gguf", minimal)
    write("all_types.gguf", all_types)
    write("aligned64.gguf", aligned64)
    write("tokenizer.gguf", tokenizer)
    write("eagle.gguf", eagle_draft, arch="eagle")
    write("medusa.gguf", medusa_heads, arch="medusa")
    write_wire()
    write_src()
    write_safetensors()
    return 0


if __name__ == "__main__":
    sys.exit(main())
