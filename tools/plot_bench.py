#!/usr/bin/env python3
"""plot_bench.py — the PNG of a benchmark's results (its --plot option).

    plot_bench.py RESULTS.json OUT.png

RESULTS.json is what the benchmark writes with --json: a "bench" name and its
rows. One function per benchmark draws it with matplotlib (Agg, no display).
The PNG is written to a temporary file and renamed.
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def batching(r, ax):
    rows = sorted(r["rows"], key=lambda x: x["max_num_seqs"])
    xs = [x["max_num_seqs"] for x in rows]
    for key, label, style in (("continuous", "continuous (default.lua)", "o-"),
                              ("static", "static (static.lua)", "s--"),
                              ("static_padded", "static, padded to the batch's longest", "^:")):
        ax.plot(xs, [x[key] for x in rows], style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("batch size (max_num_seqs)")
    ax.set_ylabel("generated tokens / s")
    ax.set_title(f"continuous vs static batching: {r['n_requests']} requests, outputs {r['spread']}")
    ax.legend()


def prefix(r, ax):
    rows = r["rows"]
    if not rows:
        raise SystemExit("plot_bench.py: the prefix results have no TTFT rows (run without 'lpm')")
    n = len(rows)
    w = 0.2
    xs = range(n)
    for k, (key, label) in enumerate((("off_p50", "cache off, p50"), ("on_p50", "cache on, p50"),
                                      ("off_p90", "cache off, p90"), ("on_p90", "cache on, p90"))):
        ax.bar([x + (k - 1.5) * w for x in xs], [row[key] for row in rows], w, label=label)
    ax.set_xticks(list(xs), [row["scenario"] for row in rows], rotation=15)
    ax.set_ylabel("time to first token (ms)")
    ax.set_title(f"prefix caching: TTFT per scenario ({r['n_requests']} requests each)")
    ax.legend()


def step_cost(r, ax):
    rows = sorted(r["rows"], key=lambda x: x["n"])
    ax.plot([x["n"] for x in rows], [x["ms_per_step"] for x in rows], "o-", label="ms per decode step")
    ax.set_xlabel("running sequences")
    ax.set_ylabel("ms per step")
    ax.set_title("decode step cost vs batch")
    ax.legend()


def kv_dtype(r, ax):
    rows = r["rows"]
    ax.bar([f"{x['dtype']}\n{x['workload']}" for x in rows], [x["tput"] for x in rows])
    ax.set_ylabel("generated tokens / s")
    ax.set_title(f"KV cache dtypes: tight ({r['budget_mib']:.0f} MiB) and ample budgets, "
                 f"{r['n_requests']} requests x {r['output_tokens']} tokens")


PLOTS = {"batching": batching, "prefix": prefix, "step_cost": step_cost, "kv_dtype": kv_dtype}


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        r = json.load(f)
    name = r.get("bench")
    if name not in PLOTS:
        print(f"plot_bench.py: no plot for benchmark {name!r} (known: {', '.join(sorted(PLOTS))})", file=sys.stderr)
        return 2
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=100)
    PLOTS[name](r, ax)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = argv[2]
    tmp = f"{out}.tmp.{os.getpid()}.png"
    fig.savefig(tmp)
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
