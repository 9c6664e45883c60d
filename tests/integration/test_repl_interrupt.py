"""Ctrl-C in `luainfer repl`: it interrupts the running chunk, not the REPL.

  - through pipes: a busy loop gets SIGINT, is interrupted, the next line
    runs, EOF ends the REPL with status 0;
  - a second SIGINT the chunk does not notice (a JIT-compiled loop, which
    runs no hooks) quits, as lua.c does;
  - through a pseudo-terminal (libedit): Ctrl-C at the prompt drops the line
    and an unfinished multi-line chunk, Ctrl-C interrupts a running loop,
    Ctrl-D quits.

Uses the binary and model fixtures of conftest.py (LUAINFER_BIN,
LUAINFER_MODEL); LUAINFER_THREADS sets --threads (default 2).
"""

import os
import pty
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
THREADS = os.environ.get("LUAINFER_THREADS", "2")
TIMEOUT_S = 120


def _repl_argv(luainfer_bin, model_path):
    return [str(luainfer_bin), "repl", "--model", str(model_path), "--threads", THREADS, "--kv-memory", "32M"]


class _Reader:
    """Collects what a file descriptor yields; expect() waits for a needle."""

    def __init__(self, fd):
        self.fd = fd
        self.out = b""
        self.log = b""  # everything, for failure messages

    def expect(self, needle, timeout=TIMEOUT_S):
        deadline = time.time() + timeout
        while needle.encode() not in self.out:
            r, _, _ = select.select([self.fd], [], [], max(0, deadline - time.time()))
            if not r:
                raise AssertionError(f"timed out waiting for {needle!r}; got:\n"
                                     f"{self.log.decode(errors='replace')[-2000:]}")
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                data = b""
            if not data:
                raise AssertionError(f"EOF waiting for {needle!r}; got:\n"
                                     f"{self.log.decode(errors='replace')[-2000:]}")
            self.out += data
            self.log += data
        i = self.out.index(needle.encode()) + len(needle)
        seen, self.out = self.out[:i], self.out[i:]
        return seen.decode(errors="replace")


@pytest.fixture
def piped_repl(luainfer_bin, model_path):
    procs = []

    def start():
        # stdout is a pipe, so the REPL flushes it after each chunk: the
        # chunks below flush themselves where the test waits for them.
        p = subprocess.Popen(_repl_argv(luainfer_bin, model_path), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                             start_new_session=True)
        procs.append(p)
        return p, _Reader(p.stdout.fileno())

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def _send(p, line):
    p.stdin.write(line.encode() + b"\n")
    p.stdin.flush()


def test_sigint_interrupts_the_running_chunk(piped_repl):
    p, r = piped_repl()
    _send(p, "io.write('busy\\n') io.flush() while true do end")
    r.expect("busy")
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    r.expect("interrupted")
    # the REPL is still there, with its state
    _send(p, "x = 40")
    _send(p, "print(x + 2)")
    r.expect("42")
    # a chunk that catches errors still sees the interrupt, and goes on
    _send(p, "local ok, e = pcall(function() io.write('busy2\\n') io.flush() while true do end end) "
             "print('caught', ok, e)")
    r.expect("busy2")
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    r.expect("caught\tfalse")
    _send(p, "print(1+1)")
    r.expect("2\n")
    p.stdin.close()  # EOF: a clean exit
    assert p.wait(timeout=60) == 0, r.log.decode(errors="replace")


def test_second_sigint_quits_when_the_chunk_cannot_notice(piped_repl):
    # With the JIT on, the loop is compiled and LuaJIT runs no hooks in
    # compiled code: the first SIGINT goes unnoticed, the second one quits.
    p, r = piped_repl()
    _send(p, "jit.on() io.write('busy\\n') io.flush() while true do end")
    r.expect("busy")
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    time.sleep(0.5)
    assert p.poll() is None, "the first SIGINT should not end the REPL"
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=30) == -signal.SIGINT


class _Pty(_Reader):
    """The REPL on a pseudo-terminal (libedit line editing): send keys, wait for text."""

    def __init__(self, argv, env):
        pid, fd = pty.fork()
        if pid == 0:
            os.chdir(REPO_ROOT)
            os.execve(argv[0], argv, env)
        super().__init__(fd)
        self.pid = pid
        self.status = None

    def send(self, s):
        os.write(self.fd, s.encode())

    def prompt(self, s):
        """Waits for the "> " prompt, then types s (after a pause: keys typed
        while libedit switches the terminal's mode can be dropped)."""
        self.expect("> ")
        time.sleep(0.15)
        self.send(s)

    def wait(self, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
                return self.status
            try:
                if select.select([self.fd], [], [], 0.1)[0]:
                    self.log += os.read(self.fd, 65536)
            except OSError:
                pass
        self.close()
        raise AssertionError(f"the REPL did not exit; session:\n{self.log.decode(errors='replace')[-3000:]}")

    def close(self):
        if self.status is None:
            os.kill(self.pid, signal.SIGKILL)
            self.status = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def test_ctrl_c_through_a_pty(luainfer_bin, model_path, tmp_path):
    env = dict(os.environ, TERM="xterm", LUAINFER_HISTORY=str(tmp_path / "hist"), HOME=str(tmp_path))
    p = _Pty(_repl_argv(luainfer_bin, model_path), env)
    try:
        p.expect("help() lists")
        # Ctrl-C at the prompt drops the line typed so far
        p.prompt("error('this line was dropped')")
        time.sleep(0.2)
        p.send("\x03")
        p.prompt("print(40 + 2)\r")
        p.expect("42")
        # ... and an unfinished multi-line chunk
        p.prompt("for i = 1, 2 do\r")
        p.expect(">> ")
        time.sleep(0.15)
        p.send("\x03")
        p.prompt("print('after', 1)\r")
        seen = p.expect("after\t1")
        assert "'for' expected" not in seen and "unexpected symbol" not in seen
        # Ctrl-C while a chunk runs interrupts it and gives the prompt back
        p.prompt("io.write('busy\\n') while true do end\r")
        p.expect("busy")
        time.sleep(0.3)
        p.send("\x03")
        p.expect("interrupted")
        p.prompt("print(1 + 1)\r")
        p.expect("2")
        p.prompt("\x04")  # Ctrl-D
        assert p.wait() == 0
    finally:
        p.close()
    assert "this line was dropped" not in p.log.decode(errors="replace").split("print(40 + 2)")[1]
    hist = (tmp_path / "hist").read_text()  # libedit's format: spaces as \040
    assert "print(40" in hist and "dropped" not in hist

