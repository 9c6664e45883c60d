"""bench/bench_quant.py on a tiny size: the tables come out and the plot is a
valid PNG (its signature, an IHDR chunk whose CRC checks, a sane size, and
matplotlib reads it back)."""
import json
import struct
import subprocess
import sys
import zlib

import pytest


def test_bench_quant_tiny(luainfer_bin, model_path, repo_root, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib (tools/requirements-test.txt) draws the plot")
    png, js = tmp_path / "bpw_kl.png", tmp_path / "q.json"
    r = subprocess.run([sys.executable, repo_root / "bench" / "bench_quant.py", "--bin", luainfer_bin,
                        "--model", model_path, "--ctx", "32", "--chunks", "1", "--methods", "q8_0,w8a8-a0",
                        "--plot", png, "--json", js, "--work", tmp_path / "w"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| q8_0 |" in r.stdout and "| w8a8-a0 |" in r.stdout and "| f16 (baseline) |" in r.stdout
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    n, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and n == 13
    w, h = struct.unpack(">II", data[16:24])
    assert 100 < w < 5000 and 100 < h < 5000
    assert struct.unpack(">I", data[29:33])[0] == zlib.crc32(data[12:29])
    import matplotlib.image
    assert matplotlib.image.imread(str(png)).shape[:2] == (h, w)
    q = json.loads(js.read_text())["quality"]
    byname = {row["method"]: row for row in q}
    assert byname["f16 (baseline)"]["kl_mean"] == 0.0
    # every other method is measured against the baseline: a divergence > 0, finite
    for m in ("q8_0", "w8a8-a0"):
        assert 0 < byname[m]["kl_mean"] < 5 and 0 <= byname[m]["top1"] <= 1
        assert 7.5 < byname[m]["bpw"] < 9
    # resumed: with --reuse the models and their scores kept in --work come back as they were
    js2 = tmp_path / "q2.json"
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "w").glob("score.*.json")}
    r = subprocess.run([sys.executable, repo_root / "bench" / "bench_quant.py", "--bin", luainfer_bin,
                        "--model", model_path, "--ctx", "32", "--chunks", "1", "--methods", "q8_0,w8a8-a0",
                        "--json", js2, "--work", tmp_path / "w", "--reuse"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    kept = sorted((tmp_path / "w").glob("score.*.json"))
    assert len(kept) == 4, kept  # the baseline, the shipped Q4_1 and the two methods
    assert {p.name: p.stat().st_mtime_ns for p in kept} == before  # read back, not recomputed
    q2 = json.loads(js2.read_text())["quality"]
    assert [(x["method"], x["ppl"], x["kl_mean"]) for x in q2] == [(x["method"], x["ppl"], x["kl_mean"]) for x in q]
