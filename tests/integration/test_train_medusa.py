"""`luainfer train-medusa` (issue 15, core/train/medusa.h): a few steps on the real model.

Windows of 16 tokens of the start of tests/data/plrabn12.txt (training text;
alice29.txt is held out: only --eval reads it). The heads file's metadata and
tensors are read with the gguf package against docs/medusa.md; training is
deterministic with --seed; --eval (after training, and alone with
--heads-file) prints one agreement row per head; Ctrl-C writes the file and
exits 130; bad input gets one line naming the problem.
"""

import re
import signal
import subprocess

import pytest

from test_cli_errors import assert_clean_failure

STEP = re.compile(r"^step (\d+)/(\d+): loss ([0-9.]+)\s+heads((?: [0-9.]+)+)", re.M)
ROW = re.compile(r"^\s+(\d)\s+t\+(\d)\s+(\d+)\s+([0-9.]+)%\s+([0-9.]+)%", re.M)


@pytest.fixture(scope="module")
def mdir(tmp_path_factory):
    return tmp_path_factory.mktemp("medusa")


@pytest.fixture(scope="module")
def text(repo_root, mdir):
    words = (repo_root / "tests" / "data" / "plrabn12.txt").read_text(errors="replace").split()
    path = mdir / "train.txt"
    path.write_text(" ".join(words[200:260]) + "\n")  # ~80 tokens: a few windows of 16
    return path


@pytest.fixture(scope="module")
def eval_text(repo_root, mdir):
    words = (repo_root / "tests" / "data" / "alice29.txt").read_text(errors="replace").split()
    path = mdir / "eval.txt"
    path.write_text(" ".join(words[300:340]) + "\n")
    return path


def train(model_path, text, out, *extra):
    return ["train-medusa", "--model", model_path, "--data", text, "--seq-len", "16", "--lr", "3e-3",
            "--threads", "2", *extra, out]


@pytest.fixture(scope="module")
def heads(run_ok, model_path, text, eval_text, mdir):
    out = mdir / "heads.gguf"
    r = run_ok(train(model_path, text, out, "--heads", "2", "--steps", "3", "--seed", "5",
                     "--eval", eval_text))
    return out, r


def test_train_medusa_steps_and_eval(heads):
    out, r = heads
    steps = STEP.findall(r.stdout)
    assert [int(s) for s, _, _, _ in steps] == [1, 2, 3], r.stdout
    assert all(len(h.split()) == 2 for _, _, _, h in steps), r.stdout
    assert re.search(r"wrote .*heads\.gguf \(2 heads, F32, 48 tokens trained", r.stdout), r.stdout
    rows = ROW.findall(r.stdout)
    assert [(int(k), int(o)) for k, o, *_ in rows] == [(1, 2), (2, 3)], r.stdout
    for _, _, n, top1, top5 in rows:
        assert int(n) > 0 and 0 <= float(top1) <= float(top5) <= 100, r.stdout


def test_train_medusa_file_format(heads, model_path):
    gguf = pytest.importorskip("gguf", reason="the gguf package (tools/requirements-test.txt) reads the heads")
    import numpy as np
    out, _ = heads
    f = gguf.GGUFReader(str(out))

    def val(key):
        fld = f.fields[key]
        v = fld.parts[fld.data[0]]
        return bytes(v).decode() if fld.types[0] == gguf.GGUFValueType.STRING else v[0]

    assert val("general.architecture") == "medusa"
    assert val("medusa.version") == 1 and val("medusa.n_heads") == 2
    assert val("medusa.n_embd") == 576 and val("medusa.n_vocab") == 49152
    assert val("medusa.hidden") == "post_norm"
    assert re.fullmatch(r"[0-9a-f]{16}", val("medusa.base.vocab_hash"))
    base = gguf.GGUFReader(str(model_path))
    bn = base.fields["general.name"]
    assert val("medusa.base.name") == bytes(bn.parts[bn.data[0]]).decode()
    assert val("medusa.train.steps") == 3 and val("medusa.train.tokens") == 48
    t = {x.name: x for x in f.tensors}
    assert sorted(t) == ["medusa.0.bias", "medusa.0.weight", "medusa.1.bias", "medusa.1.weight"]
    for k in range(2):
        w, b = t[f"medusa.{k}.weight"], t[f"medusa.{k}.bias"]
        assert list(w.shape) == [576, 576] and w.tensor_type == gguf.GGMLQuantizationType.F32
        assert list(b.shape) == [576] and b.tensor_type == gguf.GGMLQuantizationType.F32
        assert np.abs(np.asarray(w.data)).max() > 0, "three AdamW steps from zero moved nothing"


