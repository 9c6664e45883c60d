"""Shared fixtures for the integration tests that drive the luainfer binary.

Environment:
  LUAINFER_BIN      path of the binary      (default: <repo>/build/luainfer)
  LUAINFER_MODEL    path of the GGUF model  (default: <repo>/models/SmolLM2-135M-Instruct.Q4_1.gguf)
  LUAINFER_THREADS  if set, passed as --threads to generate/perplexity
  LUAINFER_CLI_LOG  if set, a file each run_cli call appends its seconds and
                    arguments to (where a slow test spends its time)

Tests that need the binary or the model skip (with the reason) when either is
missing. The parity tests add rows to PARITY_REPORT; at the end of the session
they are printed as a table (always, even without -s) and written to
build/parity_report.json.
"""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO_ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_TIMEOUT_S = 300

# Filled by test_parity.py: {"generate": {name: row}, "perplexity": {ctx: row},
# "pooled_vs_exact": {...}}
PARITY_REPORT = {"generate": {}, "perplexity": {}}


# ---------------------------------------------------------------------------
# Paths
# ---------------------------------------------------------------------------
@pytest.fixture(scope="session")
def repo_root():
    return REPO_ROOT


@pytest.fixture(scope="session")
def luainfer_bin():
    path = Path(os.environ.get("LUAINFER_BIN", REPO_ROOT / "build" / "luainfer"))
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.skip(f"luainfer binary not found or not executable: {path} "
                    "(build it, or set LUAINFER_BIN)")
    return path


@pytest.fixture(scope="session")
def model_path():
    path = Path(os.environ.get("LUAINFER_MODEL", DEFAULT_MODEL))
    if not path.is_file():
        pytest.skip(f"model not found: {path} (set LUAINFER_MODEL)")
    return path


@pytest.fixture(scope="session")
def thread_args():
    n = os.environ.get("LUAINFER_THREADS")
    return ["--threads", n] if n else []


# ---------------------------------------------------------------------------
# Running the CLI
# ---------------------------------------------------------------------------
class CliResult:
    """What one run of the binary gave: return code, raw and decoded output."""

    def __init__(self, args, proc):
        self.args = args
        self.returncode = proc.returncode
        self.stdout_bytes = proc.stdout
        self.stderr_bytes = proc.stderr
        self.stdout = proc.stdout.decode("utf-8", errors="replace")
        self.stderr = proc.stderr.decode("utf-8", errors="replace")

    def json(self):
        """stdout parsed as one JSON object (strict UTF-8)."""
        try:
            return json.loads(self.stdout_bytes.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            pytest.fail(f"stdout is not one UTF-8 JSON object ({e}); "
                        f"args={self.describe()}\nstdout[:500]={self.stdout[:500]!r}\n"
                        f"stderr[-500:]={self.stderr[-500:]!r}")

    def describe(self):
        shown = [a if len(a) < 80 else a[:60] + f"...<{len(a)} chars>" for a in self.args]
        return " ".join(shown)


@pytest.fixture(scope="session")
def run_cli(luainfer_bin):
    """run_cli(args, timeout=...) -> CliResult.

    args are the arguments after the binary name. A run that outlives its
    timeout fails the test (a hang is a bug too).
    """

    def run(args, timeout=DEFAULT_TIMEOUT_S, stdin=subprocess.DEVNULL):
        args = [str(a) for a in args]
        t0 = time.monotonic()
        try:
            proc = subprocess.run([str(luainfer_bin)] + args, stdin=stdin,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  timeout=timeout, cwd=REPO_ROOT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"luainfer timed out after {timeout}s: {' '.join(args)[:300]}")
        if os.environ.get("LUAINFER_CLI_LOG"):
            with open(os.environ["LUAINFER_CLI_LOG"], "a") as f:
                f.write(f"{time.monotonic() - t0:8.2f} {os.environ.get('PYTEST_CURRENT_TEST', '')}: "
                        f"{' '.join(args)[:200]}\n")
        return CliResult(args, proc)

    return run


@pytest.fixture(scope="session")
def run_ok(run_cli):
    """Like run_cli, but fails the test unless the exit code is 0."""

    def run(args, timeout=DEFAULT_TIMEOUT_S):
        r = run_cli(args, timeout=timeout)
        if r.returncode != 0:
            pytest.fail(f"luainfer exited {r.returncode}: {r.describe()}\n"
                        f"stderr[-2000:]:\n{r.stderr[-2000:]}")
        return r

    return run


# ---------------------------------------------------------------------------
# Parity report
# ---------------------------------------------------------------------------
@pytest.fixture(scope="session")
def run_on_pty():
    """run(cmd, env=None, timeout) -> (exit code, what it wrote to stderr),
    with stderr on a pseudo-terminal (stdout discarded): what a progress
    bar draws for a user at a terminal."""
    import pty

    def run(cmd, env=None, timeout=DEFAULT_TIMEOUT_S):
        master, slave = pty.openpty()
        p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL, stderr=slave, env=env)
        os.close(slave)
        out = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        os.close(master)
        return p.wait(timeout=timeout), out.decode(errors="replace")

    return run


