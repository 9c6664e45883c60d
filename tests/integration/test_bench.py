"""The benchmark programs of bench/ still run, at small sizes, on the real
model, and what they print holds together (the same useful tokens in every
schedule, no policy errors, the capacity ratios of the KV dtypes). They
check no speed: timings on a shared CI machine mean nothing, and the
measured numbers live in docs/benchmarks.md with their commands.
"""
import json
import os
import re
import struct
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
    """`luainfer bench` alone (or --help) lists every benchmark program, one
    line each: its name and what it measures, from its header comment; the
    Lua ones it runs, then the Python and the C ones with how to run them."""
    for args in ([], ["--help"]):
        r = run_cli(["bench", *args])
        assert r.returncode == 0, r.stderr
        for name in ("batching", "step_cost", "policy_overhead", "kv_dtype", "prefix", "cpu", "spec"):
            assert re.search(rf"^  {name} +\S.{{8,}}$", r.stdout, re.M), r.stdout
        listed = re.findall(r"^  (\w+) ", r.stdout, re.M)
        lua = sorted(p.stem[6:] for p in (REPO / "bench").glob("bench_*.lua"))
        py = sorted(p.name for p in (REPO / "bench").glob("bench_*.py"))
        c = sorted(p.stem for p in (REPO / "bench").glob("bench_*.c"))
        # the Lua ones by the name `bench` takes, then the Python files, then the C binaries
        assert listed == lua + c, r.stdout
        assert re.findall(r"^  (bench_\w+\.py) +\S.{8,}$", r.stdout, re.M) == py, r.stdout
        assert all(re.search(rf"^  {name} +\S.{{8,}}$", r.stdout, re.M) for name in c), r.stdout


def test_bench_program_help_prints_usage_and_runs_nothing(run_cli):
    """`luainfer bench NAME --help` (or -h anywhere among its arguments)
    prints the program's header comment and exits 0 without measuring:
    the programs read positional arguments with defaults, so before this a
    --help started a full run (bench spec's took minutes)."""
    for args in (["spec", "--help"], ["batching", "3", "-h"], ["replay", "--help"]):
        r = run_cli(["bench", *args], timeout=30)
        assert r.returncode == 0, r.stderr
        name = args[0]
        assert r.stdout.startswith(f"bench_{name}.lua"), r.stdout[:200]
        assert "luainfer" in r.stdout and not re.search(r"^-- ", r.stdout, re.M), r.stdout[:400]
        assert "[" not in r.stderr, r.stderr  # no progress bar: nothing ran


def check_png(path):
    """A PNG that decodes completely (matplotlib's reader, libpng), of a sane
    size, with more than one colour in it."""
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    assert 300 <= width <= 4000 and 200 <= height <= 4000, (width, height)
    import matplotlib.image
    img = matplotlib.image.imread(path)
    assert img.shape[:2] == (height, width)
    assert img.reshape(-1, img.shape[-1]).std(axis=0).max() > 0.01, "a blank image"


def test_bench_batching_counts_the_same_tokens(run_ok, tmp_path):
    png, js = tmp_path / "batching.png", tmp_path / "batching.json"
    out = bench(run_ok, "batching", "6", "4", "loguniform", "--plot", str(png), "--json", str(js))
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
    # --json holds what was printed; --plot drew it
    r = json.loads(js.read_text())
    assert r["bench"] == "batching" and [row["max_num_seqs"] for row in r["rows"]] == [4]
    assert r["rows"][0]["tokens"] == want and r["rows"][0]["steps_continuous"] == steps_c
    check_png(png)


def test_bench_step_cost_prints_every_size(run_ok):
    out = bench(run_ok, "step_cost", "2", "1")
    rows = re.findall(r"^\s+(\d+)\s+([\d.]+)\s+([\d.]+)", out, re.M)
    assert [int(n) for n, _, _ in rows] == [1, 2, 4, 8, 16, 32, 64]
    for n, step, tok in rows:
        assert float(step) > 0 and float(tok) == pytest.approx(float(step) / int(n), abs=0.006)  # printed to 2 and 3 decimals
    assert "per-step part f ~" in out


