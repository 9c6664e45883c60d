#!/usr/bin/env python3
"""quant_error_sources.py — where quantization error comes from, in a plain
float64 NumPy forward of the F16 baseline (no luainfer code involved).

  .venv/bin/python bench/quant_error_sources.py F16.gguf sources [--chunks 3]
      mean KL against F16 (and PPL) with only the weights, only the
      activations, or both fake-quantized: int8 (per row / per token, after
      SmoothQuant alpha 0.5 with the norm and up->down folds) and e4m3
      (per row / per token, no smoothing); then int8 activations at one
      site at a time (q/k/v, o, gate/up, down).
  .venv/bin/python bench/quant_error_sources.py F16.gguf layers Q.gguf [Q2.gguf ...] [--layers 0,15,29]
      for 4-bit files written by `luainfer quantize` (rtn4, gptq): each
      weight's relative output error ||X (Wq - W)^T||^2 / ||X W^T||^2 on
      the calibration windows and on held-out windows, and on the first
      token's rows alone (the attention sink).

Token ids come from `luainfer run` (the model's own tokenizer). Held-out:
tests/data/alice29.txt; calibration: tests/data/plrabn12.txt, 512-token
windows starting with BOS, as `luainfer quantize` takes them.
"""
import argparse
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGUFReader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from gen_llama_golden import RefLlama  # noqa: E402  (the float64 reference forward)
LIN = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
SITE = {"attn_q": "qkv", "attn_k": "qkv", "attn_v": "qkv", "attn_output": "o", "ffn_gate": "gu",
        "ffn_up": "gu", "ffn_down": "down"}


def tokens(model, path, binary):
    lua = "local e = require('luainfer').engine{model = arg[1]}\n" \
          "local f = assert(io.open(arg[2])); local s = f:read('*a'); f:close()\n" \
          "io.write(table.concat(e:tokenize(s, false), ' '))\n"
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as f:
        f.write(lua)
        f.flush()
        out = subprocess.run([str(binary), "run", f.name, str(model), str(path)], capture_output=True, text=True,
                             check=True).stdout
    return [int(t) for t in out.split()]


class Model(RefLlama):
    """tools/gen_llama_golden.py's float64 Llama, with hooks on every matmul's input."""

    def __init__(self, path):
        super().__init__(str(path))
        self.act = None      # fake quantizer of a matmul's input rows, or None
        self.only = None     # with act: only this site's inputs
        self.record = None   # {(layer, site): [rows]} when collecting inputs

    def _mm(self, h, l, name):
        site = SITE[name]
        if self.record is not None:
            self.record.setdefault((l, site), []).append(h)
        if self.act and (self.only is None or self.only == site):
            h = self.act(h)
        return super()._mm(h, l, name)

    def logits(self, toks):
        """(len(toks), n_vocab) log-probabilities"""
        lg = super().logits(toks)
        lg -= lg.max(-1, keepdims=True)
        return lg - np.log(np.exp(lg).sum(-1, keepdims=True))


def windows(toks, n, bos=1, L=512):
    return [[bos] + toks[i * L + 1:(i + 1) * L] for i in range(n)]


