#!/usr/bin/env python3
"""prune_refit_targets.py — what a sequential refit would add to `prune --refit`
(issue 15; docs/pruning.md "Sequential refit: measured, not built").

The act-ranked 21% FFN cut of the default model (992 of 1536 channels kept in
every layer), down_proj's kept columns refit by least squares three ways, in
float32 NumPy from the gguf package's dequantized weights (no luainfer code):

  local  H from the original's inputs, target W X: what `prune --refit` does
  seq    H from the inputs the pruned prefix produces, target W X^ (the
         sequential variant of GPTQ / SparseGPT)
  seqc   H from X^, target the original's residual stream after the FFN minus
         the pruned model's residual before it: each layer's refit also
         absorbs, as far as a linear map of its inputs can, the error the
         layers before it left
  alloc  local, but the same 16,320 channels taken unevenly: each layer's
         refit error at 1536, 1472, ... 512 kept channels (act order), over
         the squared norm of its residual stream after the FFN, and channels
         taken 64 at a time from the layer whose error grows least
  allocraw  the same with the raw error (no normalization)

Calibration: the first NTOK tokens of tests/data/plrabn12.txt in 256-token
windows; held-out: 8 windows of 512 tokens of tests/data/alice29.txt, KL
against the unpruned model over positions 256..511 (the second half, as
`perplexity` scores). Tokens come from `luainfer run` (the engine's
tokenizer), written next to the output once.

  .venv/bin/python bench/prune_refit_targets.py MODE NTOK [DAMP] [FLOOR]

(FLOOR: alloc's fewest channels a block keeps, default 512)
"""
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import gguf

