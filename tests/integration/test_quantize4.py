"""`luainfer quantize` with the 4-bit methods (issue 14): rtn4, awq, gptq
(with and without act-order) and w4a4, the files they write, the one-line
errors, A8 at run time (--q4-act int8), n-gram speculation exactness and
`serve` on every method.

GPTQ's and AWQ's work grows with n_in^2 .. n_in^3 per weight, minutes on
the real model: these tests quantize a small model cut from the F16
baseline (tools/gen_tiny_llama.py: the real vocabulary, 2 blocks, FFN 256),
so every command still sees real tokens. The quantizers themselves are
checked against NumPy transcriptions of the papers in test_quant4_ref.py.
"""

import hashlib
import struct
import subprocess
import sys

import numpy as np
import pytest

from test_cli_errors import assert_clean_failure

# tools/gen_tiny_llama.py writes the small model with it
gguf = pytest.importorskip("gguf", reason="the gguf package (tools/requirements-test.txt) is needed")

CALIB = "tests/data/plrabn12.txt"
GROUP = 64  # divides 576 and 256 (the tiny model's rows); 128 does not divide 576
CAL = ["--calib", CALIB, "--samples", "1", "--seq-len", "64"]
METHODS = {
    "rtn4": ["--method", "rtn4", "--group", str(GROUP)],
    "awq": ["--method", "awq", "--group", str(GROUP), *CAL],
    "gptq": ["--method", "gptq", "--group", str(GROUP), *CAL],
    "gptq_ao": ["--method", "gptq", "--group", str(GROUP), "--act-order", *CAL],
    "w4a4": ["--method", "w4a4"],
}
PROMPT = "one two three four five six seven eight nine ten one two three four five six"


def quantize(run_cli, repo_root, *args, timeout=600):
    return run_cli(["quantize", *[str(a) for a in args]], timeout=timeout)


def sha(p):
    return hashlib.sha256(open(p, "rb").read()).hexdigest()


@pytest.fixture(scope="module")
def tiny(run_cli, model_path, repo_root, tmp_path_factory):
    d = tmp_path_factory.mktemp("q4")
    f16 = d / "f16.gguf"
    r = run_cli(["quantize", "--method", "f16", str(model_path), str(f16)], timeout=600)
    assert r.returncode == 0, r.stderr
    out = d / "tiny.gguf"
    subprocess.run([sys.executable, str(repo_root / "tools/gen_tiny_llama.py"), str(f16), str(out)], check=True,
                   timeout=600)
    f16.unlink()
    return out


@pytest.fixture(scope="module")
def q4_models(run_cli, tiny, repo_root):
    outs = {}
    for name, args in METHODS.items():
        out = tiny.parent / f"{name}.gguf"
        r = run_cli(["quantize", *args, str(tiny), str(out)], timeout=600)
        assert r.returncode == 0, (name, r.stderr)
        outs[name] = out
    return outs


def raw_tensor(path, name):
    """One tensor's bytes. A hand-rolled GGUF walk: GGUFReader parses the
    49152-token vocabulary into NumPy views, ~15 s a file on a loaded CI
    machine, for tests that want one tensor."""
    buf = open(path, "rb").read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return v[0] if len(v) == 1 else v

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip(vt):
        nonlocal pos
        if vt == 8:
            n = take("<Q")
            pos += n
        elif vt == 9:
            et, n = take("<IQ")
            if et in sizes:
                pos += sizes[et] * n
            else:
                for _ in range(n):
                    skip(et)
        else:
            pos += sizes[vt]

    assert take("<I") == 0x46554747
    _, n_t, n_kv = take("<IQQ")
    align = 32
    for _ in range(n_kv):
        n = take("<Q")
        key = buf[pos:pos + n].decode()
        pos += n
        vt = take("<I")
        if key == "general.alignment":
            align = take("<I")
        else:
            skip(vt)
    infos = []
    for _ in range(n_t):
        n = take("<Q")
        nm = buf[pos:pos + n].decode()
        pos += n
        nd = take("<I")
        ne = [take("<Q") for _ in range(nd)]
        ty, off = take("<IQ")
        infos.append((nm, ne, ty, off))
    data = (pos + align - 1) // align * align
    offs = sorted(o for _, _, _, o in infos) + [len(buf) - data]
    for nm, ne, ty, off in infos:
        if nm == name:
            end = next(o for o in offs if o > off)
            nbytes = {0: 4, 24: 1, 26: 4}[ty] * int(np.prod(ne))  # f32, i8, i32
            assert nbytes <= end - off
            return buf[data + off:data + off + nbytes]
    raise KeyError(name)


