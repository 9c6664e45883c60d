"""No policy can crash or hang `luainfer serve` (issue 18, part 1).

Every hostile policy of the issue (tests/policies/hostile/) is hot-reloaded
into a live server, in the default isolated mode and in-process, while
greedy requests run: the server stays up, every request finishes with the
tokens the default policy gives, and SIGTERM ends it with exit 0. Around
that: a policy that loops at load time fails to start instead of hanging,
a SIGTERM ends a server whose engine thread is stuck (the watchdog),
policy.reload refuses a config serve refuses, a FIFO, and is never blocked
by a failing isolated host, a contradictory or progress-less plan cannot
starve requests (counted), and a policy failing every step does not flood
the log.

Environment: LUAINFER_BIN (default build/luainfer), LUAINFER_MODEL.
"""

import os
import signal
import time
from pathlib import Path

import pytest

from test_server import THREADS, Rpc, Server

REPO = Path(__file__).resolve().parents[2]
HOSTILE = REPO / "tests" / "policies" / "hostile"
PROMPTS = ["The capital of France is", "Once upon a time"]
MAX_TOKENS = 6

# every file in HOSTILE that loads and must be survived while serving
SERVED = ["gsub_recursion", "method_gsub_recursion", "mem_compiled_loop", "busy_schedule", "busy_admit",
          "backtrack", "tostring_loop", "livelock", "livelock_alternate", "huge_plan", "always_error"]


def start(serve_bin, tmp, *args):
    return Server(serve_bin, ["--listen", "127.0.0.1:0", "--threads", THREADS, "--kv-memory", "32M",
                              "--admin-token", "tok", *args], 1, tmp)


def generate_all(addr):
    """The prompts as concurrent greedy requests on one connection -> token lists."""
    c = Rpc(addr, timeout=120)
    for i, p in enumerate(PROMPTS):
        c.send([0, 100 + i, "generate", {"prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0,
                                         "ignore_eos": True}])
    out = {}
    while len(out) < len(PROMPTS):
        m = c.read()
        assert m is not None, "the server closed the connection"
        if m[0] == 1:
            assert m[2] is None, f"generate failed: {m[2]}"
            out[m[1] - 100] = m[3]["tokens"]
    c.close()
    return [out[i] for i in range(len(PROMPTS))]


def reload(addr, **params):
    c = Rpc(addr, timeout=60)
    try:
        return c.call("policy.reload", {**params, "admin_token": "tok"})
    finally:
        c.close()


@pytest.fixture(scope="module")
def serve_bin(luainfer_bin, model_path):
    return luainfer_bin


@pytest.fixture(scope="module")
def reference(serve_bin, tmp_path_factory):
    s = start(serve_bin, tmp_path_factory.mktemp("ref"))
    try:
        st = Rpc(s.rpc).ok("stats")
        assert st["policy"]["kind"] == "process", "the isolated mode is serve's default"
        return generate_all(s.rpc)
    finally:
        assert s.stop() == 0, s.stderr()[-2000:]


@pytest.mark.parametrize("mode", ["process", "inprocess"])
def test_hot_reload_every_hostile_policy(serve_bin, tmp_path, reference, mode):
    s = start(serve_bin, tmp_path, "--policy-isolation", mode)
    try:
        for name in SERVED:
            err, res = reload(s.rpc, path=str(HOSTILE / f"{name}.lua"))
            assert err is None, f"{name}: reload failed: {err}"
            assert generate_all(s.rpc) == reference, f"{name} ({mode}): outputs differ"
            assert Rpc(s.rpc).ok("health")
        st = Rpc(s.rpc).ok("stats")["policy"]
        assert st["errors"] > 0 and st["livelock_steps"] > 0, st
        assert reload(s.rpc, path=str(REPO / "policies" / "default.lua"))[0] is None
        assert generate_all(s.rpc) == reference
    finally:
        rc = s.stop()
    assert rc == 0, s.stderr()[-3000:]


@pytest.mark.parametrize("mode,name", [("inprocess", "gsub_recursion"), ("inprocess", "mem_compiled_loop"),
                                       ("inprocess", "tostring_loop"), ("process", "busy_schedule")])
def test_serve_starts_with_hostile_policy(serve_bin, tmp_path, reference, mode, name):
    s = start(serve_bin, tmp_path, "--policy-isolation", mode, str(HOSTILE / f"{name}.lua"))
    try:
        assert generate_all(s.rpc) == reference
        assert Rpc(s.rpc).ok("stats")["policy"]["errors"] > 0
    finally:
        rc = s.stop()
    assert rc == 0, s.stderr()[-3000:]


@pytest.mark.parametrize("mode", ["process", "inprocess"])
def test_top_level_loop_fails_to_load(serve_bin, tmp_path, run_cli, mode):
    """A loop in the file's top level: serve exits with an error (no silent
    hang), and a reload of it is answered with an error."""
    bad = str(HOSTILE / "toplevel_loop.lua")
    r = run_cli(["serve", "--listen", "127.0.0.1:0", "--policy-isolation", mode, bad], timeout=60)
    assert r.returncode != 0 and ("budget" in r.stderr or "did not start" in r.stderr), r.stderr[-1000:]
    s = start(serve_bin, tmp_path, "--policy-isolation", mode)
    try:
        err, _ = reload(s.rpc, path=bad)
        assert err is not None and "old policy stays" in err["message"], err
        assert generate_all(s.rpc)
    finally:
        assert s.stop() == 0