ROOT = Path(__file__).resolve().parents[1]
MODEL = os.environ.get("LUAINFER_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
BIN = os.environ.get("LUAINFER_BIN", str(ROOT / "build" / "luainfer"))
TOK_DIR = Path(os.environ.get("TMPDIR", "/tmp"))


def tokens(name):
    """the engine's tokens of tests/data/NAME (cached as NAME.tok in $TMPDIR)"""
    out = TOK_DIR / f"{name}.tok"
    if not out.exists():
        lua = TOK_DIR / "prune_refit_targets.lua"
        lua.write_text('local luainfer = require("luainfer")\n'
                       f'local e = luainfer.engine{{model = "{MODEL}"}}\n'
                       f'local f = io.open("{ROOT / "tests" / "data" / name}"); local s = f:read("*a"); f:close()\n'
                       f'local o = io.open("{out}.tmp", "w")\n'
                       'for _, t in ipairs(e:tokenize(s, false)) do o:write(t, "\\n") end\n'
                       'o:close()\n')
        subprocess.run([BIN, "run", str(lua)], check=True)
        os.replace(f"{out}.tmp", out)
    return np.loadtxt(out, dtype=np.int64)


if len(sys.argv) not in (3, 4, 5) or sys.argv[1] not in ("local", "seq", "seqc", "alloc", "allocraw"):
    sys.exit(__doc__)
mode = sys.argv[1]; ntok = int(sys.argv[2]); seq = 256; damp = float(sys.argv[3]) if len(sys.argv) > 3 else 0.01
floor = int(sys.argv[4]) if len(sys.argv) > 4 else 512
r = gguf.GGUFReader(MODEL)
T = {t.name: t for t in r.tensors}
def W(n):
    t = T[n]; return gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(list(reversed([int(x) for x in t.shape])))
def fld(k):
    f = r.fields[k]; return f.parts[f.data[0]].tolist()[0]
L = fld('llama.block_count'); H = fld('llama.attention.head_count'); KV = fld('llama.attention.head_count_kv')
D = fld('llama.embedding_length'); FF = fld('llama.feed_forward_length'); eps = fld('llama.attention.layer_norm_rms_epsilon')
theta = fld('llama.rope.freq_base'); HD = D // H
emb = W('token_embd.weight'); onorm = W('output_norm.weight')
lay = [{k: W(f'blk.{l}.{k}.weight') for k in ['attn_norm','attn_q','attn_k','attn_v','attn_output','ffn_norm','ffn_gate','ffn_up','ffn_down']} for l in range(L)]
def norm(x, g): return (x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * g).astype(np.float32)
def rope(x, Tn):
    inv = 1.0 / theta ** (np.arange(0, HD, 2, dtype=np.float64) / HD)
    ang = np.outer(np.arange(Tn), inv); c, s = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    a, b = x[..., 0::2], x[..., 1::2]; o = np.empty_like(x); o[..., 0::2], o[..., 1::2] = a * c - b * s, a * s + b * c; return o
def attn(x, p, Tn):  # x (nw, Tn, D) -> attention sublayer output (nw, Tn, D)
    nw = x.shape[0]; h = norm(x, p['attn_norm'])
    q = rope((h @ p['attn_q'].T).reshape(nw, Tn, H, HD).transpose(0, 2, 1, 3), Tn)
    k = rope((h @ p['attn_k'].T).reshape(nw, Tn, KV, HD).transpose(0, 2, 1, 3), Tn)
    v = (h @ p['attn_v'].T).reshape(nw, Tn, KV, HD).transpose(0, 2, 1, 3)
    k = np.repeat(k, H // KV, 1); v = np.repeat(v, H // KV, 1)
    s = q @ k.transpose(0, 1, 3, 2) / np.float32(np.sqrt(HD)) + np.triu(np.full((Tn, Tn), -np.inf, np.float32), 1)
    s = np.exp(s - s.max(-1, keepdims=True)); a = (s / s.sum(-1, keepdims=True)) @ v
    return a.transpose(0, 2, 1, 3).reshape(nw, Tn, H * HD) @ p['attn_output'].T
def ffn_act(x, p):
    h = norm(x, p['ffn_norm']); g = h @ p['ffn_gate'].T; return (g / (1 + np.exp(-g))) * (h @ p['ffn_up'].T)
mil = tokens('plrabn12.txt')[:ntok].reshape(-1, seq)
keep_n = 992
t0 = time.time()
xd = emb[mil].astype(np.float32); xp = xd.copy()   # dense and pruned residual streams (nw, seq, D)
newdown = []
B = 16
if mode.startswith('alloc'):
    # every layer's statistics on the original's stream first (they do not depend on the allocation)
    stats = []
    for l in range(L):
        p = lay[l]
        Hs = np.zeros((FF, FF)); asum = np.zeros(FF); sig = 0.0
        for i in range(0, len(mil), B):
            xdi = xd[i:i+B]
            md = xdi + attn(xdi, p, seq); ad = ffn_act(md, p); od = md + ad @ p['ffn_down'].T
            asum += np.abs(ad).reshape(-1, FF).sum(0); sig += float((od.astype(np.float64) ** 2).sum())
            X = ad.reshape(-1, FF); Hs += (X.T @ X).astype(np.float64)
            xd[i:i+B] = od
        wd = p['ffn_down'].astype(np.float64)
        order = np.argsort(-(asum * np.linalg.norm(wd, axis=0)), kind='stable')
        lam = damp * np.mean(np.diag(Hs)); total = np.einsum('ij,jk,ik->', wd, Hs, wd)
        err = {}
        for k in range(FF, floor - 1, -64):  # min ||W X - W_S X_S||^2 = tr(W H W^T) - tr(C_S (H_SS + lam)^-1 C_S^T), C = W H
            S = order[:k]; C = wd @ Hs[:, S]
            err[k] = max(0.0, total - np.einsum('ij,ij->', C, np.linalg.solve(Hs[np.ix_(S, S)] + lam * np.eye(k), C.T).T))
        stats.append((Hs, order, err, sig, lam))
        print(f'layer {l} stats {time.time()-t0:.0f}s', file=sys.stderr, flush=True)
    keep_l = [FF] * L
    norm_by = [1.0 if mode == 'allocraw' else st[3] for st in stats]
    for _ in range(L * (FF - keep_n) // 64):
        cost = [(stats[l][2][keep_l[l] - 64] - stats[l][2][keep_l[l]]) / norm_by[l] if keep_l[l] - 64 in stats[l][2]
                else np.inf for l in range(L)]
        keep_l[int(np.argmin(cost))] -= 64
    print(f'{mode} floor {floor} kept per layer: {keep_l} (sum {sum(keep_l)}, uniform {keep_n * L})')
    for l in range(L):
        Hs, order, _, _, lam = stats[l]; wd = lay[l]['ffn_down']
        keep = np.sort(order[:keep_l[l]]); C = wd.astype(np.float64) @ Hs[:, keep]
        Wk = np.linalg.solve(Hs[np.ix_(keep, keep)] + lam * np.eye(len(keep)), C.T).T
        nd = np.zeros_like(wd); nd[:, keep] = Wk.astype(np.float32); newdown.append(nd)
for l in range(L if not mode.startswith('alloc') else 0):
    p = lay[l]
    Hs = np.zeros((FF, FF)); C = np.zeros((D, FF)); asum = np.zeros(FF)
    for i in range(0, len(mil), B):
        xdi = xd[i:i+B]; xpi = xp[i:i+B]
        md = xdi + attn(xdi, p, seq); ad = ffn_act(md, p); od = md + ad @ p['ffn_down'].T
        asum += np.abs(ad).reshape(-1, FF).sum(0)
        if mode == 'local':
            X = ad.reshape(-1, FF); tgt = (ad @ p['ffn_down'].T).reshape(-1, D)
        else:
            mp = xpi + attn(xpi, p, seq); ap = ffn_act(mp, p); X = ap.reshape(-1, FF)
            tgt = (ap @ p['ffn_down'].T).reshape(-1, D) if mode == 'seq' else (od - mp).reshape(-1, D)
        Hs += (X.T @ X).astype(np.float64); C += (tgt.T @ X).astype(np.float64)
        xd[i:i+B] = od
        if mode != 'local': xp[i:i+B] = mp  # the FFN output is added below, once the refit is known
    wd = p['ffn_down']
    score = asum * np.linalg.norm(wd, axis=0)
    keep = np.sort(np.argsort(-score, kind='stable')[:keep_n])
    Hk = Hs[np.ix_(keep, keep)]; lam = damp * np.mean(np.diag(Hs))
    Wk = np.linalg.solve(Hk + lam * np.eye(keep_n), C[:, keep].T).T
    nd = np.zeros_like(wd); nd[:, keep] = Wk.astype(np.float32); newdown.append(nd)
    if mode != 'local':
        for i in range(0, len(mil), B):
            xp[i:i+B] = xp[i:i+B] + ffn_act(xp[i:i+B], p) @ nd.T
    print(f'layer {l} {time.time()-t0:.0f}s', file=sys.stderr, flush=True)
# held-out KL
al = tokens('alice29.txt')[:8 * 512].reshape(8, 512)
def logits(downs):
    x = emb[al].astype(np.float32)
    for l in range(L):
        p = lay[l]; x = x + attn(x, p, 512); x = x + ffn_act(x, p) @ (downs[l] if downs else p['ffn_down']).T
    return norm(x[:, 256:], onorm) @ emb.T
def lsm(z): z = z.astype(np.float64); z = z - z.max(-1, keepdims=True); return z - np.log(np.exp(z).sum(-1, keepdims=True))
lb = lsm(logits(None)); lp = lsm(logits(newdown))
kl = (np.exp(lb) * (lb - lp)).sum(-1)
print(f'{mode} ntok {ntok} damp {damp}: held-out KLD {kl.mean():.4f} top1 {np.mean(lb.argmax(-1) == lp.argmax(-1)):.3f}  ({time.time()-t0:.0f}s)')
