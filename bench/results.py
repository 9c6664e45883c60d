"""results.py — what the Python benchmark programs share: --json, --plot
and progress.

    ap = argparse.ArgumentParser(...)
    results.add_options(ap)                  # --json FILE, --plot FILE
    a = ap.parse_args()
    p = results.Progress(n_runs, "runs")     # progress on stderr
    for ...: run(...); p.step()
    p.done()
    results.finish(a, {"bench": "serve", "rows": [...], "chart": {...}})

write(path, results) writes the results (a dict with a "bench" name) as
JSON with sorted keys, through a temporary file renamed into place, so a
failed run never leaves half a file; finish() does that for --json and
draws --plot with tools/plot_bench.py from the same results (a plot of the
benchmark's own there, or the bar chart its "chart" entry describes). The
Lua benchmarks do the same through lua/luainfer/bench.lua."""
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write(path, results, quiet=False):
    assert isinstance(results.get("bench"), str), "results need a bench name"
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(results, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    if not quiet:
        print(f"results written to {path}")


def add_options(ap):
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON")
    ap.add_argument("--plot", metavar="FILE", help="draw the results as a PNG (tools/plot_bench.py, matplotlib)")


def finish(args, results):
    """--json and --plot of args, from results."""
    if getattr(args, "json", None):
        write(args.json, results)
    if getattr(args, "plot", None):
        with tempfile.TemporaryDirectory(prefix="plot_bench.") as d:
            data = os.path.join(d, "results.json")
            write(data, results, quiet=True)
            r = subprocess.run([sys.executable, str(ROOT / "tools" / "plot_bench.py"), data, args.plot],
                               capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"--plot {args.plot}: tools/plot_bench.py failed: {r.stderr.strip()[-500:]}")
        print(f"plot written to {args.plot}")


def _eta(s):
    if s != s or s == float("inf"):
        return "?"
    s = int(s + 0.5)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class Progress:
    """Progress of `total` units on stderr: one line redrawn in place on a
    terminal (bar, count, rate, ETA), else a plain line at most every
    `every` seconds and one at the end. LUAINFER_PROGRESS=0 silences it."""

    def __init__(self, total, label="progress", every=10.0):
        self.total, self.label, self.every, self.n = total, label, every, 0
        self.t0 = self.last = time.monotonic()
        self.tty = sys.stderr.isatty() or os.environ.get("LUAINFER_PROGRESS") == "1"
        self.off = os.environ.get("LUAINFER_PROGRESS") == "0"
        self.finished = False

    def line(self):
        t = time.monotonic() - self.t0
        rate = self.n / t if t > 0 else 0.0
        left = (self.total - self.n) / rate if rate > 0 else float("inf")
        w = 24
        fill = int(w * min(self.n, self.total) / self.total) if self.total > 0 else 0
        done = self.n >= self.total
        return (f"{self.label} [{'#' * fill}{'-' * (w - fill)}] {self.n}/{self.total}  {rate:.2f}/s  "
                f"{'took' if done else 'ETA'} {_eta(t if done else left)}")

    def step(self, k=1):
        self.n += k
        if self.off:
            return
        t = time.monotonic()
        if self.tty:
            sys.stderr.write("\r" + self.line() + "\x1b[K")
            sys.stderr.flush()
        elif t - self.last >= self.every and self.n < self.total:
            sys.stderr.write(self.line() + "\n")
            self.last = t

    def done(self):
        if self.off or self.finished:
            return
        self.finished = True
        sys.stderr.write(("\r" + self.line() + "\x1b[K\n") if self.tty else (self.line() + "\n"))
        sys.stderr.flush()
