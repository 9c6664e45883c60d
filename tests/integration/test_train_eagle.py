"""`luainfer train-eagle` (core/train/eagle.h, docs/eagle.md): a few steps on the real model.

Windows of 32 tokens of the start of tests/data/plrabn12.txt (training text;
alice29.txt is held out: only --eval reads it), a draft vocabulary of 512.
The draft file's metadata and tensors are read with the gguf package against
docs/eagle.md and loaded back through li_eagle_file_check (`--draft FILE
--eval`); training is deterministic with --seed; Ctrl-C writes the file and
exits 130; bad input gets one line naming the problem.
"""

import re
import signal
import subprocess

import numpy as np
import pytest

from test_cli_errors import assert_clean_failure

STEP = re.compile(r"^step (\d+)/(\d+): loss ([0-9.]+)\s+steps((?: [0-9.]+)+)\s+top-1((?: [0-9.]+%)+)"
                  r"\s+grad-norm [0-9.]+\s+lr \S+\s+(\d+) tok/s", re.M)
ROW = re.compile(r"^\s+(\d)\s+([0-9.]+)%\s+([0-9.]+)%\s+([0-9.]+)$", re.M)


@pytest.fixture(scope="module")
def edir(tmp_path_factory):
    return tmp_path_factory.mktemp("eagle")


@pytest.fixture(scope="module")
def text(repo_root, edir):
    words = (repo_root / "tests" / "data" / "plrabn12.txt").read_text(errors="replace").split()
    path = edir / "train.txt"
    path.write_text(" ".join(words[200:700]) + "\n")  # ~650 tokens: some windows of 32
    return path


@pytest.fixture(scope="module")
def eval_text(repo_root, edir):
    words = (repo_root / "tests" / "data" / "alice29.txt").read_text(errors="replace").split()
    path = edir / "eval.txt"
    path.write_text(" ".join(words[300:420]) + "\n")
    return path


def train(model_path, text, out, *extra):
    return ["train-eagle", "--model", model_path, "--data", text, "--seq-len", "32", "--batch", "2",
            "--threads", "2", *extra, out]


TINY = ["--steps", "3", "--seed", "5", "--draft-vocab", "512"]


@pytest.fixture(scope="module")
def draft(run_ok, model_path, text, eval_text, edir):
    out = edir / "draft.gguf"
    r = run_ok(train(model_path, text, out, *TINY, "--eval", eval_text, "--eval-tokens", "128"))
    return out, r


def gguf_reader(path):
    gguf = pytest.importorskip("gguf", reason="the gguf package (tools/requirements-test.txt) reads the draft")
    return gguf, gguf.GGUFReader(str(path))


def kv(gguf, f, key):
    fld = f.fields[key]
    v = fld.parts[fld.data[0]]
    return bytes(v).decode() if fld.types[0] == gguf.GGUFValueType.STRING else v[0]


def test_train_eagle_steps_and_eval(draft):
    out, r = draft
    steps = STEP.findall(r.stdout)
    assert [int(s[0]) for s in steps] == [1, 2, 3], r.stdout
    for _, _, loss, per, top1, tps in steps:
        assert len(per.split()) == 3 and len(top1.split()) == 3 and int(tps) > 0, r.stdout
        # the window's loss is the steps' losses weighted 1, 0.8, 0.64
        lj = [float(x) for x in per.split()]
        assert abs(float(loss) - (lj[0] + 0.8 * lj[1] + 0.64 * lj[2])) < 2e-3, r.stdout
    assert "features 2,15,29, |V| 512, J 3" in r.stdout, r.stdout
    assert re.search(r"wrote .*draft\.gguf \(F32, 192 tokens trained in", r.stdout), r.stdout
    rows = ROW.findall(r.stdout)
    assert [int(j) for j, *_ in rows] == [0, 1, 2], r.stdout
    for _, top1, greedy, kl in rows:
        assert 0 <= float(greedy) <= 100 and 0 <= float(top1) <= 100 and float(kl) > 0, r.stdout