def test_q4_files_described(run_ok, q4_models, tiny):
    want = {"rtn4": ("awq", "f32"), "awq": ("awq", "f32"), "gptq": ("gptq", "f32"), "gptq_ao": ("gptq", "f32"),
            "w4a4": ("int4", "int4")}
    for name, path in q4_models.items():
        scheme, act = want[name]
        j = run_ok(["info", path, "--json", "--tensors"]).json()
        assert j["scheme"] == scheme and j["quantization"].endswith(f"activations {act}"), (name, j["quantization"])
        t = {t["name"]: t for t in j["tensors"]}
        q = t["blk.1.attn_q.weight"]
        assert q["scheme"] == scheme and t["blk.1.attn_q.weight.scale"]["scheme"] == "scales"
        # 4-bit codes + f32 scale (+ f32 zero point) per group (+ an i32
        # column index per input column under act-order: 32 / 576 rows)
        bpw = 4 + 32 / 576 if name == "w4a4" else 4 + 64 / GROUP + (32 / 576 if name == "gptq_ao" else 0)
        assert abs(q["bits_per_weight"] - bpw) < 1e-9, (name, q)
        assert ("blk.1.attn_q.weight.zero" in t) == (name != "w4a4")
        assert ("blk.1.ffn_down.weight.perm" in t) == (name == "gptq_ao")
        assert t["token_embd.weight"]["type"] == "q8_0"
        grp = "" if name == "w4a4" else f", group {GROUP}"
        assert j["quantization"] == f"{name.split('_')[0]}{grp}, activations {act}"
    # AWQ folded its q/k/v and gate/up scales into the norms; the others left them
    for nm in ("blk.0.attn_norm.weight", "blk.1.ffn_norm.weight"):
        assert raw_tensor(q4_models["awq"], nm) != raw_tensor(tiny, nm), nm
        assert raw_tensor(q4_models["gptq"], nm) == raw_tensor(tiny, nm), nm
    # act-order really permutes
    p = np.frombuffer(raw_tensor(q4_models["gptq_ao"], "blk.0.ffn_down.weight.perm"), dtype="<i4")
    assert sorted(p.tolist()) == list(range(256)) and p.tolist() != list(range(256))


def test_q4_deterministic_over_threads(run_cli, q4_models, tiny):
    """The same bytes again, with one thread instead of all (the weights of a
    layer are quantized in parallel, and with two threads or more two layers'
    at once, one layer at a time with one; AWQ's tasks hand scales between
    weights)."""
    for name in ("awq", "gptq"):
        out = tiny.parent / f"{name}-again.gguf"
        r = run_cli(["quantize", *METHODS[name], "--threads", "1", str(tiny), str(out)], timeout=600)
        assert r.returncode == 0, r.stderr
        assert sha(out) == sha(q4_models[name]), name
        out.unlink()


