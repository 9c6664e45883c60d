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
  .venv/bin/python bench/quant_error_sources.py F16.gguf rotation [--chunks 3] [--configs none,had+down]
          [--smooth none,0.5,grid] [--rows full|short] [--e4m3] [--gptq N] [--seed 0]
      QuaRot-style transforms, exact in real arithmetic, before int8: the norms'
      gammas folded into the linears, the residual stream rotated by Q (a
      randomized Hadamard or a random orthogonal matrix), an online Hadamard
      on down_proj's input; then the `sources` decomposition (int8 weights /
      activations / both / one site) with and without SmoothQuant
      (docs/quant_rotation.md).

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

    def __init__(self, path=None):
        if path is not None:     # None: the caller fills the weights (tests' tiny models)
            super().__init__(str(path))
        self.act = None      # fake quantizer of a matmul's input rows, or None
        self.only = None     # with act: only this site's inputs
        self.record = None   # {(layer, site): [rows]} when collecting inputs
        self.had = None      # online transform of down_proj's input (h -> h H), or None
        self.down_s = {}     # {layer: s}: down_proj's input divided by s after `had` (smoothing)

    def _mm(self, h, l, name):
        site = SITE[name]
        if name == "ffn_down":   # the runtime ops an engine would add before down_proj
            if self.had is not None:
                h = self.had(h)
            if l in self.down_s:
                h = h / self.down_s[l]
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
    """(PPL over each chunk's second half, llama.cpp's scheme; log-probs (only without base);
    mean KL vs base)"""
    nll = n = 0
    kl, lps = 0.0, []
    for ci, c in enumerate(chunks):
        lp = m.logits(c)[len(c) // 2:len(c) - 1]
        nll -= sum(lp[i, c[len(c) // 2 + i + 1]] for i in range(len(lp)))
        n += len(lp)
        if base is not None:
            kl += (np.exp(base[ci]) * (base[ci] - lp)).sum()
        else:
            lps.append(lp)
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


def calib_amax(m, calib):
    """{(layer, site): per-channel max |input|} over the calibration windows."""
    m.record = {}
    for c in calib:
        m.logits(c)
    amax = {k: np.abs(np.concatenate(v)).max(0) for k, v in m.record.items()}
    m.record = None
    return amax


def smooth(m, calib, alpha, amax=None):
    """SmoothQuant folded into the norms (q/k/v, gate/up) and up's rows (down); with an online
    Hadamard before down_proj (m.had) its channels are the rotated ones, so down's divide goes
    after it (m.down_s, fused into that runtime op). alpha: a number, or {site: alpha} for some
    of qkv / gu / down (the sites left out are not smoothed)."""
    if amax is None:
        amax = calib_amax(m, calib)
    al = alpha if isinstance(alpha, dict) else dict.fromkeys(("qkv", "gu", "down"), alpha)
    w = m.w
    for l in range(m.n_layer):
        p = f"blk.{l}."
        for grp, norm, site in ((LIN[:3], "attn_norm", "qkv"), (LIN[4:6], "ffn_norm", "gu")):
            if site not in al:
                continue
            aw = np.max([np.abs(w[p + g + ".weight"]).max(0) for g in grp], 0)
            s = np.clip(amax[(l, site)] ** al[site] / aw ** (1 - al[site]), 1e-5, 1e5)
            w[p + norm + ".weight"] = w[p + norm + ".weight"] / s
            for g in grp:
                w[p + g + ".weight"] = w[p + g + ".weight"] * s
        if "down" not in al:
            continue
        aw = np.abs(w[p + "ffn_down.weight"]).max(0)
        s = np.clip(amax[(l, "down")] ** al["down"] / aw ** (1 - al["down"]), 1e-5, 1e5)
        if m.had is not None:
            m.down_s[l] = s
        else:
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


# ---------------------------------------------------------------------------
# rotation (QuaRot-style): norm folding, a residual rotation Q, an online
# Hadamard before down_proj; every transform exact in real arithmetic
# ---------------------------------------------------------------------------
def sylvester(n):
    """Sylvester's +-1 Hadamard matrix of order n (a power of two)."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    if h.shape[0] != n:
        raise ValueError(f"sylvester: {n} is not a power of two")
    return h


def paley12():
    """Paley's construction I for q = 11 (q = 3 mod 4): a +-1 Hadamard matrix of order 12."""
    q = 11
    res = {(i * i) % q for i in range(1, q)}
    chi = [0] + [1 if a in res else -1 for a in range(1, q)]
    s = np.zeros((q + 1, q + 1))
    s[0, 1:], s[1:, 0] = 1, -1
    s[1:, 1:] = [[chi[(j - i) % q] for j in range(q)] for i in range(q)]
    return np.eye(q + 1) + s


def hadamard_factors(n):
    """+-1 matrices whose Kronecker product is a Hadamard matrix of order n = 12^a 2^b:
    [H_12] * a + [H_2^b] (576 = H_12 x H_12 x H_4, 1536 = H_12 x H_128)."""
    a, r = 0, n
    while r % 12 == 0:
        a, r = a + 1, r // 12
    if r & (r - 1):
        raise ValueError(f"hadamard: no construction for order {n} (need 12^a 2^b)")
    return [paley12()] * a + ([sylvester(r)] if r > 1 else [])


def kron_rows(h, factors):
    """h @ kron(*factors) along h's last axis, without forming the product: one small matmul
    per factor (for a power-of-two factor an engine would use the fast Walsh-Hadamard transform)."""
    dims = [f.shape[0] for f in factors]
    v = h.reshape(-1, *dims)
    for i, f in enumerate(factors):
        v = np.moveaxis(np.tensordot(v, f, axes=([i + 1], [0])), -1, i + 1)
    return v.reshape(h.shape)


def signed_hadamard(n, rng):
    """h -> h diag(s) H / sqrt(n), s random +-1: an orthogonal map, and its dense matrix."""
    fac, s = hadamard_factors(n), rng.choice([-1.0, 1.0], n)

    def apply(h):
        return kron_rows(h * s, fac) / math.sqrt(n)
    return apply, apply(np.eye(n))


def random_orthogonal(n, rng):
    """Haar-random orthogonal matrix: QR of a Gaussian, R's diagonal signs moved into Q."""
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    return q * np.sign(np.diag(r))


def fold_norms(m):
    """Every RMSNorm's gamma into the linears it feeds (the lm head is untied); gammas become 1."""
    w = m.w
    for l in range(m.n_layer):
        p = f"blk.{l}."
        for grp, norm in ((LIN[:3], "attn_norm"), (LIN[4:6], "ffn_norm")):
            g = w[p + norm + ".weight"]
            for n in grp:
                w[p + n + ".weight"] = w[p + n + ".weight"] * g
            w[p + norm + ".weight"] = np.ones_like(g)
    m.out = m.out * w["output_norm.weight"]
    w["output_norm.weight"] = np.ones_like(w["output_norm.weight"])


def rotate(m, Q):
    """Residual stream x -> x Q (norms folded first: RMSNorm with gamma 1 commutes with Q)."""
    w = m.w
    w["token_embd.weight"] = w["token_embd.weight"] @ Q
    for l in range(m.n_layer):
        p = f"blk.{l}."
        for n in ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up"):
            w[p + n + ".weight"] = w[p + n + ".weight"] @ Q
        for n in ("attn_output", "ffn_down"):
            w[p + n + ".weight"] = Q.T @ w[p + n + ".weight"]
    m.out = m.out @ Q


def block_hadamard(n, b, rng):
    """h -> h diag(s) blockdiag(H_b, ..., H_b) / sqrt(b), s random +-1, b a power of two dividing n:
    a fast Walsh-Hadamard transform on each block (what the engine's `hadamard` op runs)."""
    if n % b:
        raise ValueError(f"block_hadamard: {b} does not divide {n}")
    hb, s = sylvester(b), rng.choice([-1.0, 1.0], n)

    def apply(h):
        v = (h * s).reshape(*h.shape[:-1], n // b, b)
        return (v @ hb).reshape(h.shape) / math.sqrt(b)
    return apply


def down_hadamard(m, rng, block=0):
    """down_proj's input h -> h H at run time (m.had), W_down -> W_down H offline; block 0: the
    full H_12 x H_128, else block-diagonal H_block."""
    n = m.w["blk.0.ffn_down.weight"].shape[1]
    m.had = signed_hadamard(n, rng)[0] if not block else block_hadamard(n, block, rng)
    for l in range(m.n_layer):
        p = f"blk.{l}.ffn_down.weight"
        m.w[p] = m.had(m.w[p])


ROT_CONFIGS = ("none", "fold", "down", "had", "had+down", "orth", "orth+down")


def transform(m, orig, config, seed, down_block=0):
    """m back to orig's weights, then config: none (as `sources`: no fold), fold (norms folded
    only), down (online H only), had / orth (norms folded, Q a randomized Hadamard / a random
    orthogonal), +down (and the online H)."""
    m.w, m.out, m.had, m.down_s = dict(orig[0]), orig[1], None, {}
    rng = np.random.default_rng(seed)
    q, _, down = config.partition("+")
    if q in ("fold", "had", "orth"):
        fold_norms(m)
    if q in ("had", "orth"):
        rotate(m, signed_hadamard(m.dim, rng)[1] if q == "had" else random_orthogonal(m.dim, rng))
    if down or q == "down":
        down_hadamard(m, rng, down_block)


def gptq_int8(W, H, damp=0.01, block=128):
    """GPTQ (Frantar et al. 2022, Algorithm 1) onto the per-row int8 grid of q_int8, the scale
    amax/127 taken before any feedback (as li_q8_gptq); H = X^T X of the layer's input."""
    W, n = W.copy(), W.shape[1]
    s = np.abs(W).max(1) / 127.0
    s[s == 0] = 1
    H = H.copy()
    dead = np.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    H += damp * np.mean(np.diag(H)) * np.eye(n)
    U = np.linalg.cholesky(np.linalg.inv(H)).T          # upper: H^-1 = U^T U
    Q = np.empty_like(W)
    for i1 in range(0, n, block):
        i2 = min(i1 + block, n)
        W1, E = W[:, i1:i2].copy(), np.empty((W.shape[0], i2 - i1))
        for i in range(i2 - i1):
            q = np.clip(np.round(W1[:, i] / s), -127, 127) * s
            Q[:, i1 + i] = q
            E[:, i] = (W1[:, i] - q) / U[i1 + i, i1 + i]
            W1[:, i:] -= np.outer(E[:, i], U[i1 + i, i1 + i:i2])
        W[:, i2:] -= E @ U[i1:i2, i2:]
    return Q


def gptq_weights(m, calib):
    """{weight name: GPTQ int8} with each site's X^T X over the calibration windows (the
    inputs as the matmul sees them: after smoothing and the online Hadamard)."""
    H = {}
    for c in calib:
        m.record = {}
        m.logits(c)
        for k, v in m.record.items():
            x = np.concatenate(v)
            H[k] = H.get(k, 0) + x.T @ x
    m.record = None
    return {f"blk.{l}.{n}.weight": gptq_int8(m.w[f"blk.{l}.{n}.weight"], H[(l, SITE[n])])
            for l in range(m.n_layer) for n in LIN}


def scored(m, chunks, base, wq=None, aq=None, only=None, wsites=None):
    """score() with weights (those of wsites, or all) through wq (a function, or a dict of
    quantized weights by name) and inputs through aq."""
    keep = dict(m.w)
    if wq:
        for l in range(m.n_layer):
            for n in LIN:
                k = f"blk.{l}.{n}.weight"
                if wsites is None or SITE[n] in wsites:
                    m.w[k] = wq[k] if isinstance(wq, dict) else wq(keep[k])
    m.act, m.only = aq, only
    try:
        p, _, kl = score(m, chunks, base)
    finally:
        m.w, m.act, m.only = keep, None, None
    return p, kl


def alpha_grid(m, amax, cal, cal_base, grid):
    """Per site (qkv, gu, down) the alpha of grid with the lowest KL on calibration text, int8
    weights and activations at that site only (the others exact)."""
    keep, best = (dict(m.w), dict(m.down_s)), {}
    for site in ("qkv", "gu", "down"):
        kls = []
        for a in grid:
            smooth(m, None, {site: a}, amax)
            kls.append(scored(m, cal, cal_base, q_int8, q_int8, site, (site,))[1])
            m.w, m.down_s = dict(keep[0]), dict(keep[1])
        best[site] = grid[int(np.argmin(kls))]
        print(f"  alpha {site}: " + ", ".join(f"{a:.1f} {k:.5f}" for a, k in zip(grid, kls)),
              file=sys.stderr, flush=True)
    return best


def rotation(a, m, ev, calib):
    chunks = windows(ev, a.chunks)
    ppl0, base, _ = score(m, chunks)
    base = [b.astype(np.float32) for b in base]    # KL only: f32 is plenty, and 20+ chunks fit
    lp0 = m.logits(chunks[0])                      # float64, for the exactness check
    amax_windows, cal = windows(calib, 4), windows(calib[4 * 512:], 2)
    cal_base = score(m, cal)[1] if "grid" in a.smooth + a.configs else None
    orig = (dict(m.w), m.out)
    rows = [("—", "", "f16", ppl0, 0.0)]

    def row(config, sm, label, p, kl):
        rows.append((config, sm, label, p, kl))
        print(f"  {config} {sm} {label}: ppl {p:.4f} KL {kl:.5f}", file=sys.stderr, flush=True)

    for config in a.configs.split(","):
        config, _, smoothings = config.partition(":")     # NAME:S1;S2 overrides --smooth
        smoothings = smoothings.split(";") if smoothings else a.smooth.split(",")
        transform(m, orig, config, a.seed, a.down_block)
        dev = np.abs(m.logits(chunks[0]) - lp0).max()
        print(f"{config}: float forward, max |log-prob - F16's| on chunk 0: {dev:.2e}",
              file=sys.stderr, flush=True)
        if config != "none" and a.rows == "full":
            row(config, "", f"float, transformed (max Δ log-prob {dev:.1e})", *scored(m, chunks, base))
        if a.e4m3:
            for label, wq, aq in (("e4m3 weights", q_e4m3, None), ("e4m3 activations", None, q_e4m3),
                                  ("e4m3 both", q_e4m3, q_e4m3)):
                row(config, "none", label, *scored(m, chunks, base, wq, aq))
        kept = (dict(m.w), dict(m.down_s))
        amax = calib_amax(m, amax_windows) if set(smoothings) - {"none"} else None
        for sm in smoothings:
            m.w, m.down_s = dict(kept[0]), dict(kept[1])
            if sm == "grid":
                al = alpha_grid(m, amax, cal, cal_base, [i / 10 for i in range(10)])
                smooth(m, None, al, amax)
                sm = "SQ " + "/".join(f"{al[s]:.1f}" for s in ("qkv", "gu", "down"))
            elif "/" in sm:     # q/k/v / gate-up / down alphas, as a grid run printed them
                smooth(m, None, dict(zip(("qkv", "gu", "down"), map(float, sm.split("/")))), amax)
                sm = "SQ " + sm
            elif sm != "none":
                smooth(m, None, float(sm), amax)
                sm = "SQ " + sm
            runs = [("int8 weights", q_int8, None, None), ("int8 both", q_int8, q_int8, None)]
            if a.rows == "full":
                runs.insert(1, ("int8 activations", None, q_int8, None))
                runs += [(f"int8 activations at {s} only", None, q_int8, s) for s in ("qkv", "o", "gu", "down")]
            for label, wq, aq, only in runs:
                row(config, sm, label, *scored(m, chunks, base, wq, aq, only))
            if a.gptq:
                g = gptq_weights(m, windows(calib, a.gptq))
                row(config, sm, "int8 weights (GPTQ)", *scored(m, chunks, base, g))
                row(config, sm, "int8 both (GPTQ)", *scored(m, chunks, base, g, q_int8))
    n = sum(len(c) - 1 - len(c) // 2 for c in chunks)
    print(f"F16 baseline, {a.chunks} held-out chunks of 512 ({n} scored tokens); Q: had = randomized "
          f"Hadamard, orth = random orthogonal (seed {a.seed}); +down / down = online Hadamard before "
          "down_proj; SQ = SmoothQuant alpha (q/k/v / gate-up / down when searched)\n")
    print("| rotation | smoothing | quantized | PPL | ΔPPL | mean KL |\n|---|---|---|---:|---:|---:|")
    for config, sm, label, p, kl in rows:
        print(f"| {config} | {sm} | {label} | {p:.4f} | {100 * (p / ppl0 - 1):+.2f}% | {kl:.5f} |")


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
    ap.add_argument("what", choices=["sources", "layers", "rotation"])
    ap.add_argument("quantized", nargs="*", help="layers: 4-bit GGUF files of luainfer quantize")
    ap.add_argument("--chunks", type=int, default=3)
    ap.add_argument("--layers", default="0,15,29")
    ap.add_argument("--bin", default=ROOT / "build" / "luainfer")
    ap.add_argument("--configs", default=",".join(ROT_CONFIGS),
                    help="rotation: of " + ", ".join(ROT_CONFIGS) + "; NAME:S1;S2 sets that one's --smooth")
    ap.add_argument("--smooth", default="none,0.5",
                    help="rotation: none, an alpha, A/B/C (q/k/v, gate-up, down), grid (per site, "
                         "searched on calibration text)")
    ap.add_argument("--rows", choices=["full", "short"], default="full",
                    help="rotation: the decomposition, or int8 weights and both only")
    ap.add_argument("--e4m3", action="store_true", help="rotation: e4m3 rows too (no smoothing)")
    ap.add_argument("--seed", type=int, default=0, help="rotation: of the random signs and Q")
    ap.add_argument("--gptq", type=int, default=0, metavar="N",
                    help="rotation: GPTQ int8 weights too, X^T X over N calibration windows")
    ap.add_argument("--down-block", type=int, default=0, metavar="B",
                    help="rotation: the online Hadamard block-diagonal, blocks of B (a power of two; 0: "
                         "the full H_12 x H_128)")
    a = ap.parse_args()
    if a.what == "layers" and not a.quantized:
        sys.exit("quant_error_sources: layers needs at least one quantized GGUF")
    bad = [c.partition(":")[0] for c in a.configs.split(",") if c.partition(":")[0] not in ROT_CONFIGS]
    sms = a.smooth.split(",") + [x for c in a.configs.split(",") if ":" in c for x in c.partition(":")[2].split(";")]
    bad += [s for s in sms if s not in ("none", "grid") and (s.count("/") not in (0, 2) or
            not all(x.replace(".", "", 1).isdigit() for x in s.split("/")))]
    if bad:
        sys.exit(f"quant_error_sources: unknown --configs / --smooth value {bad[0]!r}")
    for f in (a.model, a.bin):
        if not Path(f).is_file():
            sys.exit(f"quant_error_sources: {f}: no such file")
    ev = tokens(a.model, ROOT / "tests/data/alice29.txt", a.bin)
    calib = tokens(a.model, ROOT / "tests/data/plrabn12.txt", a.bin)
    m = Model(a.model)
    {"sources": sources, "layers": layers, "rotation": rotation}[a.what](a, m, ev, calib)


if __name__ == "__main__":
    main()