def score(m, chunks, base=None):
    """(PPL over each chunk's second half, llama.cpp's scheme; log-probs; mean KL vs base)"""
    nll = n = 0
    kl, lps = 0.0, []
    for ci, c in enumerate(chunks):
        lp = m.logits(c)[len(c) // 2:len(c) - 1]
        lps.append(lp)
        nll -= sum(lp[i, c[len(c) // 2 + i + 1]] for i in range(len(lp)))
        n += len(lp)
        if base is not None:
            kl += (np.exp(base[ci]) * (base[ci] - lp)).sum()
    return math.exp(nll / n), lps, kl / n


def q_int8(v, axis=1):
    s = np.abs(v).max(axis=axis, keepdims=True) / 127.0
    s[s == 0] = 1
    return np.clip(np.round(v / s), -127, 127) * s


def e4m3(v):
    a = np.abs(v)
    e = np.maximum(np.floor(np.log2(np.maximum(a, 2.0 ** -9))), -6)
    step = 2.0 ** (e - 3)
    return np.sign(v) * np.minimum(np.round(a / step) * step, 448.0)


def q_e4m3(v, axis=1):
    s = np.abs(v).max(axis=axis, keepdims=True) / 448.0
    s[s == 0] = 1
    return e4m3(v / s) * s


def smooth(m, calib, alpha):
    """SmoothQuant folded into the norms (q/k/v, gate/up) and up's rows (down)."""
    m.record = {}
    for c in calib:
        m.logits(c)
    amax = {k: np.abs(np.concatenate(v)).max(0) for k, v in m.record.items()}
    m.record = None
    w = m.w
    for l in range(m.n_layer):
        p = f"blk.{l}."
        for grp, norm, site in ((LIN[:3], "attn_norm", "qkv"), (LIN[4:6], "ffn_norm", "gu")):
            aw = np.max([np.abs(w[p + g + ".weight"]).max(0) for g in grp], 0)
            s = np.clip(amax[(l, site)] ** alpha / aw ** (1 - alpha), 1e-5, 1e5)
            w[p + norm + ".weight"] = w[p + norm + ".weight"] / s
            for g in grp:
                w[p + g + ".weight"] = w[p + g + ".weight"] * s
        aw = np.abs(w[p + "ffn_down.weight"]).max(0)
        s = np.clip(amax[(l, "down")] ** alpha / aw ** (1 - alpha), 1e-5, 1e5)
        w[p + "ffn_up.weight"] = w[p + "ffn_up.weight"] / s[:, None]
        w[p + "ffn_down.weight"] = w[p + "ffn_down.weight"] * s


def sources(a, m, ev, calib):
    chunks = windows(ev, a.chunks)
    ppl0, base, _ = score(m, chunks)
    rows = [("f16", ppl0, 0.0)]
    orig = {k: v.copy() for k, v in m.w.items()}
    names = [f"blk.{l}.{n}.weight" for l in range(m.n_layer) for n in LIN]

    def run(label, wq, aq, only=None):
        if wq:
            for n in names:
                m.w[n] = wq(kept[n])
        m.act, m.only = aq, only
        p, _, kl = score(m, chunks, base)
        rows.append((label, p, kl))
        print(f"  {label}: ppl {p:.4f} KL {kl:.5f}", file=sys.stderr, flush=True)
        m.act = m.only = None
        m.w.update({n: kept[n].copy() for n in names})

    kept = orig
    for label, wq, aq in (("e4m3 weights", q_e4m3, None), ("e4m3 activations", None, q_e4m3),
                          ("e4m3 both", q_e4m3, q_e4m3)):
        run(label, wq, aq)
    smooth(m, windows(calib, 4), 0.5)
    kept = {k: v.copy() for k, v in m.w.items()}
    for label, wq, aq in (("int8 weights (SmoothQuant 0.5)", q_int8, None),
                          ("int8 activations (SmoothQuant 0.5)", None, q_int8),
                          ("int8 both (SmoothQuant 0.5)", q_int8, q_int8)):
        run(label, wq, aq)
    for site in ("qkv", "o", "gu", "down"):
        run(f"int8 activations at {site} only (SmoothQuant 0.5)", None, q_int8, site)
    print(f"F16 baseline, {a.chunks} held-out chunks of 512 (second halves scored)\n")
    print("| quantized | PPL | ΔPPL | mean KL |\n|---|---:|---:|---:|")
    for label, p, kl in rows:
        print(f"| {label} | {p:.4f} | {100 * (p / ppl0 - 1):+.2f}% | {kl:.5f} |")


def dequant4(tensors, name):
    c = np.asarray(tensors[name].data).view(np.uint8)
    codes = np.empty((c.shape[0], c.shape[1] * 2))
    codes[:, 0::2], codes[:, 1::2] = c & 15, c >> 4
    sc = np.asarray(tensors[name + ".scale"].data, np.float64)
    gs = codes.shape[1] // sc.shape[1]
    z = np.asarray(tensors[name + ".zero"].data, np.float64) if name + ".zero" in tensors else np.full_like(sc, 8.0)
    wq = (codes - np.repeat(z, gs, 1)) * np.repeat(sc, gs, 1)
    if name + ".perm" in tensors:
        perm = np.asarray(tensors[name + ".perm"].data).astype(int).ravel()
        out = np.empty_like(wq)
        out[:, perm] = wq
        wq = out
    return wq


def layers(a, m, ev, calib):
    sel = [int(x) for x in a.layers.split(",")]
    X = {}
    for what, toks in (("calib", calib), ("held-out", ev)):
        m.record = {}
        for c in windows(toks, 4):
            m.logits(c)
        X[what] = {k: np.concatenate(v) for k, v in m.record.items() if k[0] in sel}
    m.record = None
    files = {Path(q).stem: {t.name: t for t in GGUFReader(q).tensors} for q in a.quantized}
    print("relative output error ||X (Wq - W)^T||^2 / ||X W^T||^2, 4 windows of 512 each\n")
    print("| layer | weight | " + " | ".join(f"{f} calib | {f} held-out | {f} first token" for f in files) + " |")
    print("|---|---|" + "---:|" * (3 * len(files)))
    for l in sel:
        for n in LIN:
            name, site = f"blk.{l}.{n}.weight", SITE[n]
            w0 = m.w[name]
            cells = []
            for t in files.values():
                d = dequant4(t, name) - w0
                for x in (X["calib"][(l, site)], X["held-out"][(l, site)], X["held-out"][(l, site)][::512]):
                    cells.append(f"{((x @ d.T) ** 2).sum() / ((x @ w0.T) ** 2).sum():.2e}")
            print(f"| {l} | {n} | " + " | ".join(cells) + " |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="the F16 baseline (luainfer quantize --method f16)")
    ap.add_argument("what", choices=["sources", "layers"])
    ap.add_argument("quantized", nargs="*", help="layers: 4-bit GGUF files of luainfer quantize")
    ap.add_argument("--chunks", type=int, default=3)
    ap.add_argument("--layers", default="0,15,29")
    ap.add_argument("--bin", default=ROOT / "build" / "luainfer")
    a = ap.parse_args()
    if a.what == "layers" and not a.quantized:
        sys.exit("quant_error_sources: layers needs at least one quantized GGUF")
    ev = tokens(a.model, ROOT / "tests/data/alice29.txt", a.bin)
    calib = tokens(a.model, ROOT / "tests/data/plrabn12.txt", a.bin)
    m = Model(a.model)
    (sources if a.what == "sources" else layers)(a, m, ev, calib)


if __name__ == "__main__":
    main()