def test_reload_refuses_what_serve_refuses(serve_bin, tmp_path):
    s = start(serve_bin, tmp_path)
    try:
        err, _ = reload(s.rpc, path=str(HOSTILE / "bogus_config.lua"))
        assert err is not None and "bogus" in err["message"], err
        err, _ = reload(s.rpc, source='return { config = { kv_dtype = "bogus" } }')
        assert err is not None and "bogus" in err["message"], err
        fifo = tmp_path / "policy.fifo"
        os.mkfifo(fifo)
        err, _ = reload(s.rpc, path=str(fifo))
        assert err is not None and "FIFO" in err["message"], err
        err, _ = reload(s.rpc, path=str(tmp_path))
        assert err is not None and "directory" in err["message"], err
        big = tmp_path / "big.lua"
        big.write_bytes(b"-" * (17 << 20))
        err, _ = reload(s.rpc, path=str(big))
        assert err is not None and "larger than" in err["message"], err
        assert Rpc(s.rpc).ok("stats")["policy"]["reload_errors"] == 5
        assert generate_all(s.rpc)
    finally:
        assert s.stop() == 0


def test_reload_replaces_a_failing_isolated_policy_at_once(serve_bin, tmp_path, reference):
    """A host that keeps timing out is in back-off; a reload still goes
    through on the first try, while traffic flows. (The host spends its time
    in C, slow_c_schedule.lua: busy_schedule.lua's VM loop can reach its
    instruction budget before the deadline on a fast CPU, an error and not a
    timeout.)"""
    s = start(serve_bin, tmp_path, str(HOSTILE / "slow_c_schedule.lua"))
    try:
        c = Rpc(s.rpc, timeout=120)
        c.send([0, 1, "generate", {"prompt": PROMPTS[0], "max_tokens": 64, "ignore_eos": True}])
        deadline = time.time() + 30
        while Rpc(s.rpc).ok("stats")["policy"]["host_timeouts"] < 3 and time.time() < deadline:
            time.sleep(0.05)
        assert Rpc(s.rpc).ok("stats")["policy"]["host_timeouts"] >= 3
        err, res = reload(s.rpc, path=str(REPO / "policies" / "default.lua"))
        assert err is None, err
        m = c.read()
        assert m[0] == 1 and m[2] is None and len(m[3]["tokens"]) == 64
        before = Rpc(s.rpc).ok("stats")["policy"]["errors"]
        assert generate_all(s.rpc) == reference
        assert Rpc(s.rpc).ok("stats")["policy"]["errors"] == before, "the new policy serves without errors"
    finally:
        assert s.stop() == 0


def test_livelock_is_counted_in_metrics(serve_bin, tmp_path, reference):
    s = Server(serve_bin, ["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--threads", THREADS,
                           "--kv-memory", "32M", str(HOSTILE / "livelock_alternate.lua")], 2, tmp_path)
    try:
        assert generate_all(s.rpc) == reference
        st = Rpc(s.rpc).ok("stats")["policy"]
        assert st["livelock_steps"] > 0 and st["errors"] == 0, st
        import urllib.request
        body = urllib.request.urlopen(f"http://{s.http}/metrics", timeout=30).read().decode()
        line = next(l for l in body.splitlines() if l.startswith("luainfer_policy_livelock_steps_total"))
        assert float(line.split()[-1]) == st["livelock_steps"]
    finally:
        assert s.stop() == 0


def test_failed_steps_do_not_flood_the_log(serve_bin, tmp_path):
    s = start(serve_bin, tmp_path, "--policy-isolation", "inprocess", str(HOSTILE / "always_error.lua"))
    try:
        c = Rpc(s.rpc, timeout=120)
        res = c.ok("generate", {"prompt": PROMPTS[0], "max_tokens": 40, "ignore_eos": True})
        assert len(res["tokens"]) == 40
        assert Rpc(s.rpc).ok("stats")["policy"]["errors"] >= 40
    finally:
        assert s.stop() == 0
    lines = [l for l in s.stderr().splitlines() if "schedule failed" in l]
    assert 10 <= len(lines) <= 12, f"{len(lines)} log lines for 40+ failed steps"


def test_sigterm_ends_a_server_with_a_stuck_engine_thread(serve_bin, tmp_path):
    """--policy-unsafe in-process: a compiled `while true do end` holds the
    engine thread for good; SIGTERM still ends the process (the watchdog)."""
    s = start(serve_bin, tmp_path, "--policy-isolation", "inprocess", "--policy-unsafe", "--drain-seconds", "1",
              str(HOSTILE / "busy_schedule.lua"))
    c = Rpc(s.rpc, timeout=30)
    c.send([0, 1, "generate", {"prompt": PROMPTS[0], "max_tokens": 4}])
    time.sleep(1.0)  # the engine thread is in the loop now
    s.proc.send_signal(signal.SIGTERM)
    rc = s.proc.wait(timeout=60)  # drain 1 s + the 5 s grace; without the watchdog: never
    assert rc == 1 and "engine thread is stuck" in s.stderr(), s.stderr()[-2000:]
