"""Serving defaults (issue 16): `luainfer serve` with no listener flags
answers msgpack-RPC on 127.0.0.1:7700 and OpenAI HTTP on 127.0.0.1:8000,
its banner's examples (curl, openai, the Python msgpack client, the REPL)
run as printed when pasted into a shell, with or without a key, --api-key (or
$LUAINFER_API_KEY) guards HTTP (not /health, /metrics) and msgpack-RPC
with one key, and a listener other machines can reach without a key is
warned about."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import msgpack
import pytest

from test_server import PROMPTS, THREADS, Rpc, Server, http, serve_bin  # noqa: F401 (fixture)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tcp_free(port):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def wait_for(s, text, timeout=60):
    deadline = time.time() + timeout
    while text not in s.stderr():
        assert time.time() < deadline, f"{text!r} not printed: {s.stderr()[-2000:]}"
        assert s.proc.poll() is None, s.stderr()[-2000:]
        time.sleep(0.1)
    return s.stderr()


def banner_commands(err):
    """The example commands the banner prints (continuation lines joined)."""
    lines, out = err.splitlines(), []
    i = 0
    while i < len(lines):
        l = lines[i]
        if l.startswith("  ") and not l.startswith("    "):
            cmd = l.strip()
            while cmd.endswith("\\"):
                i += 1
                cmd = cmd[:-1] + lines[i].strip()
            out.append(cmd)
        i += 1
    return out


VENV_BIN = os.path.dirname(sys.executable)


def paste(cmds, env, tmp):
    """Each banner command as a user pastes it: into bash, from a scratch
    directory (not the repository), with the project's venv on PATH (its
    python3 has openai and msgpack); the REPL gets an empty stdin. Each must
    answer with a real result."""
    assert any(c.startswith("curl ") for c in cmds) and any(c.startswith("python3 -c") for c in cmds), cmds
    assert any(re.match(r"python3 \S*examples/python_client\.py ", c) for c in cmds), cmds
    assert any(" repl --connect " in c for c in cmds), cmds
    env = dict(env, PATH=VENV_BIN + os.pathsep + env.get("PATH", ""))
    for cmd in cmds:
        if cmd.startswith("curl ") and not shutil.which("curl"):
            continue
        r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120, cwd=tmp, env=env,
                           stdin=subprocess.DEVNULL)
        assert r.returncode == 0 and r.stdout.strip(), (cmd, r.stdout, r.stderr[-1000:])
        if cmd.startswith("curl "):  # curl exits 0 on an HTTP error too: the body must be a completion
            body = json.loads(r.stdout)
            assert body["choices"][0]["text"] and body["usage"]["completion_tokens"] > 0, body
        elif "python_client.py" in cmd:
            assert re.search(r"^\[length\] prompt \d+ tokens", r.stdout, re.M), r.stdout
        elif " repl --connect " in cmd:
            assert "connected to " in r.stdout, r.stdout


def test_default_serve_answers_both_protocols(serve_bin, tmp_path):
    for port in (7700, 8000):
        if not tcp_free(port):
            pytest.skip(f"127.0.0.1:{port} is in use by another process; the default serve binds it")
    openai = pytest.importorskip("openai")
    s = Server(serve_bin, ["--threads", THREADS, "--kv-memory", "32M"], 2, tmp_path)
    try:
        assert sorted(s.addrs) == [("127.0.0.1:7700", "msgpack-rpc"), ("127.0.0.1:8000", "http")], s.addrs
        client = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none", max_retries=0, timeout=60)
        c = client.completions.create(model="m", prompt=PROMPTS[0], max_tokens=8, temperature=0)
        rpc = Rpc("127.0.0.1:7700").ok("generate", {"prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0})
        assert c.choices[0].text == rpc["text"] and c.usage.completion_tokens == 8
        err = wait_for(s, "msgpack-RPC on 127.0.0.1:7700")
        assert "warning" not in err, err  # loopback: nothing to warn about
        paste(banner_commands(err), {k: v for k, v in os.environ.items() if k != "LUAINFER_API_KEY"}, tmp_path)
    finally:
        assert s.stop() == 0, s.stderr()[-2000:]


def test_listener_flags_move_and_turn_off(serve_bin, tmp_path, run_cli):
    # --listen alone keeps its old meaning: msgpack-RPC only
    s = Server(serve_bin, ["--listen", "127.0.0.1:0", "--threads", THREADS, "--kv-memory", "16M"], 1, tmp_path)
    try:
        wait_for(s, "msgpack-RPC on")
        assert [p for _, p in s.addrs] == ["msgpack-rpc"] and "OpenAI API on" not in s.stderr()
    finally:
        assert s.stop() == 0
    # --no-rpc with --http: HTTP only
    s = Server(serve_bin, ["--no-rpc", "--http", "127.0.0.1:0", "--threads", THREADS, "--kv-memory", "16M"], 1,
               tmp_path)
    try:
        wait_for(s, "OpenAI API on")
        assert [p for _, p in s.addrs] == ["http"] and "msgpack-RPC on" not in s.stderr()
        assert http(s, "GET", "/health")[0] == 200
    finally:
        assert s.stop() == 0
    for args, msg in [(["--no-http", "--http", "127.0.0.1:0"], "--no-http and --http"),
                      (["--no-rpc", "--listen", "127.0.0.1:0"], "--no-rpc and --listen"),
                      (["--no-rpc", "--no-http"], "nothing to listen on"),
                      (["--api-key", "a", "--auth-token", "b"], "one key"),
                      # an empty key (a shell variable that was not set) is refused, not taken as none
                      (["--api-key", ""], "--api-key is empty"),
                      (["--auth-token", ""], "--auth-token is empty"),
                      (["--admin-token", ""], "--admin-token is empty")]:
        r = run_cli(["serve", *args, "--kv-memory", "16M"], timeout=120)
        assert r.returncode != 0 and msg in r.stderr, (args, r.stderr[-500:])


def test_api_key_guards_both_protocols(serve_bin, tmp_path, monkeypatch):
    openai = pytest.importorskip("openai")
    monkeypatch.setenv("LUAINFER_API_KEY", "k-from-env")
    s = Server(serve_bin, ["--listen", "0.0.0.0:0", "--http", "0.0.0.0:0", "--threads", THREADS,
                           "--kv-memory", "16M"], 2, tmp_path)
    try:
        port_rpc = int(s.rpc.rsplit(":", 1)[1])
        port_http = int(s.http.rsplit(":", 1)[1])
        rpc_addr, http_addr = f"127.0.0.1:{port_rpc}", f"127.0.0.1:{port_http}"
        # msgpack-RPC: nothing before auth, a wrong key closes, the key opens
        c = Rpc(rpc_addr)
        err, _ = c.call("health")
        assert err["code"] == 401 and c.closed()
        c = Rpc(rpc_addr)
        assert c.call("auth", {"token": "wrong"})[0]["code"] == 401 and c.closed()
        c = Rpc(rpc_addr)
        assert c.ok("auth", {"token": "k-from-env"}) == {"ok": True}
        ref = c.ok("generate", {"prompt": PROMPTS[0], "max_tokens": 6, "temperature": 0})
        # HTTP: Bearer, as vLLM's; /health and /metrics open, as vLLM's
        client = openai.OpenAI(base_url=f"http://{http_addr}/v1", api_key="k-from-env", max_retries=0, timeout=60)
        out = client.completions.create(model="m", prompt=PROMPTS[0], max_tokens=6, temperature=0)
        assert out.choices[0].text == ref["text"]
        bad = openai.OpenAI(base_url=f"http://{http_addr}/v1", api_key="wrong", max_retries=0, timeout=60)
        with pytest.raises(openai.AuthenticationError):
            bad.completions.create(model="m", prompt="x", max_tokens=1)

        class H:
            http = http_addr
        for path in ("/v1/models", "/tokenize"):
            assert http(H, "POST" if path == "/tokenize" else "GET", path, b'{"prompt": "x"}')[0] == 401
        assert http(H, "GET", "/health")[0] == 200 and http(H, "GET", "/metrics")[0] == 200
        err = wait_for(s, "msgpack-RPC on")
        assert "warning" not in err, err  # reachable, but keyed
        assert "Bearer $LUAINFER_API_KEY" in err and "k-from-env" not in err  # the key is never printed
        assert "export it first" not in err  # $LUAINFER_API_KEY is the server's key already
        # pasted where $LUAINFER_API_KEY holds the key, every example gets in
        paste(banner_commands(err), dict(os.environ, LUAINFER_API_KEY="k-from-env"), tmp_path)
    finally:
        assert s.stop() == 0, s.stderr()[-2000:]
    # --api-key on the command line wins over the environment
    s = Server(serve_bin, ["--listen", "127.0.0.1:0", "--threads", THREADS, "--kv-memory", "16M",
                           "--api-key", "k-flag"], 1, tmp_path)
    try:
        c = Rpc(s.rpc)
        assert c.call("auth", {"token": "k-from-env"})[0]["code"] == 401
        assert Rpc(s.rpc).ok("auth", {"token": "k-flag"}) == {"ok": True}
        # the key came from the flag: the banner says to export it for its examples
        err = wait_for(s, "msgpack-RPC on")
        assert "export it first" in err and "k-flag" not in err, err
    finally:
        assert s.stop() == 0


def test_warning_for_a_reachable_listener_without_a_key(serve_bin, tmp_path, monkeypatch):
    monkeypatch.delenv("LUAINFER_API_KEY", raising=False)
    s = Server(serve_bin, ["--listen", "0.0.0.0:0", "--http", "127.0.0.1:0", "--threads", THREADS,
                           "--kv-memory", "16M"], 2, tmp_path)
    try:
        err = wait_for(s, "msgpack-RPC on")
        warn = [l for l in err.splitlines() if "warning" in l]
        assert len(warn) == 1 and re.search(r"0\.0\.0\.0:\d+ \(msgpack-rpc\)", warn[0]) and "--api-key" in warn[0], err
    finally:
        assert s.stop() == 0
