"""The benchmark programs of bench/ still run, at small sizes, on the real
model, and what they print holds together (the same useful tokens in every
schedule, no policy errors, the capacity ratios of the KV dtypes). They
check no speed: timings on a shared CI machine mean nothing, and the
measured numbers live in docs/benchmarks.md with their commands.
"""
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

BENCH_TIMEOUT_S = 300


@pytest.fixture(autouse=True)
def _needs_model(model_path):
    """Benchmarks load the default model (LUAINFER_MODEL or models/)."""


def bench(run_ok, *args):
    return run_ok(["bench", *args], timeout=BENCH_TIMEOUT_S).stdout


def number(pattern, text):
    m = re.search(pattern, text)
    assert m, f"no match for {pattern!r} in:\n{text}"
    return float(m.group(1))


def test_bench_list(run_cli):
    r = run_cli(["bench", "--help"])
    assert r.returncode == 0
    for name in ("batching", "step_cost", "policy_overhead", "kv_dtype", "prefix", "cpu", "spec"):
        assert f"  {name}\n" in r.stdout


def test_bench_batching_counts_the_same_tokens(run_ok):
    out = bench(run_ok, "batching", "6", "4", "loguniform")
    # out_len(i) = floor(16 * 32^q + 0.5), q = (i-1)/5, summed over i = 1..6
    want = sum(int(16 * 32 ** ((i - 1) / 5) + 0.5) for i in range(1, 7))
    cont = number(r"continuous \(default\.lua\): (\d+) tokens", out)
    stat = number(r"static\s+\(static\.lua\):\s+(\d+) tokens", out)
    padded = number(r"static padded .*?: (\d+) useful tokens", out)
    assert cont == stat == padded == want
    steps_c = number(r"continuous .* (\d+) steps", out)
    steps_s = number(r"static\s+\(static\.lua\):.* (\d+) steps", out)
    assert steps_s >= steps_c  # static cannot take fewer steps than FCFS on the same requests
    assert number(r"steps static / continuous: ([\d.]+)x", out) == pytest.approx(steps_s / steps_c, abs=0.01)
    for name in ("continuous/static", "continuous/static padded"):
        assert number(rf"throughput ratio {name}: ([\d.]+)x", out) > 0


def test_bench_step_cost_prints_every_size(run_ok):
    out = bench(run_ok, "step_cost", "2", "1")
    rows = re.findall(r"^\s+(\d+)\s+([\d.]+)\s+([\d.]+)", out, re.M)
    assert [int(n) for n, _, _ in rows] == [1, 2, 4, 8, 16, 32, 64]
    for n, step, tok in rows:
        assert float(step) > 0 and float(tok) == pytest.approx(float(step) / int(n), abs=0.006)  # printed to 2 and 3 decimals
    assert "per-step part f ~" in out


def test_bench_policy_overhead_has_no_errors(run_ok):
    out = bench(run_ok, "policy_overhead", "2")
    assert "(errors 0)" in out
    assert "(errors 0, fallback steps 0)" in out


def test_bench_kv_dtype_capacity(run_ok):
    out = bench(run_ok, "kv_dtype", "4", "8", "4", "1")
    per_token = {m.group(1): int(m.group(2)) for m in re.finditer(r"^\s+(\w+)\s+(\d+) bytes/token", out, re.M)}
    assert per_token["f16"] == per_token["bf16"] == per_token["f32"] // 2
    # 8-bit values plus one f32 scale per (token, kv head): just over half of f16
    assert per_token["f16"] / 2 < per_token["fp8"] == per_token["int8"] < per_token["f16"] * 0.55


def test_bench_prefix_hits(run_ok):
    out = bench(run_ok, "prefix", "2")
    hits = [float(h) for h in re.findall(r"\|\s+(\d+)% \| [\d.]+x$", out, re.M)]
    assert len(hits) == 4 and all(h > 0 for h in hits)
    # prefixes interleaved in arrival order through a pool too small for
    # them all: only the cache-aware order reuses them
    assert number(r"lpm\.lua: .*hit rate (\d+)%", out) > number(r"default\.lua: .*hit rate (\d+)%", out)


