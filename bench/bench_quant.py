#!/usr/bin/env python3
"""bench_quant.py — issue 14's quality and speed tables for `luainfer quantize`.

Every method starts from the same baseline: the default Q4_1 model expanded
to F16 (`--method f16`). For each method the model is quantized from that
baseline, then scored with `luainfer perplexity` over the held-out text:

  PPL and its change vs the baseline, mean KL divergence per scored token vs
  the baseline's distribution (llama.cpp's --kl-divergence convention: the
  baseline's log-probabilities saved once with --kl-base-out, every method
  read against them with --kl-base) and its 99th percentile, top-1
  agreement, file size and bits per weight (luainfer info).

Calibration (w8a8, awq, gptq) reads a different work (tests/data/plrabn12.txt,
Paradise Lost) from the evaluation text: by default tests/data/alice29.txt
(Alice) followed by tests/data/asyoulik.txt (As You Like It), joined by a
blank line into one text (--eval FILE, repeatable, names others). The speed
table runs bench/bench_quant_speed.lua for the baseline, Q4_1 and each method,
ROUNDS rounds alternating the models (a slow spell of a shared machine then
falls on every model alike), keeping each one's best; peak RSS is each
child's own (os.wait4).

  .venv/bin/python bench/bench_quant.py [--chunks N] [--methods a,b,...]
         [--speed] [--plot bpw_kl.png] [--json out.json]

`gptq-ao-rot-heal` (`w4a4-rot-gptq-heal`) is `gptq-ao-rot`'s (`w4a4-rot-gptq`'s)
file healed by `luainfer distill`
(HEAL_ARGS: 40 steps on 10,241 tokens the baseline samples, only the RMSNorm
weights train, written in the file's own scheme), so no held-out text is
seen in training either; `gptq-ao-rot-scales` (`w4a4-rot-gptq-scales`) the
same with the group scales trained too (`--train scales+norms`), `fp8-gptq-scales`
`fp8-gptq`'s per-row scales alone (`--train scales`).

--chunks 0 scores the whole text. A run prints the tables as Markdown
(docs/benchmarks.md has one). With --work DIR --reuse a run can be stopped
and resumed: quantized models and each model's scores (keyed by the model
file's size and mtime, the evaluation text's hash and the options that
change a score) are kept in DIR and reused."""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import results  # bench/results.py: --json, --plot, progress

ROOT = Path(__file__).resolve().parents[1]

