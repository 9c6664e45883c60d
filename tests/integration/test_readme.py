"""Every command README.md shows runs as written.

The code blocks of README.md are read and sorted by what they hold:

  sh blocks      one shell command per line (backslash continuations
                 joined). `./build/luainfer ...` runs through bash from the
                 repository root, with `./build/luainfer` replaced by
                 LUAINFER_BIN and nothing else changed; `serve` commands are
                 started, asked /health (HTTP) or `health` (msgpack-RPC) on
                 every address they print, and stopped with SIGTERM.
                 `make TARGET` runs as `make -n TARGET` (the targets build
                 and run the whole suite, this test among it): the target
                 must exist and every script it names must be there.
  python blocks  run against the README's HTTP server command while it is up.
  $ transcripts  a block whose first line is `$ COMMAND`: the `> ` lines are
                 fed to COMMAND's stdin and the other lines must come back
                 (exactly, on the default model).
  lua blocks     a block that starts `-- policies/NAME.lua` is that file; the
                 others are scripts, run by `luainfer run` in a scratch
                 directory holding those files beside the shipped policies.

Inline commands of the prose (`luainfer ...`, `.venv/bin/python ...`) are
checked too: the gguf_to_hf.py line runs as written into a scratch
directory and the directory it makes gives its reference's tokens and
logits; `repl --connect` drives a live server. `make serve` / `make test`
are only dry-run (`make -n`): they build and run the whole suite, this file
among it. A command the test does not know how to run fails it, so a new
README command comes with a way to check it. README commands bind fixed addresses
(127.0.0.1:7700, 127.0.0.1:8000, /tmp/li.sock): one that is taken by
another process skips that command, saying so.
"""

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import msgpack
import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DEFAULT_MODEL = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
BIN_WORD = "./build/luainfer"
RUN_TIMEOUT_S = 300  # generous: a loaded CI machine; the whole file takes ~40 s on an idle one
TOKEN = "readme-test-token"


# ---------------------------------------------------------------------------
# Reading README.md
# ---------------------------------------------------------------------------
def code_blocks(text):
    """[(lang, body, first line number)] of the ``` fenced blocks."""
    out = []
    for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
        out.append((m.group(1), m.group(2), text.count("\n", 0, m.start()) + 2))
    return out


def shell_commands(body, first_line):
    """[(command, line number)] of an sh block: continuations joined, blank
    lines dropped."""
    cmds, cur, start = [], "", None
    for i, line in enumerate(body.splitlines()):
        start = first_line + i if start is None else start
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        cur += line
        if cur.strip():
            cmds.append((cur.strip(), start))
        cur, start = "", None
    return cmds


def readme():
    text = README.read_text()
    blocks = code_blocks(text)
    sh = [c for lang, body, line in blocks if lang == "sh" for c in shell_commands(body, line)]
    python = [body for lang, body, _ in blocks if lang == "python"]
    transcripts = [body for lang, body, _ in blocks if lang == "" and body.startswith("$ ")]
    lua = [body for lang, body, _ in blocks if lang == "lua"]
    return sh, python, transcripts, lua


SH, PYTHON, TRANSCRIPTS, LUA = readme()


def words(cmd):
    return shlex.split(cmd, comments=True)


def kind(cmd):
    w = words(cmd)
    if w[:1] == ["make"] and len(w) == 2:
        return "make"
    if w[:2] == [BIN_WORD, "serve"]:
        return "serve"
    if w[:1] == [BIN_WORD]:
        return "cli"
    return None


# ---------------------------------------------------------------------------
# Checks that need no binary
# ---------------------------------------------------------------------------
def test_readme_has_the_commands_it_should():
    assert len(SH) >= 8 and PYTHON and TRANSCRIPTS and len(LUA) >= 2, "README.md's code blocks were not found"


@pytest.mark.parametrize("cmd,line", SH, ids=[f"line{line}" for _, line in SH])
def test_every_command_is_known(cmd, line):
    assert kind(cmd), f"README.md line {line}: no way to check this command here: {cmd}"


