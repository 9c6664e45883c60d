#!/usr/bin/env python3
"""Dump llama.cpp's intermediate tensors for one prompt, to find the first op
where a luainfer run stops being bit-identical to llama.cpp.

    .venv/bin/python tools/ggml_trace.py --tokens 504,3458,282 --decode 2 \
        --layer 0 --out /tmp/trace.npz

Evaluates the prompt tokens in one batch, then --decode greedy tokens one at a
time (the way tools/gen_llama_golden.py does), and records every graph node of
the chosen layer (names like "attn_norm-0", "kq_soft_max-0") plus the final
"result_norm" / "result_output". Keys in the .npz are "<eval>/<n>:<name>",
eval 0 being the prompt batch; arrays are float32 in ggml's order (ne[0]
innermost). Uses llama-cpp-python's cb_eval hook (tools/setup.sh --golden).
"""

import argparse
import ctypes
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


class GgmlTensor(ctypes.Structure):
    """struct ggml_tensor of the ggml that llama-cpp-python 0.3.36 vendors."""
    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


DTYPES = {0: np.float32, 1: np.float16}


def read_tensor(t):
    dt = DTYPES.get(t.type)
    if dt is None or not t.data:
        return None
    ne = [int(x) for x in t.ne]
    nb = [int(x) for x in t.nb]
    span = sum((n - 1) * s for n, s in zip(ne, nb)) + np.dtype(dt).itemsize
    raw = (ctypes.c_char * span).from_address(t.data)
    flat = np.frombuffer(raw, dtype=np.uint8)
    arr = np.lib.stride_tricks.as_strided(
        flat.view(dt), shape=tuple(reversed(ne)), strides=tuple(reversed(nb)))
    return np.array(arr, dtype=np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.environ.get("LUAINFER_MODEL", DEFAULT_MODEL))
    ap.add_argument("--tokens", required=True, help="prompt token ids, comma-separated")
    ap.add_argument("--decode", type=int, default=1, help="greedy tokens to decode one by one")
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import llama_cpp

    suffix = f"-{args.layer}"
    state = {"eval": 0, "n": 0, "out": {}}

    @llama_cpp.ggml_backend_sched_eval_callback
    def cb(tp, ask, _ud):
        t = ctypes.cast(tp, ctypes.POINTER(GgmlTensor)).contents
        name = t.name.decode(errors="replace")
        want = name.endswith(suffix) or name.startswith("result_")
        if ask:
            return want
        if want:
            a = read_tensor(t)
            if a is not None:
                state["out"][f"{state['eval']}/{state['n']:03d}:{name}"] = a
                state["n"] += 1
        return True

    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(args.model.encode(), mp)
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = 2048
    cp.n_threads = cp.n_threads_batch = args.threads
    cp.flash_attn_type = 0
    cp.cb_eval = cb
    ctx = llama_cpp.llama_init_from_model(model, cp)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))

    toks = [int(x) for x in args.tokens.split(",")]
    pos = 0
    generated = []
    for step in range(1 + args.decode):
        batch = llama_cpp.llama_batch_init(len(toks), 0, 1)
        batch.n_tokens = len(toks)
        for i, tk in enumerate(toks):
            batch.token[i] = tk
            batch.pos[i] = pos + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1
        state["eval"], state["n"] = step, 0
        if llama_cpp.llama_decode(ctx, batch) != 0:
            sys.exit("llama_decode failed")
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx), shape=(len(toks), n_vocab)).copy()
        state["out"][f"{step}/logits"] = logits
        llama_cpp.llama_batch_free(batch)
        pos += len(toks)
        nxt = int(np.argmax(logits[-1]))
        generated.append(nxt)
        toks = [nxt]
    np.savez(args.out, **state["out"])
    print("generated", generated, "->", args.out, f"({len(state['out'])} arrays)")


if __name__ == "__main__":
    main()
