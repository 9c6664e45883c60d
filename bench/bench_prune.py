#!/usr/bin/env python3
"""bench_prune.py — issue 15's pruning table for `luainfer prune`.

For each kind and ranking (layers by block influence and by KLD of a
skipped block, KV groups and FFN channels by activation importance) at 10,
20 and 30% of the parameters, the default model is pruned with calibration
on tests/data/plrabn12.txt (Paradise Lost; never the evaluation text), then
scored with `luainfer perplexity` over the held-out tests/data/alice29.txt:

  the exact fraction of parameters removed, the predicted KLD (prune's own,
  on the calibration text), perplexity and mean KL divergence per scored
  token against the original's distributions (llama.cpp's --kl-divergence
  convention: --kl-base-out once, --kl-base per model), top-1 agreement, and
  decode speed as a ratio to the original's, measured side by side
  alternating the two (ROUNDS rounds each, best of each), so a slow spell of
  a shared machine falls on both alike.

With three KV groups per layer (SmolLM2-135M), whole groups come in steps of
6.6% of the parameters and at most two of three can go: the heads rows are
--keep 2 and --keep 1 (6.6%, 13.2%), 20% and 30% are out of reach.

--heal STEPS heals every pruned file with `luainfer distill` against the
original (one recipe for every row: every parameter trains, STEPS steps of
one 256-token window, AdamW 3e-4 with a cosine schedule and 10% warmup, the
seed's loss at alpha 0.9 and T 1, on STEPS x 256 tokens the original samples
itself, --seed 1, so every row trains on the same tokens), writes it
--heal-dtype (distill --dtype: f16 by default, `source` keeps each matrix
in the pruned file's type; --heal-qat trains through that rounding) and
scores the healed file the same way; without it the column says "not run".

The refit and OBS rows calibrate on --refit-samples windows of 256 tokens
(the refit's X^T X is n_ff wide and wants thousands of rows); the others on
--samples windows of 128.

  .venv/bin/python bench/bench_prune.py [--chunks N] [--samples N] [--refit-samples N] [--rounds N]
         [--heal STEPS] [--heal-dtype f16|source|...] [--heal-qat] [--only layers-bi,heads-act,...] [--docs] [--rows LOG]

Each finished row is printed to stderr as one JSON line; --rows LOG renders
such lines again (an interrupted run's rows) without measuring. --docs replaces the table between the bench_prune markers of
docs/benchmarks.md; otherwise the Markdown is printed."""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import results  # bench/results.py: --json, --plot, progress

ROOT = Path(__file__).resolve().parents[1]
CALIB = ROOT / "tests" / "data" / "plrabn12.txt"
HELD_OUT = ROOT / "tests" / "data" / "alice29.txt"
PROMPT = "Once upon a time, in a small village by the sea,"

# name -> list of (label, prune arguments)
CONFIGS = {
    "layers-bi": [(f"{p}%", ["--what", "layers", "--rank", "bi", "--ratio", str(p / 100)]) for p in (10, 20, 30)],
    "layers-kld": [(f"{p}%", ["--what", "layers", "--rank", "kld", "--ratio", str(p / 100)]) for p in (10, 20, 30)],
    "heads-act": [("keep 2 of 3", ["--what", "heads", "--keep", "2"]), ("keep 1 of 3", ["--what", "heads", "--keep", "1"])],
    "heads-kld": [(f"keep {k} of 3", ["--what", "heads", "--rank", "kld", "--keep", str(k)]) for k in (2, 1)],
    "ffn-act": [(f"{p}%", ["--what", "ffn", "--ratio", str(p / 100)]) for p in (10, 20, 30)],
    # least-squares refit of o_proj / down_proj (prune_obs.c); it wants more calibration tokens than the
    # rankings do (--samples: the refit's X^T X is n_ff wide)
    "heads-refit": [(f"keep {k} of 3", ["--what", "heads", "--refit", "--keep", str(k)]) for k in (2, 1)],
    "heads-obs": [(f"keep {k} of 3", ["--what", "heads", "--rank", "obs", "--keep", str(k)]) for k in (2, 1)],
    "ffn-refit": [(f"{p}%", ["--what", "ffn", "--refit", "--ratio", str(p / 100)]) for p in (10, 20, 30)],
    "ffn-obs": [(f"{p}%", ["--what", "ffn", "--rank", "obs", "--ratio", str(p / 100)]) for p in (10, 20, 30)],
    # each block's width from its refit error curve (prune_alloc.c)
    "ffn-alloc": [(f"{p}%", ["--what", "ffn", "--refit", "--ffn-alloc", "error", "--ratio", str(p / 100)])
                  for p in (10, 20, 30)],
}