def repo_paths(cmd):
    """Arguments that name files in the repository (a folder and a dot)."""
    return [a for a in words(cmd)[1:]
            if "/" in a and not a.startswith(("/", "unix:", "$")) and re.search(r"\.\w+$", a)]


@pytest.mark.parametrize("cmd,line", SH, ids=[f"line{line}" for _, line in SH])
def test_named_files_exist(cmd, line):
    missing = [p for p in repo_paths(cmd) if not (REPO / p).exists()]
    assert not missing, f"README.md line {line} names missing files {missing}: {cmd}"


# ---------------------------------------------------------------------------
# Running them
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def env(luainfer_bin, model_path):
    return dict(os.environ, TOKEN=TOKEN)  # the README's serve line passes "$TOKEN"


def with_binary(cmd, luainfer_bin):
    assert cmd.startswith(BIN_WORD + " ") or cmd == BIN_WORD
    return shlex.quote(str(luainfer_bin)) + cmd[len(BIN_WORD):]


def run_shell(cmd, env, cwd=REPO, stdin=None, timeout=RUN_TIMEOUT_S):
    try:
        return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, input=stdin, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"timed out after {timeout}s: {cmd}")


CLI = [(c, line) for c, line in SH if kind(c) == "cli"]
SERVE = [(c, line) for c, line in SH if kind(c) == "serve"]
MAKE = [(c, line) for c, line in SH if kind(c) == "make"]


@pytest.mark.parametrize("cmd,line", CLI, ids=[f"line{line}" for _, line in CLI])
def test_cli_command_runs(cmd, line, luainfer_bin, env):
    r = run_shell(with_binary(cmd, luainfer_bin), env)
    assert r.returncode == 0, f"README.md line {line} exited {r.returncode}: {cmd}\n{r.stderr[-2000:]}"
    assert r.stdout.strip(), f"README.md line {line} printed nothing: {cmd}"


@pytest.mark.parametrize("cmd,line", MAKE, ids=[f"line{line}" for _, line in MAKE])
def test_make_target_exists(cmd, line, env):
    target = words(cmd)[1]
    r = run_shell(f"make -n --no-print-directory {shlex.quote(target)}", env, timeout=60)
    assert r.returncode == 0, f"README.md line {line}: make -n {target} failed:\n{r.stderr[-2000:]}"
    scripts = set()
    for l in r.stdout.splitlines():
        first = l.split()[:1]
        # what the recipe runs from the tree; build outputs are made on the way
        if first and "/" in first[0] and not first[0].lstrip("./").startswith("build"):
            scripts.add(first[0])
    missing = [s for s in scripts if not (REPO / s).exists()]
    assert not missing, f"README.md line {line}: make {target} runs missing scripts {missing}"


def tcp_free(host, port):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def rpc_health(addr):
    if addr.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX)
        s.connect(addr[5:])
    else:
        host, port = addr.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=30)
    with s:
        s.settimeout(30)
        s.sendall(msgpack.packb([0, 1, "health", {}]))
        unp = msgpack.Unpacker(raw=False)
        while True:
            data = s.recv(65536)
            assert data, f"{addr} closed the connection before answering"
            unp.feed(data)
            for msg in unp:
                if msg[0] == 1 and msg[1] == 1:
                    return msg


def http_health(addr):
    with urllib.request.urlopen(f"http://{addr}/health", timeout=30) as r:
        return r.status, r.read()


