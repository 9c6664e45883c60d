"""`luainfer serve --step-log FILE` and `bench_step_cost.lua --fit-log FILE`
(issue 17): the server writes one JSON line per step that computed
something, with the step's shape as the model clock counts it, and the fit
of that clock to a log recovers the coefficients a log was made from. No
timing is asserted: only counts, shapes and exact arithmetic.
"""
import json
import random
import socket
import subprocess
import time
from pathlib import Path

import msgpack
import pytest

REPO = Path(__file__).resolve().parents[2]
FIELDS = ("step", "prefill_tokens", "decode_rows", "context", "step_s", "forward_s", "policy_s", "iter_s", "events")


def fit_log(run_cli, log, *extra):
    return run_cli(["run", "bench/bench_step_cost.lua", "--fit-log", str(log), *extra], timeout=60)


def rpc_generate(addr, params, timeout=120):
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(msgpack.packb([0, 1, "generate", params]))
        up = msgpack.Unpacker(raw=False)
        while True:
            data = s.recv(65536)
            assert data, "the server closed the connection"
            up.feed(data)
            for m in up:
                if m[0] == 1:
                    assert m[2] is None, m[2]
                    return m[3]


def test_step_log_has_every_computed_step(luainfer_bin, model_path, tmp_path):
    """Two requests one after the other on a fresh server: the log holds one
    line per step, the prefill's shape and every decode's context exactly."""
    log = tmp_path / "steps.jsonl"
    proc = subprocess.Popen([str(luainfer_bin), "serve", "--model", str(model_path), "--listen", "127.0.0.1:0",
                             "--no-http", "--threads", "1", "--no-prefix-cache", "--step-log", str(log)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        addr = None
        deadline = time.monotonic() + 180
        while addr is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                pytest.fail(f"server did not start: {proc.stderr.read()[-2000:]}")
            if "listening on" in line:
                addr = line.split("listening on ")[1].split()[0]
        assert addr, "no listening line"
        prompts = [[1000 + 37 * k for k in range(12)], [2000 + 11 * k for k in range(7)]]
        for p in prompts:  # one at a time: each step holds one request
            res = rpc_generate(addr, {"tokens": p, "max_tokens": 5, "temperature": 0, "ignore_eos": True})
            assert len(res["tokens"]) == 5
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert proc.returncode == 0, proc.stderr.read()[-2000:]
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    for r in lines:
        assert set(FIELDS) <= set(r), r
        assert 0 <= r["forward_s"] <= r["step_s"] <= r["iter_s"], r
        assert r["policy_s"] >= 0 and r["events"] >= 1, r
    assert [r["step"] for r in lines] == sorted({r["step"] for r in lines})  # increasing, no line twice
    # request 1: a prefill of 12, four decodes; then request 2: 7 and four decodes
    want = []
    for p in prompts:
        n = len(p)
        want.append((n, 0, n * (n + 1) / 2))
        want += [(0, 1, n + k) for k in range(1, 5)]  # decode k attends to positions 0 .. n + k - 1
    assert [(r["prefill_tokens"], r["decode_rows"], r["context"]) for r in lines] == want


def test_step_log_unwritable_path_fails_at_start(run_cli, tmp_path):
    r = run_cli(["serve", "--listen", "127.0.0.1:0", "--step-log", str(tmp_path / "no" / "such" / "dir.jsonl")],
                timeout=60)
    assert r.returncode != 0
    assert "--step-log: cannot write" in r.stderr and "No such file" in r.stderr, r.stderr


def test_fit_log_recovers_the_coefficients(run_cli, run_ok, tmp_path):
    """A log made from known coefficients (no noise) is fitted back exactly,
    and the JSON it writes is a clock `bench replay --clock model:FILE` reads."""
    a, b, c, d = 2.5e-3, 3.1e-4, 4.2e-4, 1.3e-6
    rng = random.Random(7)
    log = tmp_path / "syn.jsonl"
    with open(log, "w") as f:
        for i in range(300):
            p = rng.choice([0, 0, 0, 16, 64, 200])
            rows = rng.randint(0 if p else 1, 16)
            ctx = rng.randint(rows, 6000) + p * (p + 1) / 2
            y = a + b * p + c * rows + d * ctx
            f.write(json.dumps({"step": i, "prefill_tokens": p, "decode_rows": rows, "context": ctx,
                                "step_s": 0.8 * y, "iter_s": y}) + "\n")
        f.write("\n")  # a blank line is allowed
    out = tmp_path / "cost.json"
    r = fit_log(run_cli, log, "--json", out)
    assert r.returncode == 0, r.stderr
    assert "relative error: median" in r.stdout and "worst" in r.stdout, r.stdout
    got = json.loads(out.read_text())
    for k, want in zip("abcd", (a, b, c, d)):
        assert got[k] == pytest.approx(want, rel=1e-6), (k, got)
    assert got["steps"] == 300 and got["worst_error"] < 1e-6 and got["fitted_to"] == "server_iter_s"
    # --field step_s fits the other column: every coefficient 0.8x
    r = fit_log(run_cli, log, "--field", "step_s", "--json", tmp_path / "cost2.json")
    assert r.returncode == 0, r.stderr
    got2 = json.loads((tmp_path / "cost2.json").read_text())
    assert got2["a"] == pytest.approx(0.8 * a, rel=1e-6) and got2["d"] == pytest.approx(0.8 * d, rel=1e-6)
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"t": 0.0, "prompt_len": 8, "max_tokens": 3}) + "\n")
    rep = run_ok(["bench", "replay", str(trace), "--clock", f"model:{out}"], timeout=300)
    assert "model clock" in rep.stdout, rep.stdout


