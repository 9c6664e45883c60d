"""bench/bench_stack.lua (issue 19's stacking table) at a small size on the
real model: the rows add what they say (prefix-cache hits only from row 3,
drafts only from row 4; row 5 lets spec_adaptive.lua choose them), rows
1-5 give identical tokens (the program
asserts it), --json holds the table and --plot draws it. No speed is
checked: the measured table lives in docs/benchmarks.md with its command.
"""
import json
import re

import pytest

from test_bench import bench, check_png
from test_cli_errors import assert_clean_failure


@pytest.fixture(autouse=True)
def _needs_model(model_path):
    """The benchmark loads the default model (LUAINFER_MODEL or models/)."""


def test_bench_stack_rows(run_ok, tmp_path):
    js, png = tmp_path / "stack.json", tmp_path / "stack.png"
    # 6 requests, 3 at once: the second wave finds the shared system prompt cached
    out = bench(run_ok, "stack", "8", "2", "--requests", "6", "--seqs", "3", "--json", str(js), "--plot", str(png))
    assert "+ W8A8 skipped" in out
    assert "rows 1-5: every request's tokens identical to the single stream's" in out
    names = re.findall(r"^(\S.*?)\s{2,}[\d.]+\s+[\d.]+x", out, re.M)
    assert names == ["Q4_1 single stream", "+ continuous batching", "+ prefix caching", "+ speculation (n-gram k8)",
                     "+ speculation (adaptive)"]
    assert re.search(r"load average \d", out)
    r = json.loads(js.read_text())
    assert r["bench"] == "stack" and r["requests"] == 6 and r["seqs"] == 3 and r["rounds"] == 2
    rows = r["rows"]
    assert [row["name"] for row in rows] == names
    assert all(row["tokens"] == 6 * 8 and row["tok_s"] > 0 for row in rows)
    assert rows[0]["ratio"] == 1 and all(len(row["rounds_ratio"]) == 2 for row in rows)
    assert [row["prefix_hit_tokens"] > 0 for row in rows] == [False, False, True, True, True]
    assert [row["drafted"] > 0 for row in rows[:4]] == [False, False, False, True]
    # the same prompts and outputs: cache hits are tokens not computed
    assert rows[0]["computed"] == rows[1]["computed"] == rows[2]["computed"] + rows[2]["prefix_hit_tokens"]
    assert rows[3]["accepted"] <= rows[3]["drafted"] and rows[4]["accepted"] <= rows[4]["drafted"]
    # one request at a time takes a step per token at least; batching fewer
    assert rows[0]["steps"] >= 6 * 8 > rows[1]["steps"]
    check_png(png)


def test_bench_stack_bad_w8a8(run_cli, tmp_path):
    r = run_cli(["bench", "stack", "8", "1", str(tmp_path / "missing.gguf")])
    assert_clean_failure(r, r"W8A8 model .*cannot be opened")