def test_bench_policy_overhead_has_no_errors(run_ok, tmp_path):
    js = tmp_path / "po.json"
    out = bench(run_ok, "policy_overhead", "2", "--json", str(js))
    assert "(errors 0)" in out
    assert "(errors 0, fallback steps 0)" in out
    r = json.loads(js.read_text())
    assert r["bench"] == "policy_overhead" and [row["isolation"] for row in r["rows"]] == ["inprocess", "process"]
    for row in r["rows"]:
        assert row["errors"] == 0 and row["fallback_steps"] == 0 and row["step_ms"] > 0
        shown = number(rf"{'in-process' if row['isolation'] == 'inprocess' else 'isolated'}:\s+step ([\d.]+) ms", out)
        assert shown == pytest.approx(row["step_ms"], abs=0.051)


def test_bench_kv_dtype_capacity(run_ok):
    out = bench(run_ok, "kv_dtype", "4", "8", "4", "1")
    per_token = {m.group(1): int(m.group(2)) for m in re.finditer(r"^\s+(\w+)\s+(\d+) bytes/token", out, re.M)}
    assert per_token["f16"] == per_token["bf16"] == per_token["f32"] // 2
    # 8-bit values plus one f32 scale per (token, kv head): just over half of f16
    assert per_token["f16"] / 2 < per_token["fp8"] == per_token["int8"] < per_token["f16"] * 0.55


def test_bench_prefix_hits(run_ok, tmp_path):
    png, js = tmp_path / "prefix.png", tmp_path / "prefix.json"
    # a quarter of the benchmark's text lengths: the same code paths, a test's size
    out = bench(run_ok, "prefix", "2", "both", "0.25", "--plot", str(png), "--json", str(js))
    hits = [float(h) for h in re.findall(r"\|\s+(\d+)% \| [\d.]+x$", out, re.M)]
    assert len(hits) == 4 and all(h > 0 for h in hits)
    # prefixes interleaved in arrival order through a pool too small for
    # them all: only the cache-aware order reuses them
    assert number(r"lpm\.lua: .*hit rate (\d+)%", out) > number(r"default\.lua: .*hit rate (\d+)%", out)
    r = json.loads(js.read_text())
    assert r["bench"] == "prefix" and len(r["rows"]) == 4
    assert [round(100 * row["hit"]) for row in r["rows"]] == [round(h) for h in hits]
    check_png(png)


def test_bench_options_errors(run_cli, tmp_path):
    """--plot and --json name files; a missing name or an unwritable place is a
    one-line error, and nothing half-written is left behind."""
    r = run_cli(["bench", "step_cost", "1", "1", "--json"])
    assert r.returncode != 0 and "--json needs a file name" in r.stderr
    bad = tmp_path / "no" / "such" / "dir" / "x.json"
    r = run_cli(["bench", "step_cost", "1", "1", "--json", str(bad)])
    assert r.returncode != 0 and f"cannot write {bad}" in r.stderr
    assert not list(tmp_path.rglob("*.tmp*"))


def test_bench_cpu_results(run_ok, tmp_path):
    """bench_cpu's RESULT lines, the same numbers in --json, and --plot's
    generic bar chart (the "chart" a benchmark without its own plot describes)."""
    js, png = tmp_path / "cpu.json", tmp_path / "cpu.png"
    out = bench(run_ok, "cpu", "16", "4", "2", "--json", str(js), "--plot", str(png))
    results = dict(re.findall(r"^RESULT (\w+) ([\d.]+)$", out, re.M))
    assert set(results) == {"prefill", "decode", "batched2"}
    assert all(float(v) > 0 for v in results.values())
    r = json.loads(js.read_text())
    assert [row["name"] for row in r["rows"]] == ["prefill 16", "decode 1", "batched 2"]
    assert [round(row["tokens_per_s"], 2) for row in r["rows"]] == [
        float(results[k]) for k in ("prefill", "decode", "batched2")]
    check_png(png)


