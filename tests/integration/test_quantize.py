"""`luainfer quantize` (issue 14): the file format, the GGUF types checked
against the `gguf` package's own quantizers, determinism, loading the
outputs, and the one-line errors.

The baseline is the default Q4_1 model expanded to F16 (--method f16);
q8_0 / q4_0 / q4_1 are made from it, as the issue's tables are.
"""

import hashlib
import struct
import subprocess
import sys

import re

import numpy as np
import pytest

from test_cli_errors import assert_clean_failure

gguf = pytest.importorskip("gguf", reason="the gguf package (tools/requirements-test.txt) is needed")
from gguf import GGUFReader, GGMLQuantizationType, quants  # noqa: E402

# Tensors compared byte for byte: whole layers at both ends and the middle,
# and the first rows of the embedding (rows quantize independently; all 211
# tensors take ~50 s in NumPy per type, too long for a test).
CHECK_LAYERS = (0, 15, 29)
EMBD_ROWS = 2048


def quantize(run_cli, *args, timeout=600):
    return run_cli(["quantize", *[str(a) for a in args]], timeout=timeout)


@pytest.fixture(scope="module")
def qdir(tmp_path_factory):
    return tmp_path_factory.mktemp("quant")


@pytest.fixture(scope="module")
def f16_model(run_cli, model_path, qdir):
    out = qdir / "f16.gguf"
    r = quantize(run_cli, "--method", "f16", model_path, out)
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def typed_models(run_cli, f16_model, qdir):
    outs = {}
    for m in ("q8_0", "q4_0", "q4_1"):
        out = qdir / f"{m}.gguf"
        r = quantize(run_cli, "--method", m, f16_model, out)
        assert r.returncode == 0, r.stderr
        outs[m] = out
    return outs


def checked(name):
    if name == "token_embd.weight":
        return True
    return any(name.startswith(f"blk.{l}.") for l in CHECK_LAYERS)


@pytest.mark.parametrize("method", ["q8_0", "q4_0", "q4_1"])
def test_types_byte_identical_to_gguf_package(f16_model, typed_models, method):
    base = GGUFReader(f16_model)
    out = {t.name: t for t in GGUFReader(typed_models[method]).tensors}
    qt = getattr(GGMLQuantizationType, method.upper())
    n = 0
    for t in base.tensors:
        o = out[t.name]
        if len(t.shape) != 2:  # norms: f32 in, f32 out, unchanged
            assert o.tensor_type == GGMLQuantizationType.F32
            assert np.asarray(o.data).tobytes() == np.asarray(t.data).astype(np.float32).tobytes()
            continue
        assert t.tensor_type == GGMLQuantizationType.F16
        assert o.tensor_type == qt, t.name
        if not checked(t.name):
            continue
        f = np.asarray(t.data).view(np.float16).astype(np.float32).reshape(int(t.shape[1]), int(t.shape[0]))
        rows = EMBD_ROWS if t.name == "token_embd.weight" else f.shape[0]
        want = quants.quantize(f[:rows], qt).tobytes()
        got = np.asarray(o.data).tobytes()[:len(want)]
        assert got == want, f"{method} {t.name}: bytes differ from gguf.quants.quantize"
        n += 1
    assert n == 1 + 7 * len(CHECK_LAYERS)  # the embedding, 7 linear weights per layer


def test_metadata_copied_and_named(model_path, typed_models):
    src = GGUFReader(model_path)
    out = GGUFReader(typed_models["q4_0"])
    keys = set(out.fields)
    for k in src.fields:
        if k.startswith("GGUF.") or k == "general.file_type":
            continue
        assert k in keys, f"metadata key {k} was not copied"
    def val(r, k):
        f = r.fields[k]
        return f.contents() if hasattr(f, "contents") else f.parts[f.data[0]]
    assert val(out, "luainfer.quant.method") == "q4_0"
    assert int(val(out, "luainfer.quant.version")) == 1
    assert int(val(out, "general.file_type")) == 2  # LLAMA_FTYPE_MOSTLY_Q4_0
    assert val(out, "tokenizer.ggml.tokens") == val(src, "tokenizer.ggml.tokens")
    # data offsets aligned as GGUF wants (32 by default)
    assert all(t.data_offset % 32 == 0 for t in out.tensors)


