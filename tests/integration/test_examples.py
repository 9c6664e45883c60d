"""Every program in examples/ runs, as its header says, and does what it
claims: the batch script and the small benchmark through `luainfer run`, the
custom scheduler inside the batch script, and the clients (Python, C, Lua,
the `openai` package, hot reload) against one live server."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from test_server import Server

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
PY = sys.executable
TIMEOUT_S = 300  # generous: a loaded CI machine
THREADS = os.environ.get("LUAINFER_THREADS", "2")


def run(args, timeout=TIMEOUT_S):
    r = subprocess.run([str(a) for a in args], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{args} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return r.stdout


def test_every_example_is_tested():
    """A new example comes with a test here (this list is the contract)."""
    tested = {"batch.lua", "scheduler.lua", "bench_small.lua", "python_client.py", "client.c", "lua_client.lua",
              "openai_client.py", "hot_reload.py", "README.md"}
    assert {p.name for p in EXAMPLES.iterdir()} == tested


def test_batch_script(luainfer_bin, model_path):
    out = run([luainfer_bin, "run", EXAMPLES / "batch.lua"])
    assert len(re.findall(r"^\[\d\] ", out, re.M)) == 5, out
    assert re.search(r"at most [2-5] running at once", out), out  # batched, not one by one


def test_custom_scheduler_gives_the_same_greedy_texts(luainfer_bin, model_path):
    """A policy decides who runs when, never what is computed: the greedy
    completions of batch.lua are the same under examples/scheduler.lua."""
    def greedy_lines(out):  # request 3 samples at temperature 0.8: its text may differ
        return [l for l in out.splitlines() if re.match(r"^\[[1245]\] ", l)]
    base = run([luainfer_bin, "run", EXAMPLES / "batch.lua"])
    custom = run([luainfer_bin, "run", EXAMPLES / "batch.lua", EXAMPLES / "scheduler.lua"])
    strip = lambda ls: [re.sub(r", [\d.]+ s\)$", ")", l) for l in ls]  # latencies differ
    assert strip(greedy_lines(custom)) == strip(greedy_lines(base))
    assert len(greedy_lines(base)) == 4


def test_scheduler_is_about_twenty_lines():
    code = [l for l in (EXAMPLES / "scheduler.lua").read_text().splitlines() if l.strip() and not l.strip().startswith("--")]
    assert len(code) <= 20, len(code)


def test_small_benchmark(luainfer_bin, model_path):
    out = run([luainfer_bin, "run", EXAMPLES / "bench_small.lua", "1", "6"])
    assert re.search(r"batched / one at a time: \d+\.\d\dx .*outputs identical", out), out


@pytest.fixture(scope="module")
def live(luainfer_bin, model_path, tmp_path_factory):
    s = Server(luainfer_bin, ["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--threads", THREADS,
                              "--admin-token", "secret"], 2, tmp_path_factory.mktemp("examples"))
    yield s
    assert s.stop() == 0, s.stderr()[-2000:]


def test_python_client(live):
    out = run([PY, EXAMPLES / "python_client.py", "--addr", live.rpc, "--max-tokens", "8", "The capital of France is"])
    assert "Paris" in out and "[length]" in out, out


def test_c_client(live, luainfer_bin):
    binary = Path(luainfer_bin).parent / "example_client"
    if not binary.exists():
        pytest.skip(f"{binary} not built (the CMake target example_client)")
    host, port = live.rpc.rsplit(":", 1)
    out = run([binary, host, port, "The capital of France is"])
    assert "Paris" in out, out


def test_lua_client(live, luainfer_bin):
    out = run([luainfer_bin, "run", EXAMPLES / "lua_client.lua", live.rpc])
    assert re.search(r'^plain: +".*Paris', out, re.M), out
    assert re.search(r"^streamed: .*\n +\(length, 16 tokens\)", out, re.M), out
    assert re.search(r"^server: +\d+ requests finished", out, re.M), out


def test_openai_client(live):
    out = run([PY, EXAMPLES / "openai_client.py", "--base-url", f"http://{live.http}/v1"])
    assert re.search(r"^completion: '.*Paris.*' \(length, 12 tokens\)", out, re.M), out
    assert re.search(r"^chat \(streamed\): .+", out, re.M) and re.search(r"^\((stop|length)\)$", out, re.M), out


def test_hot_reload_against_a_live_server(live):
    out = run([PY, EXAMPLES / "hot_reload.py", "--addr", live.rpc, "--admin-token", "secret"])
    assert len(re.findall(r"^reloaded ", out, re.M)) == 2, out
    assert "distinct greedy outputs: 1" in out, out
