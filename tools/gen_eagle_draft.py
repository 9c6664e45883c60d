#!/usr/bin/env python3
"""gen_eagle_draft.py — write an untrained EAGLE draft file for a GGUF model.

The format is docs/eagle.md's (the one `luainfer train-eagle` writes):
general.architecture "eagle", eagle.version 1, the block's shape, the base
blocks it reads (eagle.feature_layer.i), eagle.base.name / vocab_hash /
n_layer of the base, and the block's tensors; --vocab N adds eagle.vocab
(N ids of the base, ascending, drawn with the seed; 0: the whole vocabulary).
Weights are seeded scale * N(0, 1) (norms ones), so drafts are valid and
rarely accepted: for tests of the machinery, not for speed. Uses the gguf
package (tools/requirements-test.txt).

  .venv/bin/python tools/gen_eagle_draft.py --model models/X.gguf --out draft.gguf [--vocab 512]
"""
import argparse
import os
import sys

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover
    sys.exit("gen_eagle_draft.py: needs the gguf package (pip install gguf)")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_medusa_heads import field_value, vocab_hash  # noqa: E402


def add_draft(w, d, nv, n_head, n_kv, head_dim, n_ff, feats, n_layer, base_name, vocab_hash, mat, vocab=None):
    """The draft's keys and tensors (docs/eagle.md) into GGUFWriter w: mat(rows,
    cols) makes each matrix in file order (numpy (rows, cols) is GGUF [cols,
    rows]); norms are ones; vocab() gives the draft vocabulary (ascending int32
    base ids), called after the matrices; None: the whole vocabulary.
    gen_fuzz_corpus.py writes its tiny seed through this too."""
    for k, v in (("version", 1), ("n_embd", d), ("n_vocab", nv), ("n_head", n_head), ("n_head_kv", n_kv),
                 ("head_dim", head_dim), ("n_ff", n_ff), ("n_features", len(feats)), ("base.n_layer", n_layer)):
        w.add_uint32(f"eagle.{k}", v)
    for i, f in enumerate(feats):
        w.add_uint32(f"eagle.feature_layer.{i}", f)
    w.add_string("eagle.base.name", base_name)
    w.add_string("eagle.base.vocab_hash", vocab_hash)
    ones = lambda: np.ones(d, dtype=np.float32)  # noqa: E731
    w.add_tensor("eagle.fc.weight", mat(d, len(feats) * d))
    w.add_tensor("eagle.enorm.weight", ones())
    w.add_tensor("eagle.hnorm.weight", ones())
    w.add_tensor("eagle.attn_q.weight", mat(n_head * head_dim, 2 * d))
    w.add_tensor("eagle.attn_k.weight", mat(n_kv * head_dim, 2 * d))
    w.add_tensor("eagle.attn_v.weight", mat(n_kv * head_dim, 2 * d))
    w.add_tensor("eagle.attn_output.weight", mat(d, n_head * head_dim))
    w.add_tensor("eagle.ffn_norm.weight", ones())
    w.add_tensor("eagle.ffn_gate.weight", mat(n_ff, d))
    w.add_tensor("eagle.ffn_up.weight", mat(n_ff, d))
    w.add_tensor("eagle.ffn_down.weight", mat(d, n_ff))
    w.add_tensor("eagle.output_norm.weight", ones())
    if vocab is not None:
        w.add_tensor("eagle.vocab", vocab())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="the base GGUF")
    ap.add_argument("--out", required=True)
    ap.add_argument("--features", default="", help="base blocks read, ascending (default: 2, n_layer/2, n_layer-1)")
    ap.add_argument("--vocab", type=int, default=0, help="draft vocabulary size (0: the whole vocabulary)")
    ap.add_argument("--n-ff", type=int, default=0, help="the block's FFN size (default: the base's)")
    ap.add_argument("--scale", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=("f32", "f16"), default="f16")
    ap.add_argument("--vocab-hash", help="store this eagle.base.vocab_hash instead of the model's (tests)")
    a = ap.parse_args()
    r = gguf.GGUFReader(a.model)
    arch = field_value(r, "general.architecture")
    get = lambda k: field_value(r, f"{arch}.{k}")  # noqa: E731
    d, n_layer, n_head, n_ff = (int(get(k)) for k in ("embedding_length", "block_count", "attention.head_count",
                                                       "feed_forward_length"))
    n_kv = int(get("attention.head_count_kv") or n_head)
    head_dim = d // n_head
    h, nv = vocab_hash(r)
    feats = [int(x) for x in a.features.split(",")] if a.features else [2, n_layer // 2, n_layer - 1]
    if not 1 <= len(feats) <= 4 or feats != sorted(set(feats)) or feats[-1] >= n_layer or feats[0] < 0:
        sys.exit(f"gen_eagle_draft.py: --features must be 1..4 ascending blocks of [0, {n_layer}), got {a.features}")
    if not 0 <= a.vocab <= nv:
        sys.exit(f"gen_eagle_draft.py: --vocab must be in [0, {nv}], got {a.vocab}")
    n_ff = a.n_ff or n_ff
    rng = np.random.default_rng(a.seed)
    wt = np.float16 if a.dtype == "f16" else np.float32
    mat = lambda rows, cols: (a.scale * rng.standard_normal((rows, cols))).astype(wt)  # noqa: E731
    tmp = f"{a.out}.tmp.{os.getpid()}"
    w = gguf.GGUFWriter(tmp, "eagle")
    add_draft(w, d=d, nv=nv, n_head=n_head, n_kv=n_kv, head_dim=head_dim, n_ff=n_ff, feats=feats, n_layer=n_layer,
              base_name=field_value(r, "general.name") or os.path.basename(a.model),
              vocab_hash=a.vocab_hash or f"{h:016x}", mat=mat,
              vocab=(lambda: np.sort(rng.choice(nv, a.vocab, replace=False)).astype(np.int32)) if a.vocab else None)
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


if __name__ == "__main__":
    main()
