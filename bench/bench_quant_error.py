#!/usr/bin/env python3
"""bench_quant_error.py — where W8A8's and FP8's error comes from, per weight.

For every linear weight of a model (the F16 baseline of bench_quant.py), in
float64 NumPy, the normalised mean squared error ||Q(W) - W||^2 / ||W||^2 of

  int8  per output channel, s = amax / 127, round half to even (w8a8's weights)
  e4m3  per output channel, s = amax / 448, round to nearest even (fp8's weights)
  e4m3  per tensor, s = amax / 448

and the same for activations, per token (int8 s = amax/127; e4m3 s =
amax/448), on rows drawn to look like this model's: Gaussian channels whose
scales follow the calibration's spread (a few channels ~K times the median;
K = 30, 300 and 3000, the last about what luainfer quantize's calibration
reports for down_proj's input). Floating point's error is relative, so E4M3
is nearly scale-free (3 mantissa bits: ~1e-3), while int8's depends on how
far a value sits below the row's max.

  .venv/bin/python bench/bench_quant_error.py F16.gguf [--json FILE] [--plot FILE]

Prints Markdown tables (docs/benchmarks.md, "Quantization error sources").
"""
import argparse
import sys

import numpy as np
from gguf import GGUFReader

import results  # bench/results.py: --json, --plot, progress


def e4m3(v):
    """v (already divided by its scale, |v| <= 448) rounded to E4M3: 3
    mantissa bits, exponents down to -6, subnormal steps of 2^-9."""
    a = np.abs(v)
    e = np.floor(np.log2(np.maximum(a, 2.0 ** -9)))
    e = np.maximum(e, -6)
    step = 2.0 ** (e - 3)
    return np.sign(v) * np.minimum(np.round(a / step) * step, 448.0)


def q_int8(w, axis):
    s = np.abs(w).max(axis=axis, keepdims=True) / 127.0
    s[s == 0] = 1
    return np.clip(np.round(w / s), -127, 127) * s


def q_e4m3(w, axis):
    s = np.abs(w).max(axis=axis, keepdims=True) / 448.0
    s[s == 0] = 1
    return e4m3(w / s) * s


def nmse(q, w):
    return float(((q - w) ** 2).sum() / (w ** 2).sum())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="an F16 GGUF (bench_quant.py's baseline: luainfer quantize --method f16)")
    results.add_options(ap)
    a = ap.parse_args()
    r = GGUFReader(a.model)
    kinds = {}
    weights = [t for t in r.tensors if t.name.startswith("blk.") and len(t.shape) == 2]
    if not weights:
        sys.exit(f"bench_quant_error: {a.model} has no blk.* weight matrices")
    progress = results.Progress(len(weights), "weights")
    for t in weights:
        progress.step()
        if t.tensor_type != 1:  # GGMLQuantizationType.F16
            sys.exit(f"bench_quant_error: {t.name} is not F16 (make the baseline with luainfer quantize --method f16)")
        w = np.asarray(t.data).view(np.float16).astype(np.float64).reshape(int(t.shape[1]), int(t.shape[0]))
        k = t.name.split(".")[2]
        row = (nmse(q_int8(w, 1), w), nmse(q_e4m3(w, 1), w), nmse(q_e4m3(w, None), w))
        kinds.setdefault(k, []).append(row)
    progress.done()
    out = {"bench": "quant_error", "rows": [], "activations": []}
    print("weights: NMSE, mean over the layers")
    print()
    print("| weight | int8 per channel | e4m3 per channel | e4m3 per tensor | e4m3 / int8 |")
    print("|---|---:|---:|---:|---:|")
    for k, rows in kinds.items():
        m = np.mean(rows, axis=0)
        print(f"| {k} | {m[0]:.2e} | {m[1]:.2e} | {m[2]:.2e} | {m[1] / m[0]:.1f}x |")
        out["rows"].append({"name": k, "int8 per channel": m[0], "e4m3 per channel": m[1], "e4m3 per tensor": m[2]})
    rng = np.random.default_rng(0)
    print()
    print("activations (per token; 512 rows of 1536 channels, 4 channels K x the others' scale): NMSE")
    print()
    print("(whole rows, dominated by the large channels; and the median channel's own NMSE, what the")
    print("weights reading the ordinary channels see)")
    print()
    print("| K | int8 | e4m3 | int8, median channel | e4m3, median channel |")
    print("|---:|---:|---:|---:|---:|")

    def med(q, x):
        return float(np.median(((q - x) ** 2).sum(0) / (x ** 2).sum(0)))
    for K in (1, 30, 300, 3000):
        sc = np.exp(rng.normal(0, 0.5, 1536))
        sc[:4] *= K
        x = rng.normal(0, 1, (512, 1536)) * sc
        qi, qe = q_int8(x, 1), q_e4m3(x, 1)
        print(f"| {K} | {nmse(qi, x):.2e} | {nmse(qe, x):.2e} | {med(qi, x):.2e} | {med(qe, x):.2e} |")
        out["activations"].append({"K": K, "int8": nmse(qi, x), "e4m3": nmse(qe, x), "int8_median_channel": med(qi, x),
                                   "e4m3_median_channel": med(qe, x)})
    out["chart"] = {"label": "name", "values": ["int8 per channel", "e4m3 per channel", "e4m3 per tensor"], "log": True,
                    "ylabel": "weight NMSE (mean over the layers)", "title": "quantization error per weight kind"}
    results.finish(a, out)


if __name__ == "__main__":
    main()