@pytest.mark.parametrize("text, message", [
    ('{"prefill_tokens": 1, "decode_rows": 0, "context": 1, "iter_s": 0.1}\nnot json\n', "log.jsonl:2: not a JSON object"),
    ('{"prefill_tokens": 1, "context": 1, "iter_s": 0.1}\n', "log.jsonl:1: 'decode_rows' must be a number >= 0"),
    ('{"prefill_tokens": 1, "decode_rows": 0, "context": 1, "iter_s": -1}\n', "log.jsonl:1: 'iter_s' must be a number"),
    ('{"prefill_tokens": 1, "decode_rows": 0, "context": 1, "iter_s": 0.1}\n', "1 usable steps, the fit needs at least 4"),
])
def test_fit_log_bad_files(run_cli, tmp_path, text, message):
    log = tmp_path / "log.jsonl"
    log.write_text(text)
    r = fit_log(run_cli, log)
    assert r.returncode != 0 and message in r.stderr, r.stderr


def test_fit_log_missing_file_and_field(run_cli, tmp_path):
    r = fit_log(run_cli, tmp_path / "absent.jsonl")
    assert r.returncode != 0 and "--fit-log: cannot read" in r.stderr and "absent.jsonl" in r.stderr, r.stderr
    log = tmp_path / "log.jsonl"
    log.write_text("")
    r = fit_log(run_cli, log, "--field", "wall")
    assert r.returncode != 0 and "--field: want iter_s or step_s" in r.stderr, r.stderr


def test_fit_log_match_total(run_cli, tmp_path):
    """Every 10th step twice as long (a loaded machine): the relative-error fit
    leans on the fast steps and sums to less than the log; --match-total
    scales it to sum to the logged time exactly, proportions kept."""
    a, b, c, d = 2.0e-3, 3.0e-4, 4.0e-4, 1.0e-6
    rng = random.Random(3)
    rows_x, total = [], 0.0
    log = tmp_path / "spiky.jsonl"
    with open(log, "w") as f:
        for i in range(200):
            p = rng.choice([0, 0, 32, 128])
            rows = rng.randint(0 if p else 1, 12)
            ctx = rng.randint(rows, 3000) + p * (p + 1) / 2
            y = (a + b * p + c * rows + d * ctx) * (2 if i % 10 == 0 else 1)
            rows_x.append((p, rows, ctx))
            total += y
            f.write(json.dumps({"prefill_tokens": p, "decode_rows": rows, "context": ctx, "iter_s": y}) + "\n")
    plain, scaled = tmp_path / "plain.json", tmp_path / "scaled.json"
    assert fit_log(run_cli, log, "--json", plain).returncode == 0
    r = fit_log(run_cli, log, "--match-total", "--json", scaled)
    assert r.returncode == 0 and "coefficients scaled by" in r.stdout, r.stdout + r.stderr
    p_, s_ = json.loads(plain.read_text()), json.loads(scaled.read_text())

    def clock_sum(k):
        return sum(k["a"] + k["b"] * p + k["c"] * n + k["d"] * x for p, n, x in rows_x)

    assert clock_sum(p_) < total and p_["total_ratio"] == pytest.approx(clock_sum(p_) / total, rel=1e-9)
    assert clock_sum(s_) == pytest.approx(total, rel=1e-9) and s_["match_total"] is True
    for k in "abcd":
        assert s_[k] == pytest.approx(p_[k] / p_["total_ratio"], rel=1e-9)
