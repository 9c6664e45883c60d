"""bench/bench_replay_live.py --protocol rpc: a 3-request trace replayed
through a live `luainfer serve` over msgpack-RPC with a third-party client
(aio-msgpack-rpc, one connection per request, streamed deltas), compared
with the in-process replay's --json: every request completes with exactly
its max_tokens (the script fails otherwise), the unmeetable SLO counts in
both, the goodput comparison prints."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _needs_model(model_path):
    """The replays load the default model (LUAINFER_MODEL or models/)."""


def test_bench_replay_live_rpc_against_inprocess(run_ok, luainfer_bin, tmp_path):
    pytest.importorskip("aio_msgpack_rpc")
    rows = [
        {"t": 0.0, "prompt": "The capital of France is", "max_tokens": 4, "slo_ttft_ms": 60000, "slo_tpot_ms": 60000},
        {"t": 0.05, "prompt_len": 12, "max_tokens": 3, "slo_ttft_ms": 0.001},  # can't be met
        {"t": 0.1, "prompt": "Once upon a time", "max_tokens": 5, "slo_ttft_ms": 60000, "slo_tpot_ms": 60000},
    ]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    js = tmp_path / "in.json"
    run_ok(["bench", "replay", str(trace), "--clock", "model", "--json", str(js)], timeout=300)
    live = tmp_path / "live.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "bench_replay_live.py"), str(trace), "--protocol", "rpc",
                        "--bin", str(luainfer_bin), "--compare", str(js), "--json", str(live),
                        "--request-timeout", "120"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "msgpack-RPC, aio-msgpack-rpc" in r.stdout and "goodput difference" in r.stdout, r.stdout
    got, want = json.loads(live.read_text()), json.loads(js.read_text())["runs"][0]
    assert got["protocol"] == "rpc"
    assert got["requests"] == want["requests"] == 3 and got["output_tokens"] == want["output_tokens"] == 12
    assert got["goodput"] <= 2 / 3 and want["goodput"] <= 2 / 3
    assert 0 < got["ttft_p50"] <= got["ttft_p99"] and got["tpot_p50"] > 0  # streamed: a first token was seen


@pytest.mark.parametrize("flag,value,want", [("--server-cpus", "x", "want a CPU list"),
                                             ("--client-cpus", "3-1", "want a CPU list"),
                                             ("--server-cpus", "4096", "not available here")])
def test_bench_replay_live_cpu_lists_checked(tmp_path, flag, value, want):
    """--server-cpus / --client-cpus: a bad list is a one-line error before any server starts."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"t": 0.0, "prompt_len": 4, "max_tokens": 1}) + "\n")
    r = subprocess.run([sys.executable, str(REPO / "bench" / "bench_replay_live.py"), str(trace), flag, value],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and want in r.stderr and "Traceback" not in r.stderr, r.stderr