def gptq_dequant(path, name, m, k):
    """A GPTQ weight's f32 values (m, k) in input-column order, as li_q4_result_dequant computes them: codes two
    to a byte (element 2j in the low nibble), (q - zero) * scale per group, stored column j at input column perm[j]."""
    b = np.frombuffer(raw_tensor(path, name), dtype=np.uint8).reshape(m, k // 2)
    q = np.empty((m, k), dtype=np.float32)
    q[:, 0::2], q[:, 1::2] = b & 15, b >> 4
    s = np.frombuffer(raw_tensor(path, name + ".scale"), dtype="<f4").reshape(m, -1)
    z = np.frombuffer(raw_tensor(path, name + ".zero"), dtype="<f4").reshape(m, -1)
    g = np.arange(k) // (k // s.shape[1])
    w = np.empty((m, k), dtype=np.float32)
    w[:, np.frombuffer(raw_tensor(path, name + ".perm"), dtype="<i4")] = (q - z[:, g]) * s[:, g]
    return w


def test_q4_sequential(run_cli, q4_models, tiny, tmp_path):
    """--sequential (GPTQ's own order): block 0 sees the float model's inputs, so its bytes are the plain run's;
    block 1 is calibrated on what the quantized block 0 gives it, so its bytes are those of a plain run on the
    model whose block 0 is replaced by its quantized values (in f32, written here from the file's codes)."""
    seq = tmp_path / "seq.gguf"
    r = quantize(run_cli, None, *METHODS["gptq_ao"], "--sequential", tiny, seq)
    assert r.returncode == 0, r.stderr
    mats = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    parts = ("", ".scale", ".zero", ".perm")
    for m in mats:
        for p in parts:
            assert raw_tensor(seq, f"blk.0.{m}.weight{p}") == raw_tensor(q4_models["gptq_ao"], f"blk.0.{m}.weight{p}")
    assert any(raw_tensor(seq, f"blk.1.{m}.weight") != raw_tensor(q4_models["gptq_ao"], f"blk.1.{m}.weight")
               for m in mats)
    rd = gguf.GGUFReader(tiny)
    arch = bytes(rd.fields["general.architecture"].parts[-1]).decode()
    hybrid = tmp_path / "hybrid.gguf"
    w = gguf.GGUFWriter(str(hybrid), arch)
    for name, f in rd.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vt = f.types[0]
        w.add_key_value(name, f.contents(), vt, f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None)
    for t in rd.tensors:
        if t.name.startswith("blk.0.") and t.name[6:].split(".")[0] in mats:
            n_in, n_out = (int(x) for x in t.shape)
            w.add_tensor(t.name, gptq_dequant(seq, t.name, n_out, n_in))
        else:
            w.add_tensor(t.name, np.asarray(t.data), raw_shape=list(reversed([int(x) for x in t.shape])),
                         raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    plain = tmp_path / "plain.gguf"
    r = quantize(run_cli, None, *METHODS["gptq_ao"], hybrid, plain)
    assert r.returncode == 0, r.stderr
    for m in mats:
        for p in parts:
            assert raw_tensor(seq, f"blk.1.{m}.weight{p}") == raw_tensor(plain, f"blk.1.{m}.weight{p}"), (m, p)
    r = quantize(run_cli, None, *METHODS["awq"], "--sequential", tiny, tmp_path / "x.gguf")
    assert_clean_failure(r, r"--sequential applies to --method gptq only")


def test_q4_errors(run_cli, tiny, tmp_path):
    out = tmp_path / "o.gguf"
    r = run_cli(["quantize", "--method", "rtn4", str(tiny), str(out)])  # default group 128
    assert_clean_failure(r, r"--group 128 does not divide the 576-element rows.*32, 64")
    r = run_cli(["quantize", "--method", "gptq", "--group", "7", *CAL, str(tiny), str(out)])
    assert_clean_failure(r, r"--group must be an even")
    r = run_cli(["quantize", "--method", "w4a4", "--group", "64", str(tiny), str(out)])
    assert_clean_failure(r, r"--group does not apply to w4a4")
    r = run_cli(["quantize", "--method", "awq", "--group", "64", str(tiny), str(out)])
    assert_clean_failure(r, r"--method awq needs --calib")
    r = run_cli(["quantize", "--method", "awq", "--act-order", "--group", "64", *CAL, str(tiny), str(out)])
    assert_clean_failure(r, r"--act-order applies to --method gptq only")
    r = run_cli(["quantize", "--method", "awq", "--damp", "0.1", "--group", "64", *CAL, str(tiny), str(out)])
    assert_clean_failure(r, r"--damp applies to --method gptq and to --gptq only")
    r = run_cli(["quantize", "--method", "rtn4", "--gptq", "--group", "64", *CAL, str(tiny), str(out)])
    assert_clean_failure(r, r"--gptq applies to --method w8a8, fp8 and w4a4")
    r = run_cli(["quantize", "--method", "w4a4", "--gptq", str(tiny), str(out)])
    assert_clean_failure(r, r"--method w4a4 --gptq needs --calib FILE$")
    r = run_cli(["quantize", "--method", "w8a8", "--gptq", str(tiny), str(out)])
    assert_clean_failure(r, r"--method w8a8 --gptq needs --calib FILE$")

    r = run_cli(["quantize", "--method", "gptq", "--damp", "2", "--group", "64", *CAL, str(tiny), str(out)])
    assert_clean_failure(r, r"--damp must be in")
    assert not out.exists() and not list(tmp_path.glob("o.gguf.tmp*"))


def kl_stats(run_ok, model, text, tmp_path, base_args, args):
    base = tmp_path / "base.kld"
    common = ["perplexity", "--model", model, "--file", text, "--ctx", "64", "--chunks", "2", "--json"]
    run_ok([*common, *base_args, "--kl-base-out", base])
    return run_ok([*common, *args, "--kl-base", base]).json()


def test_q4_a8_close_to_a16(run_ok, run_cli, q4_models, tiny, repo_root, tmp_path):
    """A8 (int8 activations on the fly) is close to A16 but not the same;
    --q4-act f32 gives the default's logit bits; A8 changes nothing on a
    model without 4-bit weights; --isa ggml refuses it. (KL between two
    runs of one model is ~1e-7 here, not 0: the baseline's log-probabilities
    are stored in f32.)"""
    text = repo_root / "tests/data/alice_ch1.txt"
    logits = lambda m, *a: run_ok(["generate", "--model", m, "--prompt", PROMPT, "--max-tokens", "4",
                                   "--temperature", "0", "--json", "--top-logits", "8", *a]).json()["top_logits"]
    for name in ("rtn4", "gptq"):
        j = kl_stats(run_ok, q4_models[name], text, tmp_path, [], ["--q4-act", "int8"])
        assert 1e-5 < j["kl_mean"] < 0.05 and j["top1_agree"] > 0.9, (name, j)
        assert logits(q4_models[name], "--q4-act", "f32") == logits(q4_models[name])
        assert logits(q4_models[name], "--q4-act", "int8") != logits(q4_models[name])
    assert logits(tiny, "--q4-act", "int8") == logits(tiny)
    r = run_cli(["perplexity", "--model", str(tiny), "--file", str(text), "--isa", "ggml", "--q4-act", "int8"])
    assert_clean_failure(r, r"--q4-act int8 needs luainfer's own CPU kernels")
    r = run_cli(["generate", "--model", str(tiny), "--prompt", "x", "--q4-act", "int4"])
    assert_clean_failure(r, r"--q4-act must be f32 \(A16\) or int8 \(A8\)")


def test_q4_ngram_exact_and_serve(run_ok, q4_models, luainfer_bin, tmp_path):
    """On every 4-bit file (A16, and A8 for one), greedy n-gram speculation
    gives exactly the non-speculative tokens, and `serve --model OUT` (one
    start per method, speculating) answers with those same tokens."""
    from test_server import Rpc, Server, THREADS
    for name, path in q4_models.items():
        for act in (["f32", "int8"] if name == "gptq" else ["f32"]):
            gen = ["generate", "--model", path, "--prompt", PROMPT, "--max-tokens", "24", "--temperature", "0",
                   "--json", "--q4-act", act]
            want = run_ok(gen).json()["tokens"]
            got = run_ok([*gen, "--spec-k", "4"]).json()["tokens"]
            assert got == want, (name, act)
        srv = Server(luainfer_bin, ["--model", str(path), "--listen", "127.0.0.1:0", "--no-http", "--threads",
                                    THREADS, "--kv-memory", "16M", "--spec-tokens", "4"], 1, tmp_path)
        try:
            c = Rpc(srv.rpc)
            res = c.ok("generate", {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True})
            gen = run_ok(["generate", "--model", path, "--prompt", PROMPT, "--max-tokens", "24", "--temperature",
                          "0", "--json"]).json()
            if len(gen["tokens"]) == 24:  # generate stops at EOS; serve ignored it
                assert res["tokens"] == gen["tokens"], name
            assert c.ok("stats")["engine"]["spec_drafted"] > 0, name
            c.close()
        finally:
            assert srv.stop() == 0, srv.stderr()[-2000:]
