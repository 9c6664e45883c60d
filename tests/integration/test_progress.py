"""Progress of the long commands (issue 16): `quantize`, `prune`, `distill`,
`train-medusa` and `train-eagle` report on stderr through core/util/progress.c. With
stderr on a terminal: one line redrawn in place (\\r, a bar, the rate, ETA,
then "took" and a newline at the end); otherwise plain whole lines (no \\r,
no escape codes), the last one at 100% with the time taken; nothing with
LUAINFER_PROGRESS=0. Each command runs at a test's size on the real model.
(The benchmarks' progress is tests/integration/test_bench.py's; setup's
model fetch is pip's bar on a terminal and tools/setup.sh's plain lines.)"""

import os
import re
import subprocess

import pytest

TIMEOUT_S = 600  # generous: a loaded CI machine


@pytest.fixture(scope="module")
def inputs(repo_root, tmp_path_factory):
    d = tmp_path_factory.mktemp("progress")
    words = (repo_root / "tests" / "data" / "plrabn12.txt").read_text(errors="replace").split()
    text = d / "train.txt"
    text.write_text(" ".join(words[200:260]) + "\n")  # a few windows of 16
    return d, text, repo_root / "tests" / "data" / "plrabn12.txt"


def commands(model_path, inputs):
    """(name, args, labels): each command and the progress labels it prints."""
    d, text, calib = inputs
    return [
        ("quantize", ["quantize", "--method", "q8_0", model_path, d / "q8.gguf"], ["quantize"]),
        ("prune", ["prune", "--what", "layers", "--keep", "29", "--rank", "kld", "--calib", calib, "--samples", "1",
                   "--seq-len", "24",
                   "--dry-run", model_path, d / "pruned.gguf"], ["calibrate", "rank"]),  # rank: the skipped-block KLD of each layer
        ("distill", ["distill", "--teacher", model_path, "--student", model_path, "--data", text, "--seq-len", "16",
                     "--steps", "3", "--train", "norms", "--threads", "2", d / "student.gguf"], ["distill"]),
        ("train-medusa", ["train-medusa", "--model", model_path, "--data", text, "--seq-len", "16", "--heads", "1",
                          "--steps", "3", "--threads", "2", d / "heads.gguf"], ["train-medusa"]),
        # a step of this small draft takes ~20 ms on Zen 5: 30 of them outlast several redraws
        ("train-eagle", ["train-eagle", "--model", model_path, "--data", text, "--seq-len", "16", "--batch", "1",
                         "--draft-vocab", "256", "--steps", "30", "--threads", "2", d / "draft.gguf"], ["train-eagle"]),
    ]


NAMES = ["quantize", "prune", "distill", "train-medusa", "train-eagle"]


def pick(model_path, inputs, name):
    return next(c for c in commands(model_path, inputs) if c[0] == name)


def env_without_progress_override():
    env = dict(os.environ)
    env.pop("LUAINFER_PROGRESS", None)
    return env


@pytest.mark.parametrize("name", NAMES)
def test_plain_lines_when_not_a_terminal(luainfer_bin, model_path, inputs, name):
    _, args, labels = pick(model_path, inputs, name)
    r = subprocess.run([str(luainfer_bin), *map(str, args)], capture_output=True, text=True, timeout=TIMEOUT_S,
                       env=env_without_progress_override())
    assert r.returncode == 0, r.stderr[-2000:]
    assert "\r" not in r.stderr and "\x1b[" not in r.stderr, repr(r.stderr[-1000:])
    for label in labels:
        lines = [l for l in r.stderr.splitlines() if l.startswith(label + ": ")]
        assert lines, f"{name}: no '{label}:' progress line in\n{r.stderr[-2000:]}"
        assert re.fullmatch(rf"{label}: (\d+)/\1 \(100%\) .*[\d.]+ \w+/s, took \S+", lines[-1]), lines[-1]
        for l in lines[:-1]:  # the periodic ones, on a slow machine
            assert re.fullmatch(rf"{label}: \d+/\d+ \(\d+%\) .*[\d.]+ \w+/s, ETA \S+", l), l
    quiet = subprocess.run([str(luainfer_bin), *map(str, args)], capture_output=True, text=True, timeout=TIMEOUT_S,
                           env=dict(os.environ, LUAINFER_PROGRESS="0"))
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert not [l for l in quiet.stderr.splitlines() if any(l.startswith(x + ": ") for x in labels)], quiet.stderr


@pytest.mark.parametrize("name", NAMES)
def test_bar_with_rate_and_eta_on_a_terminal(luainfer_bin, model_path, inputs, run_on_pty, name):
    _, args, labels = pick(model_path, inputs, name)
    rc, text = run_on_pty([luainfer_bin, *args], env=env_without_progress_override(), timeout=TIMEOUT_S)
    assert rc == 0, text[-2000:]
    assert "\x1b[K" in text, repr(text[-1000:])
    for label in labels:
        # the final redraw: the full bar, 100%, the rate, the time taken, then a newline
        assert re.search(rf"\r{label} \[#{{30}}\] 100% (\d+)/\1 .*[\d.]+ \w+/s took \S+\x1b\[K\r?\n", text), \
            f"{name}: no final '{label}' bar in {text[-1500:]!r}"
    if name in ("distill", "train-medusa", "train-eagle"):  # the runs outlast the 0.1 s between redraws
        assert re.search(rf"\r{labels[0]} \[[#.]{{30}}\] +\d+% \d+/\d+ .*[\d.]+ \w+/s ETA \S+\x1b\[K", text), \
            f"{name}: no bar with an ETA in {text[-1500:]!r}"
