#!/usr/bin/env python3
"""gen_tiny_llama.py — a small real-vocabulary Llama GGUF cut from a bigger one.

Keeps the input's metadata (tokenizer, chat template, rope, ...), its token
embedding and output norm, and the first LAYERS blocks with the FFN cut to
its first FF channels (gate/up rows, down columns): a model every luainfer
command loads, with real tokens, whose 4-bit quantization (GPTQ's and AWQ's
O(n_in^2 .. n_in^3) work) takes seconds instead of minutes. Weights are
written as F16 (norms F32). Its outputs are not meant to be good text.

Usage: .venv/bin/python tools/gen_tiny_llama.py IN.gguf OUT.gguf [--layers 2] [--ff 256]
"""
import argparse
import os

import numpy as np
from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType, GGUFValueType
from gguf.quants import dequantize


def tensor_f32(t):
    shape = [int(x) for x in reversed(t.shape)]  # numpy order: rows first
    return dequantize(np.asarray(t.data), t.tensor_type).reshape(shape).astype(np.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("inp")
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--ff", type=int, default=256)
    a = ap.parse_args()
    r = GGUFReader(a.inp)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    tmp = a.out + ".tmp"
    w = GGUFWriter(tmp, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        val = f.contents()
        if name == f"{arch}.block_count":
            val = a.layers
        elif name == f"{arch}.feed_forward_length":
            val = a.ff
        vt = f.types[0]
        sub = f.types[-1] if vt == GGUFValueType.ARRAY else None
        w.add_key_value(name, val, vt, sub)
    for t in r.tensors:
        if t.name.startswith("blk."):
            if int(t.name.split(".")[1]) >= a.layers:
                continue
        x = tensor_f32(t)
        if ".ffn_gate." in t.name or ".ffn_up." in t.name:
            x = x[: a.ff]
        elif ".ffn_down." in t.name:
            x = np.ascontiguousarray(x[:, : a.ff])
        if x.ndim == 2:
            w.add_tensor(t.name, x.astype(np.float16), raw_dtype=GGMLQuantizationType.F16)
        else:
            w.add_tensor(t.name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