def test_train_medusa_deterministic(run_ok, model_path, text, heads, mdir):
    out, _ = heads
    again = mdir / "again.gguf"
    run_ok(train(model_path, text, again, "--heads", "2", "--steps", "3", "--seed", "5"))
    assert again.read_bytes() == out.read_bytes()


def test_train_medusa_eval_alone(run_ok, run_cli, model_path, heads, eval_text):
    out, r = heads
    e = run_ok(["train-medusa", "--model", model_path, "--heads-file", out, "--eval", eval_text,
                "--seq-len", "16", "--threads", "2"])
    assert ROW.findall(e.stdout) == ROW.findall(r.stdout), e.stdout
    bad = run_cli(["train-medusa", "--model", model_path, "--heads-file", model_path, "--eval", eval_text,
                   "--seq-len", "16"])
    assert_clean_failure(bad, r"general\.architecture is 'llama', expected 'medusa'")


def test_train_medusa_self_generate(run_ok, model_path, mdir):
    out = mdir / "self.gguf"
    r = run_ok(["train-medusa", "--model", model_path, "--heads", "1", "--self-generate", "40",
                "--seq-len", "16", "--steps", "1", "--threads", "2", out])
    assert "40 tokens of the base's samples" in r.stdout, r.stdout
    assert out.is_file()


def test_train_medusa_ctrl_c_writes_heads(luainfer_bin, model_path, text, mdir):
    out = mdir / "interrupted.gguf"
    args = [str(a) for a in train(model_path, text, out, "--heads", "1", "--steps", "100000")]
    p = subprocess.Popen([str(luainfer_bin)] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in p.stdout:
            if line.startswith("step 1/"):
                p.send_signal(signal.SIGINT)
                break
        rest, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err[-2000:]
    assert re.search(r"interrupted after step \d+: heads written to", rest), rest
    assert out.is_file()


@pytest.mark.parametrize("extra,pattern", [
    (["--heads", "0"], r"--heads must be in 1\.\.8"),
    (["--heads", "9"], r"--heads must be in 1\.\.8"),
    (["--heads", "2", "--alpha", "2"], r"--alpha"),
    (["--heads", "2", "--seq-len", "4"], r"--seq-len 4 leaves head 2"),
    (["--heads", "2", "--dtype", "q4_0"], r"--dtype"),
    (["--heads", "2", "--self-generate", "10"], r"exclude each other"),
])
def test_train_medusa_bad_options(run_cli, model_path, text, mdir, extra, pattern):
    assert_clean_failure(run_cli(train(model_path, text, mdir / "bad.gguf", "--steps", "1", *extra)), pattern)


def test_train_medusa_bad_input(run_cli, model_path, text, mdir, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("Of man's first disobedience\n")
    assert_clean_failure(run_cli(train(model_path, short, mdir / "o.gguf", "--heads", "1")),
                         r"short\.txt has \d+ tokens, fewer than --seq-len 16")
    assert_clean_failure(run_cli(train(model_path, tmp_path / "missing.txt", mdir / "o.gguf", "--heads", "1")),
                         r"missing\.txt")
    assert_clean_failure(run_cli(train(model_path, text, tmp_path / "no" / "dir" / "o.gguf", "--heads", "1")),
                         r"cannot write")
    assert_clean_failure(run_cli(["train-medusa", "--model", model_path, "--heads", "1", mdir / "o.gguf"]),
                         r"--data FILE or --self-generate N is required")
    assert_clean_failure(run_cli(["train-medusa", "--model", model_path, "--heads-file", mdir / "o.gguf"]),
                         r"--heads-file needs --eval")