@pytest.mark.parametrize("cmd,line", SERVE, ids=[f"line{line}" for _, line in SERVE])
def test_serve_command_answers(cmd, line, luainfer_bin, env, tmp_path):
    w = words(cmd)
    tcp = [a for flag, a in zip(w, w[1:]) if flag in ("--listen", "--http") and not a.startswith("unix:")]
    if "--listen" not in w:
        tcp.append("127.0.0.1:7700")  # serve's default listener
    for a in tcp:
        host, port = a.rsplit(":", 1)
        if not tcp_free(host, int(port)):
            pytest.skip(f"{a} is in use by another process; README.md line {line} binds it")
    for a in [a for flag, a in zip(w, w[1:]) if flag == "--listen" and a.startswith("unix:")]:
        if os.path.exists(a[5:]):
            pytest.skip(f"{a[5:]} exists (another server?); README.md line {line} listens there")

    log = open(tmp_path / "stderr.log", "w+")
    proc = subprocess.Popen(["bash", "-c", "exec " + with_binary(cmd, luainfer_bin)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=log, text=True)
    addrs, lines = [], []
    got = threading.Condition()

    def read_stdout():  # a thread: a blocking read must not stall the deadline
        for l in proc.stdout:
            with got:
                lines.append(l)
                got.notify()
        with got:
            lines.append(None)
            got.notify()

    threading.Thread(target=read_stdout, daemon=True).start()
    try:
        deadline = time.time() + RUN_TIMEOUT_S
        want = len(tcp) + sum(a.startswith("unix:") for a in w)
        with got:
            while len(addrs) < want:
                while not lines and time.time() < deadline:
                    got.wait(0.5)
                l = lines.pop(0) if lines else None
                if l is None:
                    log.seek(0)
                    pytest.fail(f"README.md line {line} did not start: {cmd}\n{log.read()[-2000:]}")
                m = re.search(r"listening on (\S+) \(([\w-]+)\)", l)
                if m:
                    addrs.append((m.group(1), m.group(2)))
        for addr, proto in addrs:
            if proto == "http":
                status, body = http_health(addr)
                assert status == 200 and b"ok" in body, f"{addr}/health: {status} {body!r}"
                if addr == "127.0.0.1:8000":  # the README's Python example talks to this one
                    for code in PYTHON:
                        r = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                           text=True, timeout=RUN_TIMEOUT_S, cwd=REPO)
                        assert r.returncode == 0 and r.stdout.strip(), f"README's Python example:\n{r.stderr[-2000:]}"
            else:
                msg = rpc_health(addr)
                assert msg[2] is None and msg[3], f"{addr} health: {msg}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    log.seek(0)
    assert proc.returncode == 0, f"README.md line {line} exited {proc.returncode} on SIGTERM:\n{log.read()[-2000:]}"


@pytest.mark.parametrize("block", TRANSCRIPTS, ids=lambda b: b.splitlines()[0][2:])
def test_transcript(block, luainfer_bin, model_path, env):
    first, *rest = block.splitlines()
    feed = [l[2:] for l in rest if l.startswith("> ") and l != "> ^D"]
    shown = [l for l in rest if not l.startswith(">")]
    r = run_shell(with_binary(first[2:], luainfer_bin), env, stdin="\n".join(feed) + "\n")
    assert r.returncode == 0, f"{first} exited {r.returncode}:\n{r.stderr[-2000:]}"
    out = r.stdout.splitlines()
    if Path(model_path).resolve() != DEFAULT_MODEL.resolve():
        pytest.skip(f"the transcript's outputs are the default model's; LUAINFER_MODEL is {model_path}")
    assert out == shown, f"{first}: README shows\n{shown}\ngot\n{out}"


def test_lua_snippets(luainfer_bin, env, tmp_path):
    """The policy file the README writes, then the script that uses it."""
    (tmp_path / "policies").mkdir()
    for p in (REPO / "policies").glob("*.lua"):
        (tmp_path / "policies" / p.name).symlink_to(p)
    scripts = []
    for body in LUA:
        m = re.match(r"-- (policies/\w+\.lua)", body)
        if m:
            dest = tmp_path / m.group(1)
            if dest.is_symlink():
                dest.unlink()
            dest.write_text(body)
        else:
            scripts.append(body)
    assert scripts, "README.md has no Lua script block"
    for i, body in enumerate(scripts):
        path = tmp_path / f"script{i}.lua"
        path.write_text(body)
        r = run_shell(f"{shlex.quote(str(luainfer_bin))} run {path.name}", env, cwd=tmp_path)
        assert r.returncode == 0, f"README's Lua script {i}:\n{body}\nexited {r.returncode}:\n{r.stderr[-2000:]}"


