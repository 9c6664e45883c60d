#!/usr/bin/env python3
"""bench_builds.py — two luainfer builds side by side: is the new one as fast?

Each build runs its own source tree's bench/bench_cpu.lua, from that tree:

    OLD run bench/bench_cpu.lua PREFILL DECODE SEQS...     (cwd: --old-src)
    NEW run bench/bench_cpu.lua PREFILL DECODE SEQS...     (cwd: --new-src)

in one session, alternating R rounds; the order flips every round (old,
new, then new, old, ...) so a slow drift of the machine weighs on both
alike. Both load the same model file (LUAINFER_MODEL) with the same thread
count and kernels. bench_cpu.lua measures, in tokens/s:

  prefill   one PREFILL-token prompt (one forward pass)
  decode    one sequence decoding DECODE tokens (greedy)
  batchedN  N sequences decoding DECODE tokens each in lockstep

The table gives each side's median over rounds and the median of the
per-round new/old ratios (the two runs of a round share the machine's
state, so that column is the one to read), and whether it lies within
±TOLERANCE% (issue 13: "each within ±3%"). --strict exits 1 when one does
not.

Usage (from a repository root; the previous commit built in /work/main):
    .venv/bin/python bench/bench_builds.py --old /work/main/build/luainfer \\
        --new build/luainfer [--rounds 5] [--threads 2]
        [--prefill 512] [--decode 128] [--seqs 8 32] [--isa auto]
        [--old-src DIR] [--new-src DIR] [--model PATH] [--tolerance 3]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys

import results  # bench/results.py: --json, --plot, progress

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def source_of(binary):
    """A binary's source tree: the parent of its build folder."""
    return os.path.dirname(os.path.dirname(os.path.abspath(binary)))


def commit_of(src):
    r = subprocess.run(["git", "-C", src, "log", "-1", "--format=%h %s"], capture_output=True, text=True)
    return r.stdout.strip()[:72] if r.returncode == 0 else "(not a git tree)"


def run_bench(binary, src, args):
    """One bench_cpu.lua run: {name: tokens/s} from its RESULT lines."""
    script = os.path.join(src, "bench", "bench_cpu.lua")
    cmd = [binary, "run", script, str(args.prefill), str(args.decode)] + [str(s) for s in args.seqs]
    env = dict(os.environ, LUAINFER_THREADS=str(args.threads), LUAINFER_ISA=args.isa, LUAINFER_MODEL=args.model)
    r = subprocess.run(cmd, cwd=src, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
    res = {m.group(1): float(m.group(2)) for m in re.finditer(r"^RESULT (\S+) (\S+)$", r.stdout, re.M)}
    want = ["prefill", "decode"] + [f"batched{s}" for s in args.seqs]
    if sorted(res) != sorted(want):
        sys.exit(f"{binary}: expected RESULT lines for {want}, got {sorted(res)}:\n{r.stdout[-2000:]}")
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="the previous build's luainfer binary")
    ap.add_argument("--new", required=True, help="the new build's luainfer binary")
    ap.add_argument("--old-src", help="the old binary's source tree (default: the binary's ../..)")
    ap.add_argument("--new-src", help="the new binary's source tree (default: the binary's ../..)")
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"),
                    help="the GGUF both load (LUAINFER_MODEL)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--seqs", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--isa", default="auto", help="the CPU kernels of both (ggml: llama.cpp's arithmetic)")
    ap.add_argument("--tolerance", type=float, default=3.0, help="percent a ratio may stray from 1")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a ratio is outside the tolerance")
    results.add_options(ap)
    args = ap.parse_args()
    if args.rounds < 1 or args.threads < 1 or args.prefill < 1 or args.decode < 1 or min(args.seqs) < 1:
        ap.error("--rounds, --threads, --prefill, --decode and --seqs must be positive")
    sides = {}
    for name in ("old", "new"):
        binary = os.path.abspath(getattr(args, name))
        src = os.path.abspath(getattr(args, f"{name}_src") or source_of(binary))
        if not os.access(binary, os.X_OK):
            ap.error(f"--{name}: {binary} is not an executable")
        if not os.path.isfile(os.path.join(src, "bench", "bench_cpu.lua")):
            ap.error(f"--{name}-src: {src} has no bench/bench_cpu.lua")
        sides[name] = (binary, src)
    if not os.path.isfile(args.model):
        ap.error(f"--model: {args.model} not found")

    print(f"model: {args.model} ({os.path.getsize(args.model) / 1e6:.1f} MB), {args.threads} threads, "
          f"isa {args.isa}, {args.rounds} rounds alternating (the order flips every round)")
    for name, (binary, src) in sides.items():
        print(f"{name}: {binary} (source {src}: {commit_of(src)})")
    names = ["prefill", "decode"] + [f"batched{s}" for s in args.seqs]
    got = {"old": {n: [] for n in names}, "new": {n: [] for n in names}}
    progress = results.Progress(2 * args.rounds, "builds runs")
    for rnd in range(args.rounds):
        for name in ("old", "new") if rnd % 2 == 0 else ("new", "old"):
            res = run_bench(*sides[name], args)
            for n in names:
                got[name][n].append(res[n])
            progress.step()
        print(f"round {rnd + 1}: " + ", ".join(f"{n} {got['old'][n][-1]:.1f} -> {got['new'][n][-1]:.1f}"
                                               for n in names), flush=True)

    progress.done()
    labels = {"prefill": f"prefill, {args.prefill}-token prompt",
              "decode": f"decode, 1 sequence x {args.decode} tokens"}
    for s in args.seqs:
        labels[f"batched{s}"] = f"batched decode, {s} sequences x {args.decode} tokens"
    print()
    print(f"| measurement (tokens/s) | old median | new median | new/old (median of round ratios) "
          f"| within ±{args.tolerance:g}% |")
    print("| --- | ---: | ---: | ---: | --- |")
    outside = []
    for n in names:
        a, b = statistics.median(got["old"][n]), statistics.median(got["new"][n])
        rr = statistics.median(y / x for x, y in zip(got["old"][n], got["new"][n]))
        ok = abs(rr - 1) * 100 <= args.tolerance
        if not ok:
            outside.append(n)
        print(f"| {labels[n]} | {a:.1f} | {b:.1f} | {rr:.3f} | {'yes' if ok else 'no'} |")
    ratio = {n: statistics.median(y / x for x, y in zip(got["old"][n], got["new"][n])) for n in names}
    results.finish(args, {
        "bench": "builds", "rounds": args.rounds, "threads": args.threads, "isa": args.isa,
        "old": got["old"], "new": got["new"], "tolerance_pct": args.tolerance, "outside": outside, "ratio": ratio,
        "rows": [{"name": n, "new_over_old": ratio[n]} for n in names],
        "chart": {"label": "name", "values": ["new_over_old"], "ylabel": "new / old (median of round ratios)",
                  "title": f"old build vs new, {args.rounds} rounds alternating"}})
    print()
    print("all within the tolerance" if not outside else f"outside the tolerance: {', '.join(outside)}")
    return 1 if outside and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
