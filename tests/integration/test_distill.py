"""`luainfer distill` (issue 15, core/train/): a few steps on the real model.

The student is the default model requantized to Q4_0 (so it differs from the
Q4_1 teacher); the text is the start of tests/data/plrabn12.txt (calibration
and training text; alice29.txt is held out and never trained on), short
enough to be one window, so every step sees the same batch and the printed
loss and KL must fall. The checkpoint must load, generate and show in
`luainfer info`. --self-generate trains on the teacher's samples. Ctrl-C
writes a checkpoint; a student with another
vocabulary and bad options are refused with one line.
"""

import re
import signal
import subprocess

import numpy as np
import pytest

from test_cli_errors import assert_clean_failure

STEP = re.compile(r"^step (\d+)/(\d+): loss ([0-9.]+)\s+kl ([0-9.]+)", re.M)
LR = re.compile(r"^step (\d+)/\d+: .*  lr ([0-9.e+-]+)  ", re.M)


def hf_lr(kind, lr, warmup, total):
    """The rate of each step: a float64 transcription of transformers'
    get_{constant,cosine,linear}_schedule_with_warmup lambdas (num_cycles
    0.5), evaluated at the scheduler's step before each optimizer step."""
    out = []
    for s in range(total):
        if s < warmup:
            f = s / max(1, warmup)
        elif kind == "constant":
            f = 1.0
        else:
            progress = (s - warmup) / max(1, total - warmup)
            if kind == "cosine":
                f = max(0.0, 0.5 * (1.0 + np.cos(np.pi * 2.0 * 0.5 * progress)))
            else:
                f = max(0.0, (total - s) / max(1, total - warmup))
        out.append(lr * f)
    return np.array(out, dtype=np.float64)


@pytest.fixture(scope="module")
def ddir(tmp_path_factory):
    return tmp_path_factory.mktemp("distill")


@pytest.fixture(scope="module")
def student(run_ok, model_path, ddir):
    out = ddir / "student_q4_0.gguf"
    run_ok(["quantize", "--method", "q4_0", model_path, out])
    return out


@pytest.fixture(scope="module")
def text(repo_root, ddir):
    words = (repo_root / "tests" / "data" / "plrabn12.txt").read_text(errors="replace").split()
    path = ddir / "train.txt"
    path.write_text(" ".join(words[200:230]) + "\n")  # ~40 tokens: one window of 24
    return path


def distill(model_path, student, text, out, *extra):
    return ["distill", "--teacher", model_path, "--student", student, "--data", text,
            "--seq-len", "24", "--lr", "3e-3", "--threads", "2", *extra, out]


def test_distill_loss_falls_and_checkpoint_loads(run_ok, model_path, student, text, ddir):
    out = ddir / "healed.gguf"
    r = run_ok(distill(model_path, student, text, out, "--steps", "3", "--train", "norms", "--dtype", "f16"))
    steps = [(int(a), float(l), float(k)) for a, _, l, k in STEP.findall(r.stdout)]
    assert [s for s, _, _ in steps] == [1, 2, 3], r.stdout
    (_, l1, k1), (_, _, _), (_, l3, k3) = steps
    assert l3 < l1 and k3 < k1, f"loss {l1} -> {l3}, KL {k1} -> {k3}:\n{r.stdout}"
    assert out.is_file()
    info = run_ok(["info", "--model", out])
    assert re.search(r"^\s*f16\s+211 tensors", info.stdout, re.M), info.stdout[:2000]
    g = run_ok(["generate", "--model", out, "--prompt", "Of man's first disobedience", "--max-tokens", "4",
                "--temperature", "0"])
    assert g.stdout.strip(), g.stderr


@pytest.fixture(scope="module")
def healed_f32(run_ok, model_path, text, ddir):
    """One step on the last block's matrices, written f32: the values the
    quantized checkpoints below must hold after the gguf package's quantizers.
    The student is the shipped model (Q4_1 matrices, a Q8_0 embedding)."""
    out = ddir / "heal_f32.gguf"
    run_ok(distill(model_path, model_path, text, out, *HEAL, "--dtype", "f32"))
    return out


HEAL = ("--steps", "1", "--train", "layers:29-29")