def run(binary, args, env=None):
    r = subprocess.run([str(binary)] + [str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"luainfer {' '.join(map(str, args))[:200]} failed:\n{r.stderr[-2000:]}")
    return r


def ppl(binary, model, chunks, ctx, kl_arg):
    return json.loads(run(binary, ["perplexity", "--model", model, "--file", HELD_OUT, "--chunks", chunks, "--ctx", ctx,
                                   "--json", *kl_arg]).stdout)


def is_refit(args):
    return "--refit" in args or "obs" in args


def heal(binary, teacher, student, out, steps, dtype, qat):
    """the one healing recipe of every row (the module docstring)"""
    run(binary, ["distill", "--teacher", teacher, "--student", student, "--self-generate", steps * 256 + 1,
                 "--steps", steps, "--seq-len", 256, "--train", "all", "--lr", "3e-4", "--lr-schedule", "cosine",
                 "--warmup", max(1, steps // 10), "--alpha", "0.9", "--temperature", "1", "--dtype", dtype,
                 "--seed", 1, *(["--qat"] if qat else []), out])


def decode_tps(binary, model, tokens):
    j = json.loads(run(binary, ["generate", "--model", model, "--prompt", PROMPT, "--max-tokens", tokens,
                                "--temperature", "0", "--json"]).stdout)
    return j["timings"]["decode_tokens_per_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.environ.get("LUAINFER_BIN", ROOT / "build" / "luainfer"))
    ap.add_argument("--model", default=os.environ.get("LUAINFER_MODEL",
                                                      ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--chunks", type=int, default=2, help="perplexity chunks of --ctx tokens (default 2)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--samples", type=int, default=2, help="calibration windows of 128 tokens (default 2)")
    ap.add_argument("--refit-samples", type=int, default=32,
                    help="calibration windows of 256 tokens for the refit and OBS rows (default 32)")
    ap.add_argument("--heal", type=int, default=0, metavar="STEPS",
                    help="heal every pruned file by distillation, STEPS steps of 256 tokens (default 0: not run)")
    ap.add_argument("--heal-dtype", default="f16",
                    help="the healed file's matrices (distill --dtype; default f16; source keeps the pruned file's types)")
    ap.add_argument("--heal-qat", action="store_true", help="heal through --heal-dtype's rounding (distill --qat)")
    ap.add_argument("--rounds", type=int, default=2, help="decode rounds per model, alternating (default 2)")
    ap.add_argument("--tokens", type=int, default=48, help="decoded tokens per round (default 48)")
    ap.add_argument("--only", default="", help="comma-separated config names: " + ", ".join(CONFIGS))
    ap.add_argument("--docs", action="store_true", help="write the table into docs/benchmarks.md")
    ap.add_argument("--rows", help="render the JSON lines of an earlier run's stderr instead of measuring")
    results.add_options(ap)
    a = ap.parse_args()
    names = [n for n in a.only.split(",") if n] or list(CONFIGS)
    rows = []
    if a.rows:
        rows = [json.loads(line) for line in Path(a.rows).read_text().splitlines() if line.startswith("{")]
        head = rows.pop(0) if rows and "base_ppl" in rows[0] else None
    else:
        with tempfile.TemporaryDirectory() as d:
            base = Path(d) / "base.kld"
            b = ppl(a.bin, a.model, a.chunks, a.ctx, ["--kl-base-out", base])
            head = {"base_ppl": b["perplexity"], "n_scored": b["n_scored"], "chunks": a.chunks, "ctx": a.ctx,
                    "samples": a.samples, "refit_samples": a.refit_samples, "heal": a.heal,
                    "heal_dtype": a.heal_dtype + (" (--qat)" if a.heal_qat else "")}
            print(json.dumps(head), file=sys.stderr)
            progress = results.Progress(sum(len(CONFIGS[n]) for n in names), "prune configs")
            for name in names:
                for label, args in CONFIGS[name]:
                    out = Path(d) / "pruned.gguf"
                    cal = ["--samples", a.refit_samples, "--seq-len", 256] if is_refit(args) else \
                        ["--samples", a.samples, "--seq-len", 128]
                    r = run(a.bin, ["prune", *args, "--calib", CALIB, *cal, "--json", a.model, out])
                    pj = json.loads(r.stdout)
                    q = ppl(a.bin, out, a.chunks, a.ctx, ["--kl-base", base])
                    orig, mine = [], []
                    for _ in range(a.rounds):  # alternating, best of each
                        orig.append(decode_tps(a.bin, a.model, a.tokens))
                        mine.append(decode_tps(a.bin, out, a.tokens))
                    rows.append({"config": name, "label": label, "fraction": pj["fraction"],
                                 "predicted": pj["predicted"]["kld_mean"], "ppl": q["perplexity"],
                                 "kl": q["kl_mean"], "kl_p99": q["kl_p99"], "top1": q["top1_agree"],
                                 "speed": max(mine) / max(orig)})
                    if a.heal:
                        healed = Path(d) / "healed.gguf"
                        heal(a.bin, a.model, out, healed, a.heal, a.heal_dtype, a.heal_qat)
                        h = ppl(a.bin, healed, a.chunks, a.ctx, ["--kl-base", base])
                        rows[-1].update(heal_kl=h["kl_mean"], heal_ppl=h["perplexity"], heal_top1=h["top1_agree"])
                        healed.unlink()
                    print(json.dumps(rows[-1]), file=sys.stderr)
                    out.unlink()
                    progress.step()
            progress.done()
    lines = []
    if head:
        lines += [f"Original: perplexity {head['base_ppl']:.3f} on {head['n_scored']} scored tokens of alice29.txt "
                  f"({head['chunks']} chunks of {head['ctx']}); calibration {head['samples']} x 128 tokens of "
                  f"plrabn12.txt ({head.get('refit_samples', 32)} x 256 for the refit and OBS rows); healing: "
                  + (f"{head['heal']} steps of 256 self-generated tokens, every parameter, written "
                     f"{head.get('heal_dtype', 'f16')}." if head.get("heal")
                     else "not run."), ""]
    lines += ["| kind / ranking | target | removed | predicted KLD (calib) | PPL | mean KLD | KLD p99 | top-1 | "
              "decode speed | after healing: mean KLD (PPL, top-1) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['label']} | {100 * r['fraction']:.2f}% | {r['predicted']:.4f} | "
                     f"{r['ppl']:.2f} | {r['kl']:.4f} | {r['kl_p99']:.3f} | {100 * r['top1']:.1f}% | "
                     f"{r['speed']:.2f}x | " + (f"{r['heal_kl']:.4f} ({r['heal_ppl']:.2f}, {100 * r['heal_top1']:.1f}%)"
                                               if "heal_kl" in r else "not run") + " |")
    table = "\n".join(lines)
    if a.docs:
        p = ROOT / "docs" / "benchmarks.md"
        s = p.read_text()
        begin, end = "<!-- bench_prune:begin -->", "<!-- bench_prune:end -->"
        i, j = s.index(begin) + len(begin), s.index(end)
        p.write_text(s[:i] + "\n" + table + "\n" + s[j:])
    print(table)
    results.finish(a, {"bench": "prune", "head": head,
                       "rows": [dict(r, name=f"{r['config']} {r['label']}") for r in rows],
                       "chart": {"label": "name", "values": ["kl", "heal_kl"] if any("heal_kl" in r for r in rows)
                                 else ["kl"], "log": True,
                                 "ylabel": "mean KL divergence vs the original (held-out)",
                                 "title": "luainfer prune: KLD by kind, ranking and amount removed"}})


if __name__ == "__main__":
    main()