def test_deterministic(run_cli, f16_model, typed_models, qdir):
    again = qdir / "q4_1_again.gguf"
    r = quantize(run_cli, "--method", "q4_1", f16_model, again)
    assert r.returncode == 0, r.stderr
    h = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()
    assert h(again) == h(typed_models["q4_1"])


def test_outputs_load_and_run(run_ok, typed_models, f16_model, repo_root):
    for m in ("q8_0", "q4_0"):
        r = run_ok(["generate", "--model", typed_models[m], "--prompt", "The capital of France is",
                    "--max-tokens", "4", "--temperature", "0"])
        assert r.stdout.strip(), f"{m}: no text"
    r = run_ok(["perplexity", "--model", typed_models["q8_0"], "--file", repo_root / "tests/data/alice_ch1.txt",
                "--ctx", "128", "--chunks", "1", "--json"])
    assert 1 < r.json()["perplexity"] < 200


def test_info_shows_bits_per_weight(run_ok, typed_models):
    j = run_ok(["info", typed_models["q4_0"], "--json", "--tensors"]).json()
    assert j["quantization"] == "q4_0"
    assert abs(j["bits_per_weight"] - 4.5) < 1e-9
    assert j["tensor_types"]["q4_0"]["bits_per_weight"] == 4.5
    t = next(t for t in j["tensors"] if t["name"] == "blk.0.attn_q.weight")
    assert t["scheme"] == "q4_0" and t["bits_per_weight"] == 4.5


# ---------------------------------------------------------------------------
# errors: one line, non-zero exit, no partial output
# ---------------------------------------------------------------------------

def test_error_unknown_method(run_cli, model_path, tmp_path):
    r = quantize(run_cli, "--method", "q3_x", model_path, tmp_path / "o.gguf")
    assert_clean_failure(r, r"unknown method 'q3_x'")
    assert not list(tmp_path.iterdir())


def test_error_group_not_applicable(run_cli, model_path, tmp_path):
    r = quantize(run_cli, "--method", "q8_0", "--group", "100", model_path, tmp_path / "o.gguf")
    assert_clean_failure(r, r"--group")


def test_error_unwritable_output(run_cli, model_path, tmp_path):
    r = quantize(run_cli, "--method", "f16", model_path, tmp_path / "no" / "such" / "dir.gguf")
    assert_clean_failure(r, r"cannot write")
    r = quantize(run_cli, "--method", "f16", model_path, tmp_path)
    assert_clean_failure(r, r"is a directory")