def test_every_benchmark_has_json_and_plot():
    """Every benchmark program takes --json FILE and --plot FILE: the Lua
    ones through luainfer.bench (options + finish, with a plot of their own in
    tools/plot_bench.py or a "chart"), the Python ones through bench/results.py
    (add_options + finish). Halves run by a Python driver, which prints the
    JSON the driver reads, are named here and left out."""
    halves = {"bench_quant_speed.lua", "bench_serve.lua"}
    plot_src = (REPO / "tools" / "plot_bench.py").read_text()
    missing = []
    for p in sorted((REPO / "bench").glob("bench_*.lua")):
        if p.name in halves:
            continue
        src = p.read_text()
        name = p.stem[6:]
        own_plot = re.search(rf'"{name}":\s*{name}\b', plot_src) is not None
        if "bench.options(arg)" not in src or "bench.finish(" not in src or not (own_plot or "chart = {" in src):
            missing.append(p.name)
    for p in sorted((REPO / "bench").glob("bench_*.py")):
        src = p.read_text()
        if "results.add_options(" not in src or "results.finish(" not in src:
            missing.append(p.name)
    for p in sorted((REPO / "bench").glob("bench_*.c")):  # the C programs: bench/bench_results.h
        src = p.read_text()
        if '#include "bench/bench_results.h"' not in src or "li_bench_results_finish(" not in src:
            missing.append(p.name)
    assert not missing, f"benchmarks without --json/--plot: {missing}"


def test_every_long_benchmark_shows_progress():
    """Every Lua and Python benchmark reports progress on stderr (luainfer.bench's
    progress, bench/results.py's Progress: a bar with rate and ETA on a terminal,
    plain lines otherwise, test_progress_bar_on_a_terminal_plain_lines_otherwise).
    The halves a Python driver runs report through their driver; the C programs
    are short micro benchmarks (seconds) and print each result as it comes."""
    halves = {"bench_quant_speed.lua", "bench_serve.lua"}
    missing = [p.name for p in sorted((REPO / "bench").glob("bench_*.lua"))
               if p.name not in halves and "bench.progress(" not in p.read_text()]
    missing += [p.name for p in sorted((REPO / "bench").glob("bench_*.py")) if "results.Progress(" not in p.read_text()]
    assert not missing, f"benchmarks without progress: {missing}"


