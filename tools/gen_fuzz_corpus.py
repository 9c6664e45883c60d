#!/usr/bin/env python3
"""Writes the seed corpus for tests/fuzz/fuzz_gguf.c: small valid GGUF files
made with the `gguf` package (the reference writer), so the fuzzer starts from
real layouts rather than from noise.

    .venv/bin/python tools/gen_fuzz_corpus.py

The output is deterministic and committed; rerun after changing this file.
Files stay under a few KiB so the fuzz driver gets through its mutations fast.
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fuzz", "corpus", "fuzz_gguf")


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


def main():
    os.makedirs(OUT, exist_ok=True)
    write("minimal.gguf", minimal)
    write("all_types.gguf", all_types)
    write("aligned64.gguf", aligned64)
    write("tokenizer.gguf", tokenizer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