def test_error_missing_and_corrupt_input(run_cli, tmp_path):
    r = quantize(run_cli, "--method", "f16", tmp_path / "missing.gguf", tmp_path / "o.gguf")
    assert_clean_failure(r, r"missing\.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 60)
    r = quantize(run_cli, "--method", "f16", bad, tmp_path / "o.gguf")
    assert_clean_failure(r, r"gguf|version|truncated|invalid")
    assert not (tmp_path / "o.gguf").exists()


def test_error_input_cannot_be_dequantized(run_cli, typed_models, tmp_path):
    """A tensor of a type we cannot read (iq4_nl: the same 18 bytes per 32
    as q4_0, so only the type id changes)."""
    data = bytearray(typed_models["q4_0"].read_bytes())
    name = b"blk.0.attn_q.weight"
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    tpos = at + 4 + 8 * n_dims
    assert struct.unpack_from("<I", data, tpos)[0] == 2
    struct.pack_into("<I", data, tpos, 20)  # GGML_TYPE_IQ4_NL
    src = tmp_path / "iq4.gguf"
    src.write_bytes(bytes(data))
    r = quantize(run_cli, "--method", "q8_0", src, tmp_path / "o.gguf")
    assert_clean_failure(r, r"cannot dequantize.*iq4_nl")
    assert not (tmp_path / "o.gguf").exists()


# ---------------------------------------------------------------------------
# W8A8 (SmoothQuant) and FP8: calibration, loading, kernels end to end
# ---------------------------------------------------------------------------
CALIB = "tests/data/plrabn12.txt"


@pytest.fixture(scope="module")
def scheme_models(run_cli, f16_model, qdir, repo_root):
    outs = {}
    for name, args in (("w8a8", ["--method", "w8a8", "--calib", repo_root / CALIB, "--samples", "1",
                                 "--seq-len", "64"]),
                       ("fp8", ["--method", "fp8"]),
                       # rotated (test_quantize_rotate.py): the online Hadamard in every forward
                       ("w8a8-rot", ["--method", "w8a8", "--rotate"])):
        out = qdir / f"{name}.gguf"
        r = quantize(run_cli, *args, f16_model, out)
        assert r.returncode == 0, r.stderr
        outs[name] = out
    return outs


def test_scheme_files_described(run_ok, scheme_models, f16_model):
    for name, act in (("w8a8", "int8"), ("fp8", "fp8")):
        j = run_ok(["info", scheme_models[name], "--json", "--tensors"]).json()
        assert j["scheme"] == name and j["quantization"] == f"{name}, activations {act}"
        t = {t["name"]: t for t in j["tensors"]}
        assert t["blk.0.attn_q.weight"]["type"] == "i8" and t["blk.0.attn_q.weight"]["scheme"] == name
        # 8 bits + one f32 scale per row of 576: 8 + 32/576
        assert abs(t["blk.0.attn_q.weight"]["bits_per_weight"] - (8 + 32 / 576)) < 1e-9
        assert t["blk.0.attn_q.weight.scale"]["scheme"] == "scales"
        assert t["token_embd.weight"]["type"] == "q8_0"
    r = GGUFReader(scheme_models["w8a8"])
    f = r.fields
    assert bytes(f["luainfer.quant.smooth"].parts[-1]).decode() == "all"
    assert bytes(f["luainfer.quant.calib.file"].parts[-1]).decode() == "plrabn12.txt"
    # smoothing changed the norms (folded scales); fp8 without --calib did not
    def norm(path):
        t = next(t for t in GGUFReader(path).tensors if t.name == "blk.3.attn_norm.weight")
        return np.asarray(t.data, dtype=np.float32)
    assert not np.array_equal(norm(scheme_models["w8a8"]), norm(f16_model))
    assert np.array_equal(norm(scheme_models["fp8"]), norm(f16_model))


def test_w8a8_gptq(run_cli, run_ok, scheme_models, f16_model, qdir, repo_root):
    """--gptq: the same smoothing and per-row scales as round to nearest,
    codes moved by the error feedback (test_quant4_ref.py checks them
    against a NumPy GPTQ), a file that loads and runs."""
    out = qdir / "w8a8-gptq.gguf"
    r = quantize(run_cli, "--method", "w8a8", "--gptq", "--calib", repo_root / CALIB, "--samples", "1",
                 "--seq-len", "64", f16_model, out)
    assert r.returncode == 0, r.stderr
    f = GGUFReader(out).fields
    assert bool(f["luainfer.quant.gptq"].parts[-1][0]) and "luainfer.quant.gptq.act_order" not in f
    t_g = {t.name: t for t in GGUFReader(out).tensors}
    t_r = {t.name: t for t in GGUFReader(scheme_models["w8a8"]).tensors}
    for name in ("blk.0.attn_q.weight", "blk.7.ffn_down.weight", "blk.29.attn_output.weight"):
        assert np.array_equal(np.asarray(t_g[name + ".scale"].data), np.asarray(t_r[name + ".scale"].data)), name
        a = np.asarray(t_g[name].data).astype(np.int16)
        b = np.asarray(t_r[name].data).astype(np.int16)
        moved = float((a != b).mean())
        assert 0.01 < moved < 0.9 and np.abs(a - b).max() <= 127, (name, moved)
    for key in ("blk.3.attn_norm.weight", "blk.3.ffn_norm.weight"):  # SmoothQuant ran as without --gptq
        assert np.array_equal(np.asarray(t_g[key].data), np.asarray(t_r[key].data)), key
    r = run_ok(["generate", "--model", out, "--prompt", "The capital of France is", "--max-tokens", "8",
                "--temperature", "0"])
    assert r.stdout.strip()


def test_w8a8_alpha_search(run_cli, run_ok, scheme_models, f16_model, qdir, repo_root, tmp_path, monkeypatch):
    """--alpha-search picks an alpha of the grid per layer and site (logged),
    writes alpha_search instead of alpha, and the file runs. The grid runs
    over the threads: one thread writes the same bytes as three (on a
    2-block cut of the baseline, tools/gen_tiny_llama.py: the suite's time)."""
    out = qdir / "w8a8-as.gguf"
    monkeypatch.setenv("LUAINFER_LOG", "info")
    args = ["quantize", "--method", "w8a8", "--alpha-search", "--calib", repo_root / CALIB, "--samples", "1",
            "--seq-len", "64"]
    r = run_cli([*args, f16_model, "--threads", "3", out], timeout=600)
    monkeypatch.delenv("LUAINFER_LOG")
    assert r.returncode == 0, r.stderr
    tiny = tmp_path / "tiny.gguf"
    subprocess.run([sys.executable, str(repo_root / "tools/gen_tiny_llama.py"), str(f16_model), str(tiny)],
                   check=True, timeout=600)
    by = {}
    for th in ("1", "3"):
        by[th] = tmp_path / f"as{th}.gguf"
        run_ok([*args, tiny, "--threads", th, by[th]], timeout=600)
    assert by["1"].read_bytes() == by["3"].read_bytes(), "--alpha-search depends on the thread count"
    chosen = {}
    for line in r.stderr.splitlines():
        m = re.search(r"alpha search: ([a-z/]+): (.*)", line)
        if m:
            chosen[m.group(1)] = [float(v) for v in m.group(2).split()]
    assert set(chosen) == {"q/k/v", "o", "gate/up", "down"}, r.stderr[-2000:]
    for site, al in chosen.items():
        assert len(al) == 30 and all(round(a * 10) == a * 10 and 0 <= a <= 1 for a in al), (site, al)
    f = GGUFReader(out).fields
    assert bool(f["luainfer.quant.alpha_search"].parts[-1][0]) and "luainfer.quant.alpha" not in f
    # the same calibration as the fixed-alpha file: the norms differ only where the search left 0.5
    n_as = np.asarray(next(t for t in GGUFReader(out).tensors if t.name == "blk.0.attn_norm.weight").data)
    n_05 = np.asarray(next(t for t in GGUFReader(scheme_models["w8a8"]).tensors
                           if t.name == "blk.0.attn_norm.weight").data)
    assert np.array_equal(n_as, n_05) == (chosen["q/k/v"][0] == 0.5)
    r = run_ok(["generate", "--model", out, "--prompt", "The capital of France is", "--max-tokens", "8",
                "--temperature", "0"])
    assert r.stdout.strip()
    for args, needle in ((["--method", "fp8", "--alpha-search"], "--alpha-search applies to --method w8a8"),
                         (["--method", "w8a8", "--alpha-search", "--alpha", "0"], "not --smooth none or --alpha 0")):
        r = run_cli(["quantize", *args, "--calib", repo_root / CALIB, f16_model, tmp_path / "x.gguf"])
        assert r.returncode != 0 and needle in r.stderr, r.stderr


def test_scheme_models_same_tokens_on_every_isa(run_cli, run_ok, scheme_models):
    """int8 dots are exact and the fp8 dot is one fixed-order f32 sum (w8_kernels.h),
    so scalar, AVX2, AVX-512 and AMX give the same greedy text."""
    isas = ["scalar", "avx2"]
    for isa in ("avx512", "amx"):  # amx: the int8 panels on AMX tiles (w8_amx.c)
        probe = run_cli(["generate", "--isa", isa, "--prompt", "a", "--max-tokens", "1", "--temperature", "0"])
        if probe.returncode == 0:
            isas.append(isa)
        else:
            print(f"{isa} not compared: {probe.stderr.strip()[-200:]}")
    for name, path in scheme_models.items():
        outs = set()
        for isa in isas:
            r = run_ok(["generate", "--model", path, "--isa", isa, "--prompt", "The capital of France is",
                        "--max-tokens", "8", "--temperature", "0"])
            outs.add(r.stdout)
        assert len(outs) == 1 and next(iter(outs)).strip(), (name, isas, outs)


def test_scheme_perplexity_near_baseline(run_ok, scheme_models, f16_model, repo_root):
    text = repo_root / "tests/data/alice_ch1.txt"
    ppl = lambda m: run_ok(["perplexity", "--model", m, "--file", text, "--ctx", "128", "--chunks", "2",
                            "--json"]).json()["perplexity"]
    base = ppl(f16_model)
    for name, path in scheme_models.items():
        p = ppl(path)
        assert abs(p / base - 1) < 0.15, (name, p, base)


def test_error_calibration(run_cli, f16_model, tmp_path, repo_root):
    out = tmp_path / "o.gguf"
    r = quantize(run_cli, "--method", "w8a8", f16_model, out)
    assert_clean_failure(r, r"needs --calib")
    r = quantize(run_cli, "--method", "w8a8", "--calib", tmp_path / "none.txt", f16_model, out)
    assert_clean_failure(r, r"none\.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    r = quantize(run_cli, "--method", "w8a8", "--calib", empty, f16_model, out)
    assert_clean_failure(r, r"is empty")
    r = quantize(run_cli, "--method", "w8a8", "--calib", repo_root / "tests/data/sample.txt", "--samples", "4",
                 "--seq-len", "512", f16_model, out)
    assert_clean_failure(r, r"too short: \d+ tokens.*needs 2048")
    r = quantize(run_cli, "--method", "w8a8", "--alpha", "1.5", "--calib", empty, f16_model, out)
    assert_clean_failure(r, r"--alpha")
    r = quantize(run_cli, "--method", "w8a8", "--smooth", "half", "--calib", empty, f16_model, out)
    assert_clean_failure(r, r"--smooth")
    assert not out.exists() and not list(tmp_path.glob("o.gguf.tmp*"))


def test_serve_and_ngram_speculation_exact(scheme_models, typed_models, luainfer_bin, tmp_path):
    """serve --model OUT works for each scheme, and n-gram speculation on it
    gives exactly its non-speculative greedy output."""
    from test_server import Rpc, Server, stream, THREADS
    prompts = ["one two three four five six seven eight nine ten one two three four five six",
               "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"]
    for name, path in (("w8a8", scheme_models["w8a8"]), ("fp8", scheme_models["fp8"]),
                       ("w8a8-rot", scheme_models["w8a8-rot"]), ("q4_0", typed_models["q4_0"])):
        base = Server(luainfer_bin, ["--model", str(path), "--listen", "127.0.0.1:0", "--threads", THREADS,
                                     "--kv-memory", "32M"], 1, tmp_path)
        spec = Server(luainfer_bin, ["--model", str(path), "--listen", "127.0.0.1:0", "--threads", THREADS,
                                     "--kv-memory", "32M", "--spec-tokens", "4"], 1, tmp_path)
        try:
            ref = Rpc(base.rpc)
            for p in prompts:
                params = {"prompt": p, "max_tokens": 32, "temperature": 0, "ignore_eos": True}
                want = ref.ok("generate", params)
                text, toks, got = stream(spec.rpc, params)
                assert got["tokens"] == want["tokens"] and got["text"] == want["text"] == text, name
            eng = Rpc(spec.rpc).ok("stats")["engine"]
            assert eng["spec_drafted"] > 0, (name, eng)
            ref.close()
        finally:
            assert base.stop() == 0, base.stderr()[-2000:]
            assert spec.stop() == 0, spec.stderr()[-2000:]