def test_train_eagle_file_format(draft, model_path):
    out, _ = draft
    gguf, f = gguf_reader(out)
    import numpy as np
    assert kv(gguf, f, "general.architecture") == "eagle" and kv(gguf, f, "eagle.version") == 1
    shape = {k: kv(gguf, f, "eagle." + k) for k in ("n_embd", "n_vocab", "n_head", "n_head_kv", "head_dim", "n_ff")}
    assert shape == {"n_embd": 576, "n_vocab": 49152, "n_head": 9, "n_head_kv": 3, "head_dim": 64, "n_ff": 1536}
    assert kv(gguf, f, "eagle.n_features") == 3
    assert [kv(gguf, f, f"eagle.feature_layer.{i}") for i in range(3)] == [2, 15, 29]
    assert re.fullmatch(r"[0-9a-f]{16}", kv(gguf, f, "eagle.base.vocab_hash"))
    assert kv(gguf, f, "eagle.base.n_layer") == 30
    base = gguf.GGUFReader(str(model_path))
    assert kv(gguf, f, "eagle.base.name") == kv(gguf, base, "general.name")
    assert kv(gguf, f, "eagle.train.steps") == 3 and kv(gguf, f, "eagle.train.tokens") == 192
    assert kv(gguf, f, "eagle.train.ttt") == 3
    t = {x.name: x for x in f.tensors}
    want = {"eagle.fc.weight": [1728, 576], "eagle.attn_q.weight": [1152, 576], "eagle.attn_k.weight": [1152, 192],
            "eagle.attn_v.weight": [1152, 192], "eagle.attn_output.weight": [576, 576],
            "eagle.ffn_gate.weight": [576, 1536], "eagle.ffn_up.weight": [576, 1536],
            "eagle.ffn_down.weight": [1536, 576]}
    norms = ["eagle.enorm.weight", "eagle.hnorm.weight", "eagle.ffn_norm.weight", "eagle.output_norm.weight"]
    assert sorted(t) == sorted(list(want) + norms + ["eagle.vocab"])
    for name, dims in want.items():
        assert list(t[name].shape) == dims and t[name].tensor_type == gguf.GGMLQuantizationType.F32, name
    for name in norms:
        assert list(t[name].shape) == [576] and t[name].tensor_type == gguf.GGMLQuantizationType.F32, name
    v = np.asarray(t["eagle.vocab"].data)
    assert t["eagle.vocab"].tensor_type == gguf.GGMLQuantizationType.I32 and v.shape == (512,)
    assert (np.diff(v) > 0).all() and v[0] >= 0 and v[-1] < 49152
    # three steps from the seeded start moved the norms off one
    assert np.abs(np.asarray(t["eagle.hnorm.weight"].data) - 1).max() > 0


def test_train_eagle_deterministic(run_ok, model_path, text, draft, edir):
    out, _ = draft
    again = edir / "again.gguf"
    run_ok(train(model_path, text, again, *TINY))
    assert again.read_bytes() == out.read_bytes()


def test_train_eagle_eval_alone(run_ok, run_cli, model_path, draft, eval_text):
    out, r = draft
    e = run_ok(["train-eagle", "--model", model_path, "--draft", out, "--eval", eval_text, "--eval-tokens", "128",
                "--seq-len", "32", "--threads", "2"])
    assert ROW.findall(e.stdout) == ROW.findall(r.stdout), e.stdout
    bad = run_cli(["train-eagle", "--model", model_path, "--draft", model_path, "--eval", eval_text,
                   "--seq-len", "32"])
    assert_clean_failure(bad, r"general\.architecture is 'llama', expected 'eagle'")