@pytest.mark.parametrize("prog,args,rows", [
    ("bench_spec_verify", ["4096", "1"], 6),
    ("bench_train", ["--kernels"], 9),
    ("bench_kernels", ["--forward", "1", "4"], None),
    ("bench_kernels", ["--verify", "9", "40", "2"], None),
])
def test_c_benchmark_json_and_plot(luainfer_bin, model_path, tmp_path, prog, args, rows):
    """The C benchmark programs take --json FILE and --plot FILE too: the rows
    hold the numbers they print, the PNG is valid."""
    exe = Path(luainfer_bin).parent / prog
    if not exe.is_file():
        pytest.skip(f"{exe} not built (CMake target {prog}; bench_kernels is x86-64 only)")
    js, png = tmp_path / "r.json", tmp_path / "r.png"
    r = subprocess.run([str(exe), *args, "--json", str(js), "--plot", str(png)], capture_output=True, text=True,
                       timeout=BENCH_TIMEOUT_S, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(js.read_text())
    assert res["bench"] == prog[6:] and res["rows"] and "chart" in res
    if rows is not None:
        assert len(res["rows"]) == rows, res["rows"]
    value = res["chart"]["values"][0]
    for row in res["rows"]:
        assert row["name"] and row[value] >= 0, row
    if prog == "bench_spec_verify":  # the table's numbers, as printed (one decimal)
        shown = dict(re.findall(r"^  (\S.*?\S) +([\d.]+) us/call", r.stdout, re.M))
        assert {row["name"]: f"{row['us_per_call']:.1f}" for row in res["rows"]} == shown
    check_png(png)
    bad = subprocess.run([str(exe), *args, "--json"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--json needs a file name" in bad.stderr
    assert not list(tmp_path.glob("*.tmp*"))


def test_bench_train_measures_the_fma_peak(luainfer_bin, model_path, tmp_path):
    """bench_train gives training's FLOP/s as a fraction of the FMA peak it
    measures (issue 15: "this machine's measured FMA peak"), not only of the
    nominal one; the JSON holds the measured peaks."""
    exe = Path(luainfer_bin).parent / "bench_train"
    if not exe.is_file():
        pytest.skip(f"{exe} not built")
    js = tmp_path / "t.json"
    r = subprocess.run([str(exe), "--seq", "8", "--steps", "1", "--json", str(js)], capture_output=True, text=True,
                       timeout=BENCH_TIMEOUT_S, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(js.read_text())
    if "fma_peak_measured_gflops" not in res:  # the scalar kernels: no FMA to measure
        assert "measured FMA peak" not in r.stdout
        pytest.skip("the training matmuls run the scalar kernels here: no FMA peak to measure")
    m = re.search(r"measured FMA peak \((\d+) lanes\): ([\d.]+) GFLOP/s on 2 threads, ([\d.]+) on one: "
                  r"matmul\+attention = ([\d.]+)% of it", r.stdout)
    assert m, r.stdout
    assert float(m.group(2)) == pytest.approx(res["fma_peak_measured_gflops"], rel=1e-3, abs=0.06)
    assert float(m.group(3)) == pytest.approx(res["fma_peak_measured_one_gflops"], rel=1e-3, abs=0.06)
    assert res["fma_peak_measured_one_gflops"] > 1 and 0 < float(m.group(4)) < 1000


def test_bench_kernels_verify_bad_arguments(luainfer_bin, model_path):
    """--verify R CTX STEPS refuses rows, a context or steps out of range with the reason."""
    exe = Path(luainfer_bin).parent / "bench_kernels"
    if not exe.is_file():
        pytest.skip(f"{exe} not built (bench_kernels is x86-64 only)")
    for args, want in ((["0", "40", "2"], "1 <= R <= 64"), (["9", "5000", "2"], "1 <= CTX <= 4096"),
                       (["9", "40", "0"], "STEPS >= 1")):
        r = subprocess.run([str(exe), "--verify", *args], capture_output=True, text=True, timeout=60, cwd=REPO)
        assert r.returncode == 1 and want in r.stderr, (args, r.stderr)


def test_bench_spec_outputs_match(run_ok, tmp_path):
    """bench_spec asserts every speculative run's tokens equal speculation
    off; a mismatch fails the program. --json holds the table's numbers,
    --plot draws them."""
    png, js = tmp_path / "spec.png", tmp_path / "spec.json"
    out = bench(run_ok, "spec", "8", "1", "--json", str(js), "--plot", str(png))
    rows = re.findall(r"^(copy|free)\s+(\d+) \|", out, re.M)
    assert rows == [("copy", "1"), ("copy", "8"), ("free", "1"), ("free", "8")]
    assert "every run's tokens were identical to speculation off" in out
    drafted = number(r"copy\s+1 \|\s+[\d.]+ \| [\d.]+ \([\d.]+x, \d+% of (\d+)\)", out)
    assert drafted > 0  # drafts were made
    r = json.loads(js.read_text())
    assert r["bench"] == "spec" and r["mode"] == "ngram" and len(r["rows"]) == 16
    first = r["rows"][0]
    assert (first["workload"], first["seqs"], first["setting"], first["drafted"]) == ("copy", 1, "ngram k2", drafted)
    assert all(row["ratio"] == pytest.approx(row["tok_s"] / row["off_tok_s"]) for row in r["rows"])
    check_png(png)


def test_bench_spec_proposers(run_ok, model_path, tmp_path):
    """bench_spec's proposers mode, --quick at 6 tokens, with zero Medusa
    heads: a row per workload and setting, every greedy run's tokens equal
    to speculation off (the program asserts it), both ratios as the rates
    they divide."""
    heads, js = tmp_path / "zero.gguf", tmp_path / "p.json"
    subprocess.run([sys.executable, str(REPO / "tools" / "gen_medusa_heads.py"), "--model", str(model_path),
                    "--out", str(heads), "--heads", "3", "--init", "zero"], check=True, capture_output=True)
    out = bench(run_ok, "spec", "6", "1", "proposers", "29", "--quick", "--medusa", str(heads), "--json", str(js))
    assert "every proposer's tokens were identical to speculation off" in out
    kinds = ["rewrite", "json", "code", "story"]
    assert re.findall(r"^(rewrite|json|code|story)\s+1\s+0\.0 \|\s+[\d.]+ \|", out, re.M) == kinds
    # the model clock's table: a ratio per setting on every workload's line
    assert "model clock: the median forward pass by rows" in out
    assert re.findall(r"^(rewrite|json|code|story)\s+1\s+0\.0 \|(?:\s+[\d.]+x){4}\s*$", out, re.M) == kinds
    r = json.loads(js.read_text())
    assert r["mode"] == "proposers" and len(r["rows"]) == 4 * 4
    assert all(row["model_ratio"] > 0 for row in r["rows"])
    assert {row["setting"] for row in r["rows"]} == {"ngram k8", "layerskip29 k3", "medusa", "adaptive"}
    for row in r["rows"]:
        assert row["ratio"] == pytest.approx(row["tok_s"] / row["off_tok_s"])
        assert row["e2e_ratio"] == pytest.approx(row["e2e_tok_s"] / row["off_e2e_tok_s"])
        assert 0 <= row["accepted"] <= row["drafted"]
    assert any(row["drafted"] > 0 for row in r["rows"] if row["setting"] == "ngram k8")


def test_bench_spec_policies_side_by_side(run_ok, luainfer_bin, tmp_path):
    """--policy A,B runs each policy file as its own setting, named by its
    base name, in the same table (two versions of a speculation policy side
    by side); a missing file is a clear error."""
    pol = (REPO / "policies" / "spec_adaptive.lua").read_text()
    a, b = tmp_path / "adapt_a.lua", tmp_path / "never.lua"
    a.write_text(pol)
    b.write_text("return { speculate = function(req, state) return false end }\n")
    js = tmp_path / "p.json"
    # three rounds: the model ratio is their median, so one run stalled by the
    # parallel tests (a 6-token run's time outside the forward pass, which the
    # clock keeps as measured) does not decide it (seen once: 0.84)
    out = bench(run_ok, "spec", "6", "3", "proposers", "29", "--quick", "--policy", f"{a},{b}", "--json", str(js))
    assert "every proposer's tokens were identical to speculation off" in out
    r = json.loads(js.read_text())
    assert {row["setting"] for row in r["rows"]} == {"ngram k8", "layerskip29 k3", "adapt_a", "never"}
    assert all(row["drafted"] == 0 for row in r["rows"] if row["setting"] == "never")
    # a policy that never drafts runs off's forward passes: the model clock
    # prices them the same (wall-clock ratios of such rows swing +-8%)
    for row in r["rows"]:
        if row["setting"] == "never":
            assert row["model_ratio"] == pytest.approx(1.0, rel=0.05), row
    missing = subprocess.run([str(luainfer_bin), "bench", "spec", "6", "1", "proposers", "29", "--quick",
                              "--policy", str(tmp_path / "nope.lua")], capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0 and "nope.lua: cannot open the file" in missing.stderr


def test_bench_spec_calibrated_side_by_side(run_ok, tmp_path):
    """--calibrated runs each adaptive setting as the engine runs it by
    default and with the row-cost curve timed up front (spec_calibrate),
    named "<name> cal", side by side; both keep the tokens of speculation
    off."""
    js = tmp_path / "c.json"
    out = bench(run_ok, "spec", "6", "1", "proposers", "29", "--quick", "--calibrated", "--json", str(js))
    assert "every proposer's tokens were identical to speculation off" in out
    r = json.loads(js.read_text())
    assert {row["setting"] for row in r["rows"]} == {"ngram k8", "layerskip29 k3", "adaptive", "adaptive cal"}


def test_bench_spec_sampled_rows_over_seeds(run_ok, luainfer_bin, tmp_path):
    """--temps/--batches choose the rows and --seeds N runs each sampled
    setting over N seeds a request (a temperature row otherwise compares
    the texts each setting happened to draw): 6 tokens, batches 1 and 2 at
    0.7, two seeds; bad values are clear errors."""
    never = tmp_path / "never.lua"
    never.write_text("return { speculate = function(req, state) return false end }\n")
    js = tmp_path / "s.json"
    out = bench(run_ok, "spec", "6", "1", "proposers", "29", "--temps", "0.7", "--batches", "1,2", "--seeds", "2",
                "--policy", str(never), "--json", str(js))
    assert "sampled rows over 2 seeds a request" in out and "greedy runs" not in out
    r = json.loads(js.read_text())
    assert r["seeds"] == 2 and len(r["rows"]) == 4 * 2 * 3
    assert {(row["seqs"], row["temperature"], row["requests"]) for row in r["rows"]} == {(1, 0.7, 2), (2, 0.7, 4)}
    assert all(row["drafted"] == 0 for row in r["rows"] if row["setting"] == "never")
    for flag, value, msg in [("--seeds", "0", "want a whole number >= 1"), ("--temps", "3", "want temperatures in [0, 2]"),
                             ("--batches", "0", "want batch sizes 1 to 8")]:
        bad = subprocess.run([str(luainfer_bin), "bench", "spec", "6", "1", "proposers", "29", flag, value],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode != 0 and f"{flag} {value}: {msg}" in bad.stderr, bad.stderr


def test_bench_builds_table(luainfer_bin, model_path, tmp_path):
    """bench_builds.py with one binary as both builds, one tiny round: the
    table has a row per measurement with positive medians, a ratio and a
    verdict (whatever it says: no speed is checked)."""
    cmd = [sys.executable, str(REPO / "bench" / "bench_builds.py"), "--old", str(luainfer_bin), "--new",
           str(luainfer_bin), "--old-src", str(REPO), "--new-src", str(REPO), "--model", str(model_path),
           "--rounds", "1", "--prefill", "16", "--decode", "4", "--seqs", "2", "3", "--json", str(tmp_path / "b.json")]
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
    js = json.loads((tmp_path / "b.json").read_text())  # --json: the same numbers as the table
    assert js["bench"] == "builds" and sorted(js["ratio"]) == ["batched2", "batched3", "decode", "prefill"]
    assert f"{js['ratio']['decode']:.3f}" == rows[1][3]


def write_trace(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_bench_replay_side_by_side(run_ok, tmp_path):
    """Two policies replay one small trace: a row each with the metrics,
    the same greedy outputs, --json holding the rows and --plot a PNG."""
    trace = write_trace(tmp_path / "t.jsonl", [
        {"t": 0.0, "prompt": "The capital of France is", "max_tokens": 6, "slo_ttft_ms": 60000, "slo_tpot_ms": 60000},
        {"t": 0.05, "prompt_len": 12, "max_tokens": 4, "tenant": "b"},
        {"t": 0.1, "prompt": "Once upon a time", "max_tokens": 5, "slo_ttft_ms": 0},  # can't be met
    ])
    png, js = tmp_path / "r.png", tmp_path / "r.json"
    out = bench(run_ok, "replay", str(trace), "--policy", str(REPO / "policies" / "default.lua"), "--policy",
                str(REPO / "policies" / "lof.lua"), "--rate-scale", "1,2", "--json", str(js), "--plot", str(png))
    rows = re.findall(r"^(default|lof)\s+([\d.]+)\s+([\d.]+)\s+[\d.]+s \|.*\|\s+(\d+)%\s+(\d+)\s+[\d.]+\s+(\d+)%$", out, re.M)
    assert [(p, s) for p, s, *_ in rows] == [("default", "1.00"), ("lof", "1.00"), ("default", "2.00"),
                                             ("lof", "2.00")], out
    assert "every run's outputs were identical" in out
    r = json.loads(js.read_text())
    assert r["bench"] == "replay" and len(r["runs"]) == 4
    for run in r["runs"]:
        assert run["requests"] == 3 and run["output_tokens"] == 15
        # the third request's TTFT SLO of 0 ms can't be met; the second has the default SLOs
        assert run["goodput"] <= 2 / 3
        assert run["ttft_p50"] <= run["ttft_p90"] <= run["ttft_p99"]
        assert 0 <= run["prefix_hit_rate"] <= 1
    check_png(png)
    # the sweep's maximum load: no scale reaches 90% here (the third SLO can't be met)
    assert "max load with goodput >= 90% (of the scales swept): default below 1.00, lof below 1.00" in out, out
    assert r["max_load"] == {"default": False, "lof": False} and r["goodput_target"] == 0.9
    out = bench(run_ok, "replay", str(trace), "--rate-scale", "1,2", "--goodput-target", "0", "--json", str(js))
    assert "max load with goodput >= 0% (of the scales swept): default 2.00" in out, out
    assert json.loads(js.read_text())["max_load"] == {"default": 2.0}


def test_bench_replay_bad_traces(run_cli, tmp_path):
    """A bad trace is a one-line error naming the file and line."""
    cases = {
        "missing.jsonl": None,
        "empty.jsonl": "",
        "notjson.jsonl": '{"t": 0, "prompt": "x", "max_tokens": 2}\n{bad\n',
        "order.jsonl": '{"t": 1, "prompt": "x", "max_tokens": 2}\n{"t": 0.5, "prompt": "y", "max_tokens": 2}\n',
        "noprompt.jsonl": '{"t": 0, "max_tokens": 2}\n',
        "badlen.jsonl": '{"t": 0, "prompt": "x", "max_tokens": 0}\n',
    }
    want = {
        "missing.jsonl": "cannot read trace",
        "empty.jsonl": "has no requests",
        "notjson.jsonl": "notjson.jsonl:2: json.decode: invalid JSON",
        "order.jsonl": "order.jsonl:2: arrivals must be in order",
        "noprompt.jsonl": "noprompt.jsonl:1: needs 'prompt'",
        "badlen.jsonl": "badlen.jsonl:1: 'max_tokens' must be an integer >= 1",
    }
    for name, text in cases.items():
        p = tmp_path / name
        if text is not None:
            p.write_text(text)
        r = run_cli(["bench", "replay", str(p)])
        assert r.returncode != 0 and want[name] in r.stderr, (name, r.stderr)
    ok = write_trace(tmp_path / "ok.jsonl", [{"t": 0, "prompt": "x", "max_tokens": 2}])
    for v in ("2", "-0.5", "x"):
        r = run_cli(["bench", "replay", str(ok), "--goodput-target", v])
        assert r.returncode != 0 and "--goodput-target" in r.stderr, (v, r.stderr)
    r = run_cli(["bench", "replay", str(tmp_path / "order.jsonl"), "--rate-scale", "0"])
    assert r.returncode != 0 and "--rate-scale: want a number" in r.stderr
    r = run_cli(["bench", "replay", str(tmp_path / "order.jsonl"), "--bogus"])
    assert r.returncode != 0 and "unknown option --bogus" in r.stderr


def test_shipped_traces_are_what_the_generator_makes(tmp_path):
    """bench/traces/ is exactly tools/gen_traces.py's output (deterministic),
    and every line has the fields the replay reads."""
    r = subprocess.run([sys.executable, str(REPO / "tools" / "gen_traces.py"), str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    shipped = sorted(p.name for p in (REPO / "bench" / "traces").glob("*.jsonl"))
    assert shipped == ["bursty.jsonl", "multitenant.jsonl", "poisson.jsonl", "rag.jsonl"]
    for name in shipped:
        assert (tmp_path / name).read_bytes() == (REPO / "bench" / "traces" / name).read_bytes(), name
        rows = [json.loads(l) for l in (REPO / "bench" / "traces" / name).read_text().splitlines()]
        ts = [row["t"] for row in rows]
        assert ts == sorted(ts) and all(row["max_tokens"] >= 1 and row["prompt"] for row in rows)
    tenants = [row.get("tenant") for row in map(json.loads, (REPO / "bench/traces/multitenant.jsonl").open())]
    assert 0.5 < tenants.count("heavy") / len(tenants) < 0.7


PROGRESS_SCRIPT = """
local bench = require("luainfer.bench")
local p = bench.progress(4, "demo", 0)   -- every = 0: a plain line per step
for i = 1, 4 do p:step() end
p:done()
"""


def test_progress_bar_on_a_terminal_plain_lines_otherwise(luainfer_bin, tmp_path, run_on_pty):
    """luainfer.bench's progress: redrawn in place (\\r, bar, rate, ETA) when
    stderr is a terminal, whole lines when it is not, silent with
    LUAINFER_PROGRESS=0."""
    script = tmp_path / "p.lua"
    script.write_text(PROGRESS_SCRIPT)
    plain = subprocess.run([str(luainfer_bin), "run", str(script)], capture_output=True, text=True, timeout=60)
    assert plain.returncode == 0, plain.stderr
    lines = plain.stderr.splitlines()
    assert len(lines) == 4 and "\r" not in plain.stderr, plain.stderr  # steps 1-3, then the final line
    assert re.fullmatch(r"demo \[#{24}\] 4/4  [\d.]+/s  took \d+s", lines[-1]), lines[-1]
    assert re.fullmatch(r"demo \[#{6}-{18}\] 1/4  [\d.]+/s  ETA \S+", lines[0]), lines[0]

    rc, text = run_on_pty([luainfer_bin, "run", script], timeout=60)
    assert rc == 0, text[-2000:]
    assert text.count("\r") >= 5 and "\x1b[K" in text and text.endswith("\n"), repr(text)
    assert "4/4" in text and "ETA" in text

    quiet = subprocess.run([str(luainfer_bin), "run", str(script)], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, LUAINFER_PROGRESS="0"))
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_bench_kv_pressure_outputs_match(run_ok):
    """bench_kv_pressure at 4 requests and 8 MiB: the new FCFS and default.lua
    finish everything with the unconstrained run's outputs, make the same
    plans, and compute at most 1.5x the unconstrained run's tokens."""
    out = bench(run_ok, "kv_pressure", "4", "8", "2", "250")
    rows = {m.group(1): m.groups()[1:] for m in re.finditer(
        # run, blocks, computed, kept, x ref, preemptions, then steps, batch,
        # tok/step, model s, wall s, tok/s (not checked), unfinished, diffs
        r"^(\S+(?: \S+)*?)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+(\d+)\s+\d+(?:\s+[\d.]+){5}\s+(\d+)\s+(\d+)$",
        out, re.M)}
    assert {"8MiB new seqs 16", "8MiB lua seqs 16", "8MiB old seqs 16", "8MiB old seqs 2"} <= set(rows), out
    for name in ("8MiB new seqs 16", "8MiB lua seqs 16"):
        blocks, computed, kept, ratio, preempt, unfinished, diffs = rows[name]
        assert (unfinished, diffs) == ("0", "0"), out
    assert int(rows["8MiB new seqs 16"][1]) == int(rows["8MiB lua seqs 16"][1])  # the same plans
    assert float(rows["8MiB new seqs 16"][3]) <= 1.5, out  # tokens computed over the unconstrained run's


def test_bench_replay_live_against_inprocess(run_ok, luainfer_bin, tmp_path):
    """bench/bench_replay_live.py replays a tiny trace through a live
    `luainfer serve` (HTTP, OpenAI client, slo fields in the body) and
    compares with the in-process replay's --json: every request completes,
    the unmeetable SLO counts in both, and the goodput comparison prints."""
    trace = write_trace(tmp_path / "t.jsonl", [
        {"t": 0.0, "prompt": "The capital of France is", "max_tokens": 4, "slo_ttft_ms": 60000, "slo_tpot_ms": 60000},
        {"t": 0.05, "prompt_len": 12, "max_tokens": 3, "slo_ttft_ms": 0.001},  # can't be met
    ])
    js = tmp_path / "in.json"
    bench(run_ok, "replay", str(trace), "--json", str(js))
    live = tmp_path / "live.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "bench_replay_live.py"), str(trace), "--bin",
                        str(luainfer_bin), "--compare", str(js), "--json", str(live), "--request-timeout", "120"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "goodput difference" in r.stdout, r.stdout
    got, want = json.loads(live.read_text()), json.loads(js.read_text())["runs"][0]
    assert got["requests"] == want["requests"] == 2 and got["output_tokens"] == want["output_tokens"] == 7
    assert got["goodput"] <= 0.5 and want["goodput"] <= 0.5