@pytest.mark.parametrize("dtype", ["source", "q4_1", "bf16"])
def test_distill_quantized_checkpoint(run_ok, model_path, text, ddir, healed_f32, dtype):
    """--dtype source writes each matrix in the student file's type (so a
    healed model keeps its size and speed), q4_1/bf16 every matrix in that
    type: byte for byte the gguf package's quantizer of the f32 run's values
    (training is deterministic), norms f32, general.file_type as llama.cpp
    numbers it (source: the student's); the file loads and generates."""
    gguf = pytest.importorskip("gguf", reason="the gguf package (tools/requirements-test.txt) checks the bytes")
    out = ddir / f"heal_{dtype}.gguf"
    r = run_ok(distill(model_path, model_path, text, out, *HEAL, "--dtype", dtype))
    assert f"({dtype} weights)" in r.stdout, r.stdout
    T = gguf.GGMLQuantizationType
    ref = {t.name: t for t in gguf.GGUFReader(str(healed_f32)).tensors}
    src = {t.name: t.tensor_type for t in gguf.GGUFReader(str(model_path)).tensors}
    got = gguf.GGUFReader(str(out))
    types = set()
    for t in got.tensors:
        w = ref[t.name]
        if len(w.shape) == 1:
            assert t.tensor_type == T.F32 and bytes(t.data) == bytes(w.data), t.name
            continue
        want = src[t.name] if dtype == "source" else T[dtype.upper()]
        assert t.tensor_type == want, (t.name, t.tensor_type, want)
        rows = np.asarray(w.data, dtype=np.float32).reshape(int(w.shape[1]), int(w.shape[0]))
        assert gguf.quants.quantize(rows, want).tobytes() == bytes(t.data), t.name
        types.add(want)
    assert types == ({T.Q4_1, T.Q8_0} if dtype == "source" else {T[dtype.upper()]})
    ft = got.fields["general.file_type"]
    assert int(ft.parts[ft.data[0]][0]) == {"source": 3, "q4_1": 3, "bf16": 32}[dtype]
    if dtype == "source":  # the same size as the student
        assert abs(out.stat().st_size - model_path.stat().st_size) < 65536
    g = run_ok(["generate", "--model", out, "--prompt", "Of man's first disobedience", "--max-tokens", "4",
                "--temperature", "0"])
    assert g.stdout.strip(), g.stderr


def test_distill_qat(run_ok, model_path, text, ddir):
    """--qat --dtype source: trained through the student's own rounding (the
    unit test test_train checks the straight-through step and that the file
    holds the trained weights); here the real model's run writes the
    student's types and the file generates."""
    gguf = pytest.importorskip("gguf", reason="the gguf package (tools/requirements-test.txt) reads the types")
    out = ddir / "heal_qat.gguf"
    r = run_ok(distill(model_path, model_path, text, out, "--steps", "2", "--train", "layers:28-29", "--dtype",
                       "source", "--qat"))
    assert "(quantization-aware)" in r.stdout and len(STEP.findall(r.stdout)) == 2, r.stdout
    src = {t.name: t.tensor_type for t in gguf.GGUFReader(str(model_path)).tensors}
    assert {t.name: t.tensor_type for t in gguf.GGUFReader(str(out)).tensors} == src
    g = run_ok(["generate", "--model", out, "--prompt", "Of man's first disobedience", "--max-tokens", "4",
                "--temperature", "0"])
    assert g.stdout.strip(), g.stderr


@pytest.mark.parametrize("kind,warmup", [("cosine", 2), ("linear", 1), ("constant", 3)])
def test_distill_lr_schedule(run_ok, model_path, student, text, ddir, kind, warmup):
    r = run_ok(distill(model_path, student, text, ddir / "sched.gguf", "--steps", "7", "--train", "norms",
                       "--lr-schedule", kind, "--warmup", str(warmup)))
    got = [(int(s), float(v)) for s, v in LR.findall(r.stdout)]
    assert [s for s, _ in got] == list(range(1, 8)), r.stdout
    want = hf_lr(kind, 3e-3, warmup, 7)
    # printed with 4 significant digits
    np.testing.assert_allclose([v for _, v in got], want, rtol=1e-3, atol=1e-12, err_msg=r.stdout)


@pytest.mark.parametrize("streams", ["1", "16"])
def test_distill_self_generate(run_ok, model_path, student, ddir, streams):
    out = ddir / f"self{streams}.gguf"
    args = [a for a in distill(model_path, student, "-", out, "--steps", "2", "--train", "norms",
                               "--dtype", "f16", "--self-generate", "50", "--streams", streams)]
    i = args.index("--data")
    del args[i:i + 2]
    r = run_ok(args)
    assert "50 tokens of the teacher's samples" in r.stdout, r.stdout
    assert len(STEP.findall(r.stdout)) == 2, r.stdout
    assert out.is_file()