# name -> (quantize arguments, calibration: False, "w8" (SmoothQuant's
# statistics; with --gptq also X^T X, over the same --samples windows) or "q4"
# (GPTQ's / AWQ's X^T X, --q4-samples windows)).
# The 4-bit methods use group 64: 128 does not divide SmolLM2's 576-wide
# rows (luainfer quantize refuses it).
METHODS = {
    "q8_0": (["--method", "q8_0"], False),
    "q4_0": (["--method", "q4_0"], False),
    "q4_1": (["--method", "q4_1"], False),
    "w8a8": (["--method", "w8a8", "--alpha", "0.5", "--smooth", "all"], "w8"),
    "w8a8-norm": (["--method", "w8a8", "--alpha", "0.5", "--smooth", "norm"], "w8"),
    "w8a8-a0": (["--method", "w8a8", "--alpha", "0"], False),
    "w8a8-a0.8": (["--method", "w8a8", "--alpha", "0.8", "--smooth", "all"], "w8"),
    "fp8": (["--method", "fp8"], False),
    "fp8-sq": (["--method", "fp8", "--alpha", "0.5", "--smooth", "all"], "w8"),  # SmoothQuant before FP8
    "w8a8-gptq": (["--method", "w8a8", "--alpha", "0.5", "--smooth", "all", "--gptq"], "w8"),  # SmoothQuant + GPTQ
    "w8a8-as": (["--method", "w8a8", "--alpha-search", "--smooth", "all"], "w8"),  # alpha per layer and site
    "w8a8-as-gptq": (["--method", "w8a8", "--alpha-search", "--smooth", "all", "--gptq"], "w8"),
    "fp8-gptq": (["--method", "fp8", "--smooth", "none", "--gptq"], "w8"),  # GPTQ alone (fp8 + --calib would smooth)
    # QuaRot-style rotation (docs/quant_rotation.md): norms folded, Hadamard Q, online H_128 before down_proj
    "w8a8-rot": (["--method", "w8a8", "--rotate", "--smooth", "none", "--gptq"], "w8"),
    "w8a8-rot-rtn": (["--method", "w8a8", "--rotate", "--smooth", "none"], False),
    "rtn4": (["--method", "rtn4", "--group", "64"], False),
    "awq": (["--method", "awq", "--group", "64"], "q4"),
    "gptq": (["--method", "gptq", "--group", "64"], "q4"),
    "gptq-ao": (["--method", "gptq", "--group", "64", "--act-order"], "q4"),
    "w4a4": (["--method", "w4a4"], False),
    # the same rotation before the 4-bit methods: GPTQ calibrates on the rotated model
    "gptq-ao-rot": (["--method", "gptq", "--group", "64", "--act-order", "--rotate"], "q4"),
    # GPTQ's own order: each block calibrated through the blocks quantized below it (a pass per block: slow)
    "gptq-ao-seq": (["--method", "gptq", "--group", "64", "--act-order", "--sequential"], "q4"),
    "w4a4-rot": (["--method", "w4a4", "--rotate"], False),
    "w4a4-rot-gptq": (["--method", "w4a4", "--rotate", "--gptq"], "q4"),  # QuaRot's W4A4 recipe
}
# a method's file healed in its own format by distillation on the teacher's (the baseline's) own samples, the
# codes kept: -heal trains only the RMSNorm weights (docs/training.md, "Scheme files and rotated models"),
# -scales the group scales (EfficientQAT's end-to-end stage; "Trained scales")
# (the rates and alphas: each the best of a sweep on 8 chunks, docs/benchmarks.md "Session 40")
NORMS = ["--train", "norms", "--lr", "1e-3", "--alpha", "0.9"]
HEAL = {"gptq-ao-rot-heal": ("gptq-ao-rot", NORMS), "w4a4-rot-gptq-heal": ("w4a4-rot-gptq", NORMS),
        "gptq-ao-rot-scales": ("gptq-ao-rot", ["--train", "scales+norms", "--lr", "3e-4", "--alpha", "1"]),
        "w4a4-rot-gptq-scales": ("w4a4-rot-gptq", ["--train", "scales+norms", "--lr", "1e-3", "--alpha", "0.9"]),
        "fp8-gptq-scales": ("fp8-gptq", ["--train", "scales", "--lr", "3e-4", "--alpha", "1"])}
HEAL_ARGS = ["--self-generate", "10241", "--steps", "40", "--seq-len", "256", "--lr-schedule", "cosine", "--warmup",
             "4", "--temperature", "1", "--dtype", "source", "--seed", "1"]
METHODS.update({h: METHODS[m] for h, (m, _) in HEAL.items()})
# also scored with --q4-act int8 (A8)
Q4 = ("rtn4", "awq", "gptq", "gptq-ao", "gptq-ao-seq", "gptq-ao-rot", "gptq-ao-rot-heal", "gptq-ao-rot-scales")
DEFAULT = ("q8_0,q4_0,q4_1,w8a8,w8a8-norm,w8a8-a0,w8a8-a0.8,w8a8-gptq,w8a8-as,w8a8-as-gptq,fp8,fp8-sq,fp8-gptq,"
           "rtn4,awq,gptq,gptq-ao,gptq-ao-rot,w4a4,w4a4-rot,w4a4-rot-gptq")