@pytest.fixture(scope="session")
def parity_report():
    """The session's report dict; tests add rows to it (see PARITY_REPORT)."""
    return PARITY_REPORT


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def _report_lines():
    gen = PARITY_REPORT["generate"]
    ppl = PARITY_REPORT["perplexity"]
    lines = []
    if gen:
        lines.append("luainfer vs llama.cpp, greedy 64 tokens, top-40 logits "
                     "(gap: llama.cpp/exact logit gap to our token at the divergence; "
                     "|d|: on ids in both top-40s)")
        lines.append(f"{'prompt':<19} {'gold':>4} {'ours':>4} {'same':>4} {'div':>4} "
                     f"{'gap':>7} {'gap_ex':>7} {'max|d|':>7} {'mean|d|':>7} "
                     f"{'us-ex':>6} {'cpp-ex':>6} {'top1':>5}")
        for name, r in gen.items():
            lines.append(
                f"{name[:19]:<19} {r['n_golden']:>4} {r['n_ours']:>4} {r['n_identical']:>4} "
                f"{_fmt(r['diverged_at'], 'd'):>4} {_fmt(r['tie_gap'], '.4f'):>7} "
                f"{_fmt(r.get('ref_gap'), '.4f'):>7} "
                f"{_fmt(r['max_abs_logit_diff'], '.4f'):>7} "
                f"{_fmt(r['mean_abs_logit_diff'], '.4f'):>7} "
                f"{_fmt(r.get('mean_abs_diff_ours_vs_exact'), '.3f'):>6} "
                f"{_fmt(r.get('mean_abs_diff_llama_vs_exact'), '.3f'):>6} "
                f"{_fmt(r['top1_agreement'], '.3f'):>5}")
        diffs = [r["max_abs_logit_diff"] for r in gen.values()
                 if r["max_abs_logit_diff"] is not None]
        if diffs:
            lines.append(f"overall max |logit diff| = {max(diffs):.4f}; "
                         f"identical tokens {sum(r['n_identical'] for r in gen.values())}"
                         f"/{sum(r['n_golden'] for r in gen.values())}")
    pooled = PARITY_REPORT.get("pooled_vs_exact")
    if pooled:
        lines.append(f"mean |logit - exact| over {pooled['n_pairs']} logits: luainfer "
                     f"{pooled['ours_mean']:.4f}, llama.cpp {pooled['llama_cpp_mean']:.4f}")
    if ppl:
        lines.append("perplexity (tests/data/alice_ch1.txt)")
        for ctx, r in sorted(ppl.items()):
            lines.append(f"  ctx={ctx:<4} ours={_fmt(r['ours'], '.4f')} "
                         f"llama.cpp={r['llama_cpp']:.4f} "
                         f"rel_diff={_fmt(r['rel_diff'], '+.4%')}")
    return lines


# Under pytest-xdist (tools/run_tests.sh runs `-n 2 --dist loadfile`: a
# file's tests on one worker) the tests run in worker processes: the worker
# that ran the parity tests writes the report, and the controller prints
# the file it finds from this session.
PARITY_JSON = REPO_ROOT / "build" / "parity_report.json"
_SESSION_START = None


def pytest_sessionstart(session):
    global _SESSION_START
    import time
    _SESSION_START = time.time()


def pytest_sessionfinish(session):
    if not (PARITY_REPORT["generate"] or PARITY_REPORT["perplexity"]):
        return
    try:
        PARITY_JSON.parent.mkdir(parents=True, exist_ok=True)
        tmp = PARITY_JSON.with_suffix(f".tmp.{os.getpid()}")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(PARITY_REPORT, f, indent=1, ensure_ascii=False)
        os.replace(tmp, PARITY_JSON)
    except OSError as e:
        print(f"could not write {PARITY_JSON}: {e}")




def pytest_terminal_summary(terminalreporter):
    if not (PARITY_REPORT["generate"] or PARITY_REPORT["perplexity"]):
        # a worker ran them: show the report it wrote during this session
        try:
            if _SESSION_START is None or PARITY_JSON.stat().st_mtime < _SESSION_START:
                return
            data = json.loads(PARITY_JSON.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        PARITY_REPORT["generate"].update(data.get("generate", {}))
        PARITY_REPORT["perplexity"].update(data.get("perplexity", {}))
        written = False
    else:
        written = True
    terminalreporter.section("parity report")
    for line in _report_lines():
        terminalreporter.write_line(line)
    if written:
        terminalreporter.write_line(f"written to {PARITY_JSON.relative_to(REPO_ROOT)}")