def test_bench_cpu_results(run_ok):
    out = bench(run_ok, "cpu", "16", "4", "2")
    results = dict(re.findall(r"^RESULT (\w+) ([\d.]+)$", out, re.M))
    assert set(results) == {"prefill", "decode", "batched2"}
    assert all(float(v) > 0 for v in results.values())


def test_bench_spec_outputs_match(run_ok):
    """bench_spec asserts every speculative run's tokens equal speculation
    off; a mismatch fails the program."""
    out = bench(run_ok, "spec", "8", "1")
    rows = re.findall(r"^(copy|free)\s+(\d+) \|", out, re.M)
    assert rows == [("copy", "1"), ("copy", "8"), ("free", "1"), ("free", "8")]
    assert "every run's tokens were identical to speculation off" in out
    assert number(r"copy\s+1 \|\s+[\d.]+ \| [\d.]+ \([\d.]+x, \d+% of (\d+)\)", out) > 0  # drafts were made


def test_bench_builds_table(luainfer_bin, model_path):
    """bench_builds.py with one binary as both builds, one tiny round: the
    table has a row per measurement with positive medians, a ratio and a
    verdict (whatever it says: no speed is checked)."""
    cmd = [sys.executable, str(REPO / "bench" / "bench_builds.py"), "--old", str(luainfer_bin), "--new",
           str(luainfer_bin), "--old-src", str(REPO), "--new-src", str(REPO), "--model", str(model_path),
           "--rounds", "1", "--prefill", "16", "--decode", "4", "--seqs", "2", "3"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = re.findall(r"^\| ([^|]+?) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| (yes|no) \|$", r.stdout, re.M)
    assert [name.split(",")[0] for name, *_ in rows] == ["prefill", "decode", "batched decode", "batched decode"], \
        r.stdout
    assert "16-token prompt" in rows[0][0] and "2 sequences" in rows[2][0] and "3 sequences" in rows[3][0]
    for name, old, new, ratio, ok in rows:
        assert float(old) > 0 and float(new) > 0, name
        assert float(ratio) > 0
        if abs(abs(float(ratio) - 1) - 0.03) > 0.001:  # the verdict uses the unrounded ratio
            assert (ok == "yes") == (abs(float(ratio) - 1) <= 0.03), (name, ratio, ok)
    assert re.search(r"^round 1: prefill [\d.]+ -> [\d.]+, decode", r.stdout, re.M), r.stdout


def test_bench_kv_pressure_outputs_match(run_ok):
    """bench_kv_pressure at 4 requests and 8 MiB: the new FCFS and default.lua
    finish everything with the unconstrained run's outputs, make the same
    plans, and compute at most 1.5x the unconstrained run's tokens."""
    out = bench(run_ok, "kv_pressure", "4", "8", "2", "250")
    rows = {m.group(1): m.groups()[1:] for m in re.finditer(
        r"^(\S+(?: \S+)*?)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+(\d+)\s+[\d.]+\s+[\d.]+\s+(\d+)\s+(\d+)$", out, re.M)}
    assert {"8MiB new seqs 16", "8MiB lua seqs 16", "8MiB old seqs 16", "8MiB old seqs 2"} <= set(rows), out
    for name in ("8MiB new seqs 16", "8MiB lua seqs 16"):
        blocks, computed, kept, ratio, preempt, unfinished, diffs = rows[name]
        assert (unfinished, diffs) == ("0", "0"), out
    assert int(rows["8MiB new seqs 16"][1]) == int(rows["8MiB lua seqs 16"][1])  # the same plans
    assert float(rows["8MiB new seqs 16"][3]) <= 1.5, out  # tokens computed over the unconstrained run's
