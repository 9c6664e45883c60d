#!/usr/bin/env python3
"""bench_contention.py — decode speed at --threads 1 and 2, with and without a
busy neighbour process (issue 18, "graceful under CPU contention").

    .venv/bin/python bench/bench_contention.py [--bin NAME=PATH ...] [--rounds 3]

Each round runs, alternating, for every binary (default: old = the base
build /work/main/build/luainfer when present, new = ./build/luainfer), for
threads 1 and 2, alone and next to a busy process: a child spinning on the
last CPU (pinned, ended after the run, and after --busy-limit seconds
whatever happens). Each run is `luainfer run bench/bench_cpu.lua 64 DECODE 4`
(single-stream decode, and a batch of 4), taken from this tree so every
binary runs the same script. Prints the median of the rounds and the ratios
the issue asks about: contended 2 threads / contended 1 thread (target >= 1)
and contended 2 threads / uncontended 2 threads (target >= 0.5).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import results  # bench/results.py: --json, --plot, progress

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BUSY = r"""
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
end = time.monotonic() + float(sys.argv[2])
x = 0
while time.monotonic() < end:
    for _ in range(10000):
        x += 1
"""


def start_busy(limit):
    cpu = max(os.sched_getaffinity(0))
    return subprocess.Popen([sys.executable, "-c", BUSY, str(cpu), str(limit)])


def run_one(binary, threads, decode, busy, limit):
    env = dict(os.environ, LUAINFER_THREADS=str(threads))
    child = start_busy(limit) if busy else None
    try:
        if child:
            time.sleep(0.2)  # let it get going
        out = subprocess.run([binary, "run", os.path.join(ROOT, "bench", "bench_cpu.lua"), "64", str(decode), "4"],
                             env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    finally:
        if child:
            child.kill()
            child.wait()
    if out.returncode != 0:
        raise SystemExit(f"{binary} failed: {out.stderr[-2000:]}")
    res = dict(re.findall(r"^RESULT (\S+) (\S+)$", out.stdout, re.M))
    return float(res["decode"]), float(res["batched4"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", action="append", default=[], help="NAME=PATH (repeatable)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decode", type=int, default=96, help="tokens decoded per measurement")
    ap.add_argument("--busy-limit", type=float, default=300, help="the busy child's own time limit, seconds")
    results.add_options(ap)
    a = ap.parse_args()
    bins = [b.split("=", 1) for b in a.bin]
    if not bins:
        if os.path.exists("/work/main/build/luainfer"):
            bins.append(("old", "/work/main/build/luainfer"))
        bins.append(("new", os.path.join(ROOT, "build", "luainfer")))
    print(f"{os.cpu_count()} CPUs; busy neighbour pinned to CPU {max(os.sched_getaffinity(0))}; "
          f"load average before: {os.getloadavg()[0]:.1f}")
    res = {}
    progress = results.Progress(a.rounds * 4 * len(bins), "contention runs")
    for r in range(a.rounds):
        # alternate the order each round so drift in the machine's load spreads evenly
        cases = [(name, path, t, busy) for busy in (False, True) for name, path in bins for t in (1, 2)]
        if r % 2:
            cases.reverse()
        for name, path, t, busy in cases:
            d, b4 = run_one(path, t, a.decode, busy, a.busy_limit)
            res.setdefault((name, t, busy), []).append((d, b4))
            print(f"round {r + 1}: {name:4s} threads {t} {'busy ' if busy else 'alone'}: decode {d:7.1f} tok/s, "
                  f"batched4 {b4:7.1f} tok/s", flush=True)
            progress.step()
    progress.done()
    med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in res.items()}
    print(f"\nmedians of {a.rounds} rounds (tok/s: decode / batched4)")
    for name, _ in bins:
        for busy in (False, True):
            m1, m2 = med[(name, 1, busy)], med[(name, 2, busy)]
            print(f"  {name:4s} {'busy ' if busy else 'alone'}: threads 1 {m1[0]:7.1f} / {m1[1]:7.1f}, "
                  f"threads 2 {m2[0]:7.1f} / {m2[1]:7.1f}")
    for name, _ in bins:
        c1, c2, u2 = med[(name, 1, True)], med[(name, 2, True)], med[(name, 2, False)]
        print(f"  {name:4s}: busy 2 threads / busy 1 thread: decode {c2[0] / c1[0]:.2f}x, batched4 {c2[1] / c1[1]:.2f}x; "
              f"busy / alone at 2 threads: decode {c2[0] / u2[0]:.2f}x, batched4 {c2[1] / u2[1]:.2f}x")
    if len(bins) == 2:
        (n0, _), (n1, _) = bins
        for busy in (False, True):
            for t in (1, 2):
                o, n = med[(n0, t, busy)], med[(n1, t, busy)]
                print(f"  {n1}/{n0} threads {t} {'busy ' if busy else 'alone'}: decode {n[0] / o[0]:.2f}x, "
                      f"batched4 {n[1] / o[1]:.2f}x")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    rows = [{"name": f"{name} threads {t} {'busy' if busy else 'alone'}", "bin": name, "threads": t, "busy": busy,
             "decode_tok_s": med[(name, t, busy)][0], "batched4_tok_s": med[(name, t, busy)][1]}
            for name, _ in bins for busy in (False, True) for t in (1, 2)]
    results.finish(a, {"bench": "contention", "rounds": a.rounds, "decode": a.decode, "rows": rows,
                       "chart": {"label": "name", "values": ["decode_tok_s", "batched4_tok_s"], "ylabel": "tokens/s",
                                 "title": "decode next to a busy process (median of rounds)"}})


if __name__ == "__main__":
    main()
