#!/usr/bin/env python3
"""gen_medusa_heads.py — write an untrained Medusa heads file for a GGUF model.

The format is docs/speculation.md's "Medusa heads file" (the one
`luainfer train-medusa` writes): general.architecture "medusa", medusa.version
1, medusa.n_heads K, medusa.n_embd / medusa.n_vocab / medusa.base.name /
medusa.base.vocab_hash of the base, medusa.hidden "post_norm", and per head k
medusa.{k}.weight (n_embd x n_embd, F32 or F16) and medusa.{k}.bias (F32).

  --init zero    W = 0, b = 0: every head gives the base's own next-token
                 logits (a correct file whose drafts are rarely accepted)
  --init random  W, b ~ scale * U(-1, 1) (seeded)

For tests and benchmarks of the machinery, not for speed: trained heads come
from `luainfer train-medusa`. Uses the gguf package (tools/requirements-test.txt).

  .venv/bin/python tools/gen_medusa_heads.py --model models/X.gguf --out heads.gguf --heads 3 --init zero
"""
import argparse
import os
import sys

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover
    sys.exit("gen_medusa_heads.py: needs the gguf package (pip install gguf)")


def field_value(reader, key):
    f = reader.fields.get(key)
    if f is None:
        return None
    if f.types and f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8", "replace")
    return f.parts[f.data[0]][0]


def vocab_hash(reader):
    """li_tokenizer_vocab_hash: FNV-1a 64 over n_vocab (4 bytes, little end
    first), then each token's bytes followed by a 0 byte, in id order."""
    f = reader.fields["tokenizer.ggml.tokens"]
    toks = [bytes(f.parts[i]) for i in f.data]
    h, prime, mask = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1
    nv = len(toks)
    for i in range(4):
        h = ((h ^ ((nv >> (8 * i)) & 0xFF)) * prime) & mask
    for t in toks:
        for b in t:
            h = ((h ^ b) * prime) & mask
        h = (h * prime) & mask
    return h, nv


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="the base GGUF")
    ap.add_argument("--out", required=True)
    ap.add_argument("--heads", type=int, default=3, help="K in [1, 8] (default 3)")
    ap.add_argument("--init", choices=("zero", "random"), default="zero")
    ap.add_argument("--scale", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=("f32", "f16"), default="f16")
    ap.add_argument("--vocab-hash", help="store this medusa.base.vocab_hash instead of the model's (tests: heads "
                    "made for another model)")
    a = ap.parse_args()
    if not 1 <= a.heads <= 8:
        sys.exit(f"gen_medusa_heads.py: --heads must be in [1, 8], got {a.heads}")
    r = gguf.GGUFReader(a.model)
    arch = field_value(r, "general.architecture")
    n_embd = field_value(r, f"{arch}.embedding_length")
    if n_embd is None or "tokenizer.ggml.tokens" not in r.fields:
        sys.exit(f"gen_medusa_heads.py: {a.model}: no {arch}.embedding_length or tokenizer")
    n_embd = int(n_embd)
    h, nv = vocab_hash(r)
    name = field_value(r, "general.name") or os.path.basename(a.model)
    rng = np.random.default_rng(a.seed)
    tmp = f"{a.out}.tmp.{os.getpid()}"
    w = gguf.GGUFWriter(tmp, "medusa")
    w.add_uint32("medusa.version", 1)
    w.add_uint32("medusa.n_heads", a.heads)
    w.add_uint32("medusa.n_embd", n_embd)
    w.add_uint32("medusa.n_vocab", nv)
    w.add_string("medusa.base.name", name)
    w.add_string("medusa.base.vocab_hash", a.vocab_hash or f"{h:016x}")
    w.add_string("medusa.hidden", "post_norm")
    wt = np.float16 if a.dtype == "f16" else np.float32
    for k in range(a.heads):
        if a.init == "zero":
            W = np.zeros((n_embd, n_embd), dtype=wt)
            b = np.zeros(n_embd, dtype=np.float32)
        else:
            W = (a.scale * rng.uniform(-1, 1, (n_embd, n_embd))).astype(wt)
            b = (a.scale * rng.uniform(-1, 1, n_embd)).astype(np.float32)
        w.add_tensor(f"medusa.{k}.weight", W)  # numpy (out, in): GGUF [in, out]
        w.add_tensor(f"medusa.{k}.bias", b)
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, a.out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    print(f"{a.out}: {a.heads} {a.init} heads for '{name}' (n_embd {n_embd}, n_vocab {nv}, vocab hash {h:016x})")


if __name__ == "__main__":
    main()
