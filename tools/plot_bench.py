#!/usr/bin/env python3
"""plot_bench.py — the PNG of a benchmark's results (its --plot option).

    plot_bench.py RESULTS.json OUT.png

RESULTS.json is what the benchmark writes with --json: a "bench" name and its
rows. One function per benchmark draws it with matplotlib (Agg, no display);
a benchmark without its own function describes a bar chart of its rows in
the results instead:

    "chart": {"label": FIELD, "values": [FIELD, ...], "ylabel": TEXT,
              "title": TEXT, "log": false}

one group of bars per row (named by its `label` field), one bar per `values`
field. The PNG is written to a temporary file and renamed.
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


def spec(r, ax):
    """Speedup over speculation off: a group of bars per workload and batch
    (and temperature, in the proposers mode), a bar per setting."""
    rows = r["rows"]
    if not rows:
        raise SystemExit("plot_bench.py: the spec results have no rows")
    groups, settings = [], []
    for row in rows:
        g = (row["workload"], row["seqs"], row["temperature"])
        if g not in groups:
            groups.append(g)
        if row["setting"] not in settings:
            settings.append(row["setting"])
    ratio = {((row["workload"], row["seqs"], row["temperature"]), row["setting"]): row["ratio"] for row in rows}
    w = 0.8 / len(settings)
    for k, name in enumerate(settings):
        ax.bar([x + (k - (len(settings) - 1) / 2) * w for x in range(len(groups))],
               [ratio.get((g, name), 0) for g in groups], w, label=name)
    ax.axhline(1.0, color="k", lw=0.8)
    show_t = len({g[2] for g in groups}) > 1
    ax.set_xticks(list(range(len(groups))),
                  [f"{wl}\nbatch {b}" + (f", T {t:g}" if show_t else "") for wl, b, t in groups], fontsize=8)
    ax.set_ylabel("tok/s over speculation off")
    ax.set_title(f"speculative decoding ({r['mode']}): {r['max_tokens']} tokens per request, "
                 f"best of {r['rounds']} rounds")
    ax.legend(fontsize=8)


def replay(r, fig):
    """Two panels: TTFT percentiles per policy (at the highest load run) and
    goodput against load (rate scale) per policy."""
    ax1, ax2 = fig.subplots(1, 2)
    runs = r["runs"]
    top = max(x["rate_scale"] for x in runs)
    for x in (x for x in runs if x["rate_scale"] == top):
        t = sorted(x["ttft_ms"])
        ax1.plot([100 * (i + 1) / len(t) for i in range(len(t))], [v / 1e3 for v in t], label=x["policy"])
    ax1.set_xlabel("percentile of requests")
    ax1.set_ylabel("TTFT (s)")
    ax1.set_title(f"TTFT percentiles at rate scale {top:g}")
    ax1.legend()
    for name in dict.fromkeys(x["policy"] for x in runs):
        pts = sorted((x["rate_scale"], x["goodput"]) for x in runs if x["policy"] == name)
        ax2.plot([a for a, _ in pts], [100 * b for _, b in pts], "o-", label=name)
    ax2.set_xlabel("load (rate scale)")
    ax2.set_ylabel("goodput (% of requests within SLO)")
    ax2.set_ylim(-5, 105)
    ax2.set_title("goodput against load")
    ax2.legend()
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    fig.suptitle(f"trace {os.path.basename(r['trace'])}, max_num_seqs {r['max_num_seqs']}")


def quant(r, ax):
    """bench_quant.py: bits per weight against mean KL divergence vs the F16
    baseline (log scale), one point per method; the 4-bit methods' A8 runs
    (int8 activations) hollow beside their A16 ones."""
    pts = [x for x in r["quality"] if x["kl_mean"] > 0]
    for x in pts:
        a8 = x["method"].endswith(" A8")
        ax.scatter([x["bpw"]], [x["kl_mean"]], marker="o", facecolors="none" if a8 else "C0", edgecolors="C0")
        ax.annotate(x["method"], (x["bpw"], x["kl_mean"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_yscale("log")
    ax.set_xlabel("bits per weight (scales, zero points and the q8_0 embedding counted)")
    ax.set_ylabel("mean KL divergence vs F16 (nats/token)")
    ax.set_title(f"luainfer quantize: {r['n_scored']} held-out tokens, ctx {r['ctx']}")


def chart(r, ax):
    """The generic bar chart a benchmark describes under "chart"."""
    c = r["chart"]
    rows, fields = r["rows"], c["values"]
    if not rows or not fields:
        raise SystemExit(f"plot_bench.py: {r['bench']}: no rows or no values to draw")
    w = 0.8 / len(fields)
    for k, f in enumerate(fields):
        xs = [i + (k - (len(fields) - 1) / 2) * w for i in range(len(rows))]
        ys = [float(row.get(f) or 0) for row in rows]
        ax.bar(xs, ys, width=w, label=f)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([str(row.get(c["label"], i)) for i, row in enumerate(rows)], rotation=30, ha="right",
                       fontsize=8)
    if c.get("log"):
        ax.set_yscale("log")
    ax.set_ylabel(c.get("ylabel", ""))
    ax.set_title(c.get("title", r["bench"]))
    if len(fields) > 1:
        ax.legend(fontsize=8)


PLOTS = {"batching": batching, "prefix": prefix, "step_cost": step_cost, "kv_dtype": kv_dtype, "spec": spec,
         "quant": quant}
FIGURES = {"replay": replay}  # functions that lay out their own axes


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        r = json.load(f)
    name = r.get("bench")
    if name in FIGURES:
        fig = plt.figure(figsize=(12, 4.8), dpi=100)
        FIGURES[name](r, fig)
    elif name in PLOTS or "chart" in r:
        fig, ax = plt.subplots(figsize=(8, 4.8), dpi=100)
        (PLOTS.get(name) or chart)(r, ax)
        ax.grid(alpha=0.3)
    else:
        known = ", ".join(sorted([*PLOTS, *FIGURES]))
        print(f"plot_bench.py: no plot for benchmark {name!r} (known: {known}; or describe a \"chart\")",
              file=sys.stderr)
        return 2
    fig.tight_layout()
    out = argv[2]
    tmp = f"{out}.tmp.{os.getpid()}.png"
    fig.savefig(tmp)
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