def test_train_eagle_other_base_refused(run_cli, model_path, draft, eval_text, edir):
    out, _ = draft
    gguf, f = gguf_reader(out)
    h = kv(gguf, f, "eagle.base.vocab_hash")
    other = h[:-1] + ("0" if h[-1] != "0" else "1")
    data = out.read_bytes()
    assert data.count(h.encode()) == 1
    path = edir / "other_base.gguf"
    path.write_bytes(data.replace(h.encode(), other.encode()))
    r = run_cli(["train-eagle", "--model", model_path, "--draft", path, "--eval", eval_text, "--seq-len", "32"])
    assert_clean_failure(r, rf"draft made for '.*' \(vocab hash {other}\), the model '.*' has {h}")


def test_train_eagle_resume_self_generate(run_ok, model_path, text, draft, edir):
    out, _ = draft
    res = edir / "resumed.gguf"
    r = run_ok(train(model_path, text, res, "--resume", out, "--steps", "1"))
    assert "features 2,15,29, |V| 512" in r.stdout, r.stdout
    gguf, f = gguf_reader(res)
    assert list({x.name: x for x in f.tensors}["eagle.vocab"].shape) == [512]
    # --draft-vocab with --resume: a new vocabulary, the block trained on from
    # the file (a rate too small to move a float32 weight of this size)
    rv = edir / "revocab.gguf"
    r = run_ok(train(model_path, text, rv, "--resume", out, "--steps", "1", "--draft-vocab", "64", "--lr", "1e-12"))
    assert "features 2,15,29, |V| 64" in r.stdout, r.stdout
    _, fo = gguf_reader(out)
    _, fr = gguf_reader(rv)
    to, tr = {x.name: x for x in fo.tensors}, {x.name: x for x in fr.tensors}
    v = np.asarray(tr["eagle.vocab"].data)
    assert v.shape == (64,) and np.all(np.diff(v) > 0)
    for name in ("eagle.fc.weight", "eagle.attn_q.weight", "eagle.ffn_down.weight"):
        a, b = np.asarray(to[name].data, dtype=np.float64), np.asarray(tr[name].data, dtype=np.float64)
        assert a.shape == b.shape and np.abs(a - b).max() < 1e-6, name
    # the base's own samples, the whole vocabulary (no eagle.vocab), chosen feature blocks, F16
    sg = edir / "self.gguf"
    r = run_ok(["train-eagle", "--model", model_path, "--self-generate", "64", "--seq-len", "32", "--batch", "1",
                "--steps", "1", "--draft-vocab", "0", "--features", "1,5", "--ttt", "2", "--dtype", "f16",
                "--threads", "2", sg])
    assert "64 tokens of the base's samples" in r.stdout and "features 1,5, |V| 49152, J 2" in r.stdout, r.stdout
    gguf, f = gguf_reader(sg)
    t = {x.name: x for x in f.tensors}
    assert "eagle.vocab" not in t
    assert [kv(gguf, f, f"eagle.feature_layer.{i}") for i in range(2)] == [1, 5]
    assert t["eagle.fc.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    assert t["eagle.hnorm.weight"].tensor_type == gguf.GGMLQuantizationType.F32


@pytest.mark.parametrize("dtype", ["q8_0", "q4_1"])
def test_train_eagle_block_types(run_ok, model_path, text, eval_text, draft, edir, dtype):
    """--dtype q8_0 / q4_1: the f32 run's matrices through the gguf
    package's quantizer of that type, byte for byte (norms stay f32); the
    engine drafts with it and keeps the greedy tokens of no speculation;
    --draft --eval reads it."""
    out, _ = draft
    q8 = edir / f"{dtype}.gguf"
    r = run_ok(train(model_path, text, q8, *TINY, "--dtype", dtype))
    assert f"({dtype.upper()}," in r.stdout, r.stdout
    gguf, f32 = gguf_reader(out)
    _, fq = gguf_reader(q8)
    import numpy as np
    want = {t.name: t for t in f32.tensors}
    n_q8 = 0
    for t in fq.tensors:
        w = want[t.name]
        if t.name == "eagle.vocab" or w.tensor_type == gguf.GGMLQuantizationType.F32 and len(w.shape) == 1:
            assert bytes(t.data) == bytes(w.data), t.name
            continue
        qt = getattr(gguf.GGMLQuantizationType, dtype.upper())
        assert t.tensor_type == qt, t.name
        rows = np.asarray(w.data, dtype=np.float32).reshape(int(w.shape[1]), int(w.shape[0]))
        assert gguf.quants.quantize(rows, qt).tobytes() == bytes(t.data), t.name
        n_q8 += 1
    assert n_q8 == 8
    run_ok(["train-eagle", "--model", model_path, "--draft", q8, "--eval", eval_text, "--eval-tokens", "128",
            "--seq-len", "32", "--threads", "2"])
    args = ["generate", "--model", model_path, "--prompt", "The old lighthouse", "--temperature", "0",
            "--max-tokens", "16", "--json", "--threads", "2"]
    base = run_ok(args).json()
    got = run_ok([*args, "--eagle", q8]).json()
    assert got["tokens"] == base["tokens"] and got["speculation"]["method"] == "eagle", got


def test_train_eagle_ctrl_c_writes_draft(luainfer_bin, model_path, text, edir):
    out = edir / "interrupted.gguf"
    args = [str(a) for a in train(model_path, text, out, "--draft-vocab", "512", "--steps", "100000")]
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
    assert re.search(r"interrupted after step \d+: draft written to", rest), rest
    assert out.is_file()


@pytest.mark.parametrize("extra,pattern", [
    (["--ttt", "0"], r"--ttt must be in 1\.\.8"),
    (["--ttt", "9"], r"--ttt must be in 1\.\.8"),
    (["--seq-len", "4"], r"--seq-len 4 is too short for --ttt 3 \(needs >= 5\)"),
    (["--features", "2,40"], r"--features: block 40 is not in 0\.\.29 \(the model has 30 blocks\)"),
    (["--features", "15,2"], r"--features '15,2': blocks must be ascending"),
    (["--features", "1,2,3,4,5"], r"at most 4 blocks"),
    (["--features", "x"], r"expected block numbers"),
    (["--draft-vocab", "60000"], r"--draft-vocab 60000 is larger than the vocabulary \(49152\)"),
    (["--draft-vocab", "-3"], r"--draft-vocab must be >= 0"),
    (["--alpha", "2"], r"--alpha"),
    (["--dtype", "bf16"], r"--dtype must be f32, f16, q8_0, q4_0 or q4_1"),
    (["--self-generate", "10"], r"exclude each other"),
])
def test_train_eagle_bad_options(run_cli, model_path, text, edir, extra, pattern):
    assert_clean_failure(run_cli(train(model_path, text, edir / "bad.gguf", "--steps", "1", *extra)), pattern)


def test_train_eagle_bad_input(run_cli, model_path, text, draft, edir, tmp_path):
    out, _ = draft
    short = tmp_path / "short.txt"
    short.write_text("Of man's first disobedience\n")
    assert_clean_failure(run_cli(train(model_path, short, edir / "o.gguf")),
                         r"short\.txt has \d+ tokens, fewer than --seq-len 32")
    assert_clean_failure(run_cli(train(model_path, tmp_path / "missing.txt", edir / "o.gguf")), r"missing\.txt")
    assert_clean_failure(run_cli(train(model_path, text, tmp_path / "no" / "dir" / "o.gguf")), r"cannot write")
    assert_clean_failure(run_cli(["train-eagle", "--model", model_path, edir / "o.gguf"]),
                         r"--data FILE or --self-generate N is required")
    assert_clean_failure(run_cli(["train-eagle", "--model", model_path, "--draft", out]), r"--draft needs --eval")
    assert_clean_failure(run_cli(train(model_path, text, edir / "o.gguf", "--resume", out, "--features", "1,2")),
                         r"--features come from the draft file with --resume")
    assert_clean_failure(run_cli(["train-eagle", "--model", model_path, "--draft", out, "--eval", text,
                                  "--draft-vocab", "64"]),
                         r"--features and --draft-vocab come from the draft file with --draft")