def test_distill_ctrl_c_writes_checkpoint(luainfer_bin, model_path, student, text, ddir):
    out = ddir / "interrupted.gguf"
    args = [str(a) for a in distill(model_path, student, text, out, "--steps", "1000", "--train", "norms",
                                    "--dtype", "f16")]
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
    assert re.search(r"interrupted after step \d+: checkpoint written", rest), rest
    assert out.is_file()


def test_distill_refuses_other_vocabulary(run_cli, model_path, text, ddir, repo_root):
    gguf = pytest.importorskip("gguf", reason="the gguf package (tools/requirements-test.txt) makes the student")
    import numpy as np
    src = gguf.GGUFReader(str(repo_root / "tests" / "golden" / "spm_tiny.gguf"))
    tokens = [bytes(src.fields["tokenizer.ggml.tokens"].parts[i]).decode("utf-8", "replace")
              for i in src.fields["tokenizer.ggml.tokens"].data]
    path = ddir / "other_vocab.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    d, ff, nv = 16, 32, len(tokens)
    for k, v in (("context_length", 64), ("embedding_length", d), ("block_count", 1),
                 ("feed_forward_length", ff), ("attention.head_count", 2), ("attention.head_count_kv", 2)):
        w.add_uint32(f"llama.{k}", v)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * nv)
    w.add_token_types([1] * nv)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((nv, d), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(d, dtype=np.float32))
    for name, shape in (("attn_norm", (d,)), ("ffn_norm", (d,)), ("attn_q", (d, d)), ("attn_k", (d, d)),
                        ("attn_v", (d, d)), ("attn_output", (d, d)), ("ffn_gate", (ff, d)), ("ffn_up", (ff, d)),
                        ("ffn_down", (d, ff))):
        w.add_tensor(f"blk.0.{name}.weight", rng.standard_normal(shape, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = run_cli(distill(model_path, path, text, ddir / "x.gguf", "--steps", "1"))
    assert_clean_failure(r, r"vocabulary has \d+ tokens, the teacher's 49152")


@pytest.mark.parametrize("extra,pattern", [
    (["--train", "layers:9-3"], r"layers:A-B"),
    (["--train", "heads"], r"unknown parameter set"),
    (["--alpha", "1.5"], r"--alpha"),
    (["--seq-len", "1"], r"--seq-len"),
    (["--dtype", "q6_k"], r"--dtype must be f32, f16, q8_0, bf16, q4_0, q4_1 or source \(got 'q6_k'\)"),
    (["--streams", "0"], r"--streams must be in 1\.\.256"),
    (["--qat"], r"--qat trains through the checkpoint's rounding: give --dtype"),
    (["--qat", "--dtype", "q4_1", "--train", "lora:4"], r"--qat does not apply to LoRA"),
    (["--train", "layers:0-99"], r"blocks 0\.\.29"),
    (["--lr-schedule", "exp"], r"--lr-schedule must be constant, cosine or linear"),
    (["--warmup", "1"], r"--warmup must be in 0\.\.0"),
])
def test_distill_bad_options(run_cli, model_path, student, text, ddir, extra, pattern):
    r = run_cli(distill(model_path, student, text, ddir / "bad.gguf", "--steps", "1", *extra))
    assert_clean_failure(r, pattern)


def test_distill_required_and_output(run_cli, model_path, student, text, tmp_path):
    assert_clean_failure(run_cli(["distill", "--student", student, "--data", text, tmp_path / "o.gguf"]),
                         r"--teacher, --student and --data")
    assert_clean_failure(run_cli(distill(model_path, student, text, tmp_path / "no" / "dir" / "o.gguf")),
                         r"cannot write")
    assert_clean_failure(run_cli(distill(model_path, student, text, tmp_path / "o.gguf", "--self-generate", "9")),
                         r"exclude each other")
    short = tmp_path / "short.txt"
    short.write_text("Of man's first disobedience")
    assert_clean_failure(run_cli(distill(model_path, student, short, tmp_path / "o.gguf")), r"fewer than --seq-len")
    # too few samples asked for is refused before any is sampled (and before the student trains)
    r = run_cli(["distill", "--teacher", model_path, "--student", student, "--self-generate", "24", "--seq-len", "24",
                 tmp_path / "o.gguf"])
    assert_clean_failure(r, r"distill: --self-generate 24 tokens, fewer than --seq-len \+ 1 = 25")
    assert "self-generate:" not in r.stderr and "self-generate:" not in r.stdout
    assert not (tmp_path / "o.gguf").exists()