def run(cmd, env=None, timeout=7200):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=timeout)
    if r.returncode != 0:
        sys.exit(f"bench_quant: {' '.join(map(str, cmd))} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return r.stdout


def run_rss(cmd, env=None):
    """stdout and the child's own rusage (its peak RSS: ru_maxrss, KiB)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen([str(c) for c in cmd], stdout=out, stderr=err, text=True, env=env)
        _, status, ru = os.wait4(p.pid, 0)  # reaped here, not by Popen: this child's own rusage
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if p.returncode != 0:
            sys.exit(f"bench_quant: {' '.join(map(str, cmd))} failed:\n{err.read()[-2000:]}")
        return out.read(), ru


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.environ.get("LUAINFER_BIN", ROOT / "build" / "luainfer"))
    ap.add_argument("--model", default=os.environ.get("LUAINFER_MODEL", ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--eval", action="append", type=Path,
                    help="held-out text (repeatable; default: alice29.txt then asyoulik.txt)")
    ap.add_argument("--calib", default=ROOT / "tests" / "data" / "plrabn12.txt")
    ap.add_argument("--samples", type=int, default=32, help="calibration windows for w8a8")
    ap.add_argument("--q4-samples", type=int, default=32,
                    help="calibration windows for awq / gptq (4 overfit: GPTQ then loses to RTN4 on held-out text)")
    ap.add_argument("--no-a8", action="store_true", help="skip the A8 (--q4-act int8) rows of the 4-bit methods")
    ap.add_argument("--reuse", action="store_true",
                    help="keep a quantized model already in --work (made with the same options) instead of redoing it")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=0, help="chunks scored (0: the whole text)")
    ap.add_argument("--methods", default=DEFAULT)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--speed", action="store_true", help="also the speed table")
    ap.add_argument("--speed-steps", type=int, default=16)
    ap.add_argument("--speed-methods", help="methods in the speed table (default: all of --methods)")
    ap.add_argument("--rounds", type=int, default=2)
    results.add_options(ap)  # --plot: bits per weight against mean KL divergence
    ap.add_argument("--work", help="folder for the quantized models (default: a temporary one)")
    a = ap.parse_args()
    methods = [m for m in a.methods.split(",") if m]
    for m in methods:
        if m not in METHODS:
            sys.exit(f"bench_quant: unknown method {m} (known: {', '.join(METHODS)})")
    tmp = tempfile.TemporaryDirectory(prefix="bench_quant.") if not a.work else None
    work = Path(a.work or tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    threads = ["--threads", str(a.threads)] if a.threads else []
    luai = a.bin
    evals = a.eval or [ROOT / "tests" / "data" / "alice29.txt", ROOT / "tests" / "data" / "asyoulik.txt"]
    text = "\n\n".join(p.read_text().strip("\n") for p in evals) + "\n"
    eval_path = work / "eval.txt"
    eval_path.write_text(text)
    eval_key = hashlib.sha256(text.encode()).hexdigest()[:16]
    eval_name = " + ".join(p.name for p in evals)

    def info(path):
        return json.loads(run([luai, "info", path, "--json"]))

    def ppl(path, *extra):
        """luainfer perplexity's JSON; with --reuse, kept in work/ beside the
        model and reused while the model file, the text and the options agree."""
        st = Path(path).stat()
        key = json.dumps([str(path), st.st_size, int(st.st_mtime), eval_key, a.ctx, a.chunks, [str(e) for e in extra]])
        cache = work / ("score." + hashlib.sha256(key.encode()).hexdigest()[:16] + ".json")
        if a.reuse and cache.exists():
            return json.loads(cache.read_text())
        out = run([luai, "perplexity", "--model", path, "--file", eval_path, "--ctx", a.ctx,
                   "--chunks", a.chunks, "--json", *threads, *extra])
        tmp_cache = cache.with_suffix(".tmp")
        tmp_cache.write_text(out)
        tmp_cache.rename(cache)
        return json.loads(out)

    t0 = time.time()
    base = work / "f16.gguf"
    if not (a.reuse and base.exists()):
        run([luai, "quantize", "--method", "f16", a.model, base])
    kld = work / "base.kld"
    if a.reuse and not kld.exists():  # the saved scores of other models were read against another base file
        for old in work.glob("score.*.json"):
            old.unlink()
    b = ppl(base, "--kl-base-out", kld)
    rows = []
    bi = info(base)
    rows.append({"method": "f16 (baseline)", "ppl": b["perplexity"], "dppl": 0.0, "kl_mean": 0.0, "kl_p99": 0.0,
                 "top1": 1.0, "bytes": bi["file_bytes"], "bpw": bi["bits_per_weight"], "path": str(base)})
    orig = info(a.model)
    r = ppl(a.model, "--kl-base", kld)
    rows.append({"method": "q4_1 (the shipped file)", "ppl": r["perplexity"], "kl_mean": r["kl_mean"],
                 "kl_p99": r["kl_p99"], "top1": r["top1_agree"], "bytes": orig["file_bytes"],
                 "bpw": orig["bits_per_weight"], "path": str(a.model)})
    progress = results.Progress(len(methods), "quantize + score")
    for m in methods:
        args, calib = METHODS[m]
        out = work / f"{m}.gguf"
        n_cal = a.q4_samples if calib == "q4" else a.samples
        cal = ["--calib", a.calib, "--samples", n_cal, "--seq-len", a.seq_len] if calib else []
        t = time.time()
        if not (a.reuse and out.exists()):
            if m in HEAL:  # the method it heals quantized first (or kept, with --reuse)
                src = work / f"{HEAL[m][0]}.gguf"
                if not (a.reuse and src.exists()):
                    run([luai, "quantize", *args, *cal, *threads, base, src])
                run([luai, "distill", "--teacher", base, "--student", src, *HEAL_ARGS, *HEAL[m][1], *threads, out])
            else:
                run([luai, "quantize", *args, *cal, *threads, base, out])
        qs = time.time() - t
        i = info(out)
        for act in (["f32", "int8"] if m in Q4 and not a.no_a8 else [None]):
            r = ppl(out, "--kl-base", kld, *(["--q4-act", act] if act else []))
            name = m if act is None else f"{m} A16" if act == "f32" else f"{m} A8"
            rows.append({"method": name, "ppl": r["perplexity"], "kl_mean": r["kl_mean"], "kl_p99": r["kl_p99"],
                         "top1": r["top1_agree"], "bytes": i["file_bytes"], "bpw": i["bits_per_weight"],
                         "quantize_s": qs, "path": str(out)})
            print(f"  {name}: ppl {r['perplexity']:.4f}, KL {r['kl_mean']:.5f}", file=sys.stderr)
        progress.step()
    progress.done()
    for row in rows:
        row["dppl"] = 100.0 * (row["ppl"] / b["perplexity"] - 1.0)
    print(f"quality: {eval_name}, ctx {a.ctx}, "
          f"{b['n_chunks']} chunks, {b['n_scored']} scored tokens; baseline = the Q4_1 model expanded to F16; "
          f"calibration: {Path(str(a.calib)).name}, {a.samples} x {a.seq_len} tokens (w8a8), "
          f"{a.q4_samples} x {a.seq_len} (awq, gptq); 4-bit methods at group 64; the embedding (tied "
          f"output) stays q8_0 under every scheme method")
    print()
    print("| method | PPL | ΔPPL | mean KL | KL p99 | top-1 | file | bpw |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['method']} | {row['ppl']:.4f} | {row['dppl']:+.2f}% | {row['kl_mean']:.5f} | "
              f"{row['kl_p99']:.4f} | {100 * row['top1']:.2f}% | {row['bytes'] / 2**20:.1f} MiB | {row['bpw']:.2f} |")
    speed = []
    if a.speed:
        sm = a.speed_methods.split(",") if a.speed_methods else methods
        names = ["f16 (baseline)", "q4_1 (the shipped file)"]
        for m in sm:
            if m in methods:
                names += [f"{m} A16", f"{m} A8"] if m in Q4 and not a.no_a8 else [m]
        paths = {row["method"]: row["path"] for row in rows}
        best = {n: {} for n in names}
        for _ in range(a.rounds):
            for n in names:
                env = dict(os.environ, LUAINFER_MODEL=paths[n])
                act = "int8" if n.endswith(" A8") else "f32"
                out, ru = run_rss([luai, "run", ROOT / "bench" / "bench_quant_speed.lua", a.speed_steps, 1, "auto",
                                   act], env=env)
                v = json.loads(out.strip().splitlines()[-1])
                v["rss_mib"] = ru.ru_maxrss / 1024.0
                for k, x in v.items():
                    best[n][k] = min(best[n].get(k, x), x) if k == "rss_mib" else max(best[n].get(k, 0), x)
        bs = best[names[0]]
        print()
        print(f"speed (tokens/s of forward time, best of {a.rounds} alternating rounds; ratio vs the baseline)")
        print()
        print("| model | prefill 512 | decode 1 | batched 8 | batched 32 | peak RSS |")
        print("|---|---:|---:|---:|---:|---:|")
        for n in names:
            s = best[n]
            cell = lambda k: f"{s[k]:.1f} ({s[k] / bs[k]:.2f}x)"
            print(f"| {n} | {cell('prefill_512')} | {cell('decode_1')} | {cell('batched_8')} | "
                  f"{cell('batched_32')} | {s['rss_mib']:.0f} MiB |")
            speed.append({"model": n, **s})
    result = {"bench": "quant", "quality": rows, "speed": speed, "n_scored": b["n_scored"], "ctx": a.ctx,
              "seconds": time.time() - t0}
    results.finish(a, result)  # --json; --plot: tools/plot_bench.py's bits per weight against KL divergence
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