# ---------------------------------------------------------------------------
# Commands in the README's running text (inline code), not in code blocks
# ---------------------------------------------------------------------------
def inline_commands():
    """`luainfer ...` and `.venv/bin/python ...` spans of the prose, line
    breaks joined. Usage forms with [OPTIONAL] parts are syntax, not commands."""
    text = README.read_text()
    cmds = [" ".join(m.group(1).split()) for m in re.finditer(r"`((?:\.venv/bin/python|luainfer) [^`]+)`", text)]
    return [c for c in cmds if "[" not in c]


INLINE = inline_commands()
HF_CONVERT = re.compile(r"\.venv/bin/python tools/gguf_to_hf\.py OUT_DIR( .*)? --gguf-out REF\.gguf$")


def inline_kind(cmd):
    if HF_CONVERT.fullmatch(cmd):
        return "hf_convert"
    if cmd == "luainfer generate --model OUT_DIR":
        return "hf_generate"  # checked with hf_convert: OUT_DIR is what that command made
    if re.fullmatch(r"luainfer repl --connect 127\.0\.0\.1:7700", cmd):
        return "repl_connect"
    return None


def test_inline_commands_are_known():
    assert INLINE, "README.md's inline commands were not found"
    unknown = [c for c in INLINE if not inline_kind(c)]
    assert not unknown, f"README.md inline commands with no check here: {unknown}"


@pytest.mark.skipif(not any(inline_kind(c) == "hf_convert" for c in INLINE), reason="README shows no gguf_to_hf.py")
def test_inline_hf_conversion(luainfer_bin, model_path, tmp_path):
    """The README's gguf_to_hf.py line, run as written (OUT_DIR and REF.gguf
    in a scratch directory), then `luainfer generate --model OUT_DIR`: the
    reference GGUF's tokens and logits, bit for bit, as the README says."""
    pytest.importorskip("safetensors")
    pytest.importorskip("tokenizers")
    pytest.importorskip("transformers")
    cmd = next(c for c in INLINE if inline_kind(c) == "hf_convert")
    out, ref = tmp_path / "OUT_DIR", tmp_path / "REF.gguf"
    cmd = cmd.replace("OUT_DIR", shlex.quote(str(out))).replace("REF.gguf", shlex.quote(str(ref)))
    r = run_shell(cmd, dict(os.environ))
    assert r.returncode == 0, f"{cmd}\n{r.stderr[-2000:]}"
    assert (out / "config.json").is_file() and ref.is_file()
    if Path(model_path).resolve() == DEFAULT_MODEL.resolve():  # the size the README's --shard-size gives it
        assert (out / "model.safetensors.index.json").is_file(), list(out.iterdir())
    gen = []
    for m in (out, ref):
        g = run_shell(f"{shlex.quote(str(luainfer_bin))} generate --model {shlex.quote(str(m))} --prompt 'The capital "
                      f"of France is' --max-tokens 8 --temperature 0 --json --top-logits 4 --threads 2", dict(os.environ))
        assert g.returncode == 0, g.stderr[-2000:]
        gen.append(json.loads(g.stdout))
    assert gen[0]["tokens"] == gen[1]["tokens"] and gen[0]["top_logits"] == gen[1]["top_logits"]


@pytest.mark.skipif(not any(inline_kind(c) == "repl_connect" for c in INLINE), reason="README shows no repl --connect")
def test_inline_repl_connect(luainfer_bin, model_path, tmp_path):
    """`luainfer repl --connect 127.0.0.1:7700` against a running server (on
    that address when it is free, else on a free port), driving it."""
    from test_server import Server
    addr = "127.0.0.1:7700" if tcp_free("127.0.0.1", 7700) else "127.0.0.1:0"
    s = Server(luainfer_bin, ["--listen", addr, "--no-http", "--threads", "2", "--kv-memory", "16M"], 1, tmp_path)
    try:
        r = run_shell(f"{shlex.quote(str(luainfer_bin))} repl --connect {s.rpc}", dict(os.environ),
                      stdin="server:tokenize('hello world')\n")
        assert r.returncode == 0, r.stderr[-2000:]
        assert f"connected to {s.rpc}" in r.stdout, r.stdout
        if Path(model_path).resolve() == DEFAULT_MODEL.resolve():  # the default model's ids, as the README shows
            assert "{28120, 905}" in r.stdout, r.stdout
    finally:
        assert s.stop() == 0
