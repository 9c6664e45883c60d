"""Hugging Face directories: `--model DIR` against the GGUF they came from.

tools/gguf_to_hf.py turns the default GGUF into HF Llama directories with the
maintained writers (safetensors, tokenizers, transformers' config classes):
BF16 in three shards with model.safetensors.index.json, F16 in one
model.safetensors, and F32 in shards. Each comes with its reference GGUF: the same metadata and
the same dequantized-then-rounded weights in GGUF layout (the Q4_1 model
dequantized to F16 is not the Q4_1 numbers, so DIR is compared against that
reference, not against the Q4_1 file). Checks:

  * luainfer gives the same greedy tokens and the same raw top logits (bit
    for bit, default and ggml kernels) from DIR as from the reference GGUF;
  * a float64 NumPy forward written from transformers' Llama (rotate_half
    rope, repeat_kv, RMSNorm, SiLU MLP) on DIR's tensors picks the same
    greedy tokens: the Q/K un-permutation makes a real HF checkpoint
    (torch is not in the venv, so transformers cannot run the model);
  * the tokenizer read from tokenizer.json gives HF tokenizers' ids on the
    10,000-string golden set (build/test_tokenizer_hf), and HF tokenizers
    itself does on the file we wrote;
  * `luainfer info DIR` reports what `info` on the reference GGUF does;
  * corrupt, truncated and unsupported directories fail with one line;
  * 4-bit AutoAWQ (GEMM) and GPTQ (act-order) directories, packed by
    gguf_to_hf.py --quant, run as the GGUF of their dequantized values.
"""

import gzip
import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
GOLDEN = REPO_ROOT / "tests" / "golden" / "tokenizer_smollm2.jsonl.gz"
PROMPT = "The capital of France is"
N_TOKENS = 8


def load_converter():
    spec = importlib.util.spec_from_file_location("gguf_to_hf", REPO_ROOT / "tools" / "gguf_to_hf.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def source(model_path):
    """The converter and the default GGUF read by it (once: the slow part)."""
    pytest.importorskip("safetensors")
    pytest.importorskip("tokenizers")
    pytest.importorskip("transformers")
    conv = load_converter()
    return conv, conv.read_gguf(str(model_path))


@pytest.fixture(scope="module")
def hf(tmp_path_factory, source):
    conv, g = source
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for name, dtype, shard in (("bf16", "bf16", 100 << 20), ("f16", "f16", 0), ("f32", "f32", 200 << 20)):
        d = root / name
        conv.convert(g, str(d), dtype, shard, str(root / f"{name}.gguf"))
        out[name] = (d, root / f"{name}.gguf")
    return out


def generate(run_ok, model, *extra):
    r = run_ok(["generate", "--model", model, "--prompt", PROMPT, "--temperature", "0",
                "--max-tokens", N_TOKENS, "--json", "--top-logits", 4, "--threads", 2, *extra])
    return r.json()


# ---------------------------------------------------------------------------
# The directories are what the HF libraries expect
# ---------------------------------------------------------------------------
def test_layout(hf):
    from safetensors import safe_open
    for name, st_dtype in (("bf16", "BF16"), ("f16", "F16"), ("f32", "F32")):
        first = sorted(hf[name][0].glob("*.safetensors"))[0]
        raw = first.read_bytes()
        hdr = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
        dtypes = {v["dtype"] for k, v in hdr.items() if k != "__metadata__"}
        assert dtypes == {st_dtype}, f"{name}: {first.name} holds {dtypes}"
    assert (hf["f32"][0] / "model.safetensors.index.json").is_file()
    bf16, _ = hf["bf16"]
    idx = json.loads((bf16 / "model.safetensors.index.json").read_text())
    shards = sorted(set(idx["weight_map"].values()))
    assert shards == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    for s in shards:
        with safe_open(str(bf16 / s), framework="np") as f:
            for k in f.keys():
                assert idx["weight_map"][k] == s
    assert not (bf16 / "model.safetensors").exists()
    assert (hf["f16"][0] / "model.safetensors").is_file()
    from transformers import AutoConfig
    cfg = AutoConfig.from_pretrained(str(bf16))
    assert cfg.model_type == "llama" and cfg.num_key_value_heads == 3 and cfg.tie_word_embeddings


# ---------------------------------------------------------------------------
# Same tokens and logits as the reference GGUF
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("name,isa", [("bf16", "auto"), ("f16", "auto"), ("f32", "auto"), ("bf16", "ggml")])
def test_generate_matches_gguf(hf, run_ok, name, isa):
    d, ref = hf[name]
    n = ["--max-tokens", 4] if isa == "ggml" else []  # llama.cpp's arithmetic is slow
    a = generate(run_ok, d, "--isa", isa, *n)
    b = generate(run_ok, ref, "--isa", isa, *n)
    assert a["tokens"] == b["tokens"], f"{name}/{isa}: tokens differ"
    assert a["text"] == b["text"]
    assert a["top_logits"] == b["top_logits"], f"{name}/{isa}: raw logits differ"
    assert len(a["tokens"]) == (4 if isa == "ggml" else N_TOKENS)


# ---------------------------------------------------------------------------
# A NumPy forward with Hugging Face's Llama conventions
# ---------------------------------------------------------------------------
def hf_llama_logits(w, cfg, ids, n_last):
    """transformers' LlamaForCausalLM, float64, no cache: logits of the last n_last positions."""
    H, KV, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_parameters"]["rope_theta"]
    T = len(ids)

    def norm(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g

    def rotate_half(x):
        return np.concatenate([-x[..., D // 2:], x[..., :D // 2]], axis=-1)

    inv = 1.0 / theta ** (np.arange(0, D, 2, dtype=np.float64) / D)
    ang = np.outer(np.arange(T), inv)
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    x = w["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = norm(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, H, D).transpose(1, 0, 2)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, KV, D).transpose(1, 0, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, KV, D).transpose(1, 0, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = np.repeat(k, H // KV, axis=0), np.repeat(v, H // KV, axis=0)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(D) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        a = (s / s.sum(-1, keepdims=True)) @ v
        x = x + a.transpose(1, 0, 2).reshape(T, H * D) @ w[p + "self_attn.o_proj.weight"].T
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        g = h @ w[p + "mlp.gate_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    x = norm(x[-n_last:], w["model.norm.weight"])
    return x @ w["model.embed_tokens.weight"].T


def test_numpy_hf_forward(hf, run_ok):
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer
    d, _ = hf["f16"]
    w = {k: v.astype(np.float64) for k, v in load_file(str(d / "model.safetensors")).items()}
    cfg = json.loads((d / "config.json").read_text())
    ids = Tokenizer.from_file(str(d / "tokenizer.json")).encode(PROMPT, add_special_tokens=False).ids
    got = generate(run_ok, d, "--kv-dtype", "f32")
    n = 4
    # one causal pass over the prompt and luainfer's first tokens: position
    # len(ids) - 1 + i predicts generated token i
    logits = hf_llama_logits(w, cfg, ids + got["tokens"][:n - 1], n)
    want = [int(t) for t in np.argmax(logits, axis=-1)]
    assert got["tokens"][:n] == want, f"greedy tokens: luainfer {got['tokens'][:n]}, HF-convention numpy {want}"
    for t, v in got["top_logits"][0]:
        assert abs(logits[0][t] - v) < 0.05 * max(1.0, abs(v)), f"logit of {t}: numpy {logits[0][t]}, luainfer {v}"


# ---------------------------------------------------------------------------
# The tokenizer from tokenizer.json
# ---------------------------------------------------------------------------
def test_tokenizer_golden_hf_tokenizers(hf):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(hf["bf16"][0] / "tokenizer.json"))
    rows = [json.loads(line) for line in gzip.open(GOLDEN, "rt", encoding="utf-8")]
    assert len(rows) >= 10000
    enc = tok.encode_batch([r["text"] for r in rows], add_special_tokens=False)
    bad = [r["text"] for e, r in zip(enc, rows) if e.ids != r["ids"]]
    assert not bad, f"{len(bad)} strings differ, e.g. {bad[:3]}"


def test_tokenizer_golden_luainfer(hf, luainfer_bin):
    exe = Path(luainfer_bin).parent / "test_tokenizer_hf"
    if not exe.is_file():
        pytest.skip(f"{exe} not built")
    env = dict(os.environ, LUAINFER_HF_DIR=str(hf["bf16"][0]), LUAINFER_SOURCE_DIR=str(REPO_ROOT))
    r = subprocess.run([str(exe)], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "10000/10000 identical" in r.stdout


# ---------------------------------------------------------------------------
# info
# ---------------------------------------------------------------------------
def test_info(hf, run_ok):
    d, ref = hf["bf16"]
    a = run_ok(["info", d, "--json"]).json()
    b = run_ok(["info", ref, "--json"]).json()
    assert a["hparams"] == b["hparams"]
    assert a["architecture"] == b["architecture"] == "llama"
    assert a["n_params"] == b["n_params"]
    assert a["tensor_types"]["bf16"]["count"] == 272
    text = run_ok(["info", d]).stdout
    assert "tokenizer: 49152 tokens, bos 1, eos 2" in text and "chat template: yes" in text


def test_chat_uses_directory_template(hf, run_ok):
    d, ref = hf["f16"]
    args = ["--chat", "--max-tokens", 3]
    assert generate(run_ok, d, *args)["tokens"] == generate(run_ok, ref, *args)["tokens"]


LLAMA3_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                   "{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
# luainfer.chat's llama3 family: the BOS as text when the model has no <|begin_of_text|> token
LLAMA3_RENDERED = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"


def test_chat_template_from_tokenizer_config(hf, run_ok, tmp_path):
    """Without chat_template.jinja the template is tokenizer_config.json's
    "chat_template"; with both, chat_template.jinja wins (as in transformers).
    A Llama 3 template there turns the chat prompt into Llama 3's markup."""
    src = hf["f16"][0]

    def chat_prompt(d):
        return run_ok(["generate", "--model", d, "--chat", "--prompt", "Hi", "--max-tokens", 1, "--temperature", "0",
                       "--json", "--threads", 2]).json()["prompt_tokens"]

    shipped = chat_prompt(src)
    d = clone(src, tmp_path / "cfg_template", skip={"chat_template.jinja"})
    edit_json(d / "tokenizer_config.json", lambda j: j.update(chat_template=LLAMA3_TEMPLATE))
    got = chat_prompt(d)
    want = run_ok(["generate", "--model", d, "--prompt", LLAMA3_RENDERED, "--max-tokens", 1, "--temperature", "0",
                   "--json", "--threads", 2]).json()["prompt_tokens"]
    assert got != shipped and got == want, (got, want)
    both = clone(src, tmp_path / "both", skip={"tokenizer_config.json"})
    (both / "tokenizer_config.json").write_text((d / "tokenizer_config.json").read_text())
    assert (both / "chat_template.jinja").exists() and chat_prompt(both) == shipped


def test_chat_template_unrecognised_warns(hf, run_ok, tmp_path):
    """A template of no family luainfer.chat knows is rendered as ChatML, and
    generate says so on stderr (the shipped ChatML template says nothing)."""
    src = hf["f16"][0]
    args = ["--chat", "--prompt", "Hi", "--max-tokens", 1, "--temperature", "0", "--threads", 2]
    quiet = run_ok(["generate", "--model", src] + args)
    assert "chat template not recognised" not in quiet.stderr
    d = clone(src, tmp_path / "odd_template", skip={"chat_template.jinja"})
    edit_json(d / "tokenizer_config.json",
              lambda j: j.update(chat_template="{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"))
    r = run_ok(["generate", "--model", d] + args)
    assert "chat template not recognised" in r.stderr and "chatml" in r.stderr, r.stderr[-1000:]


# ---------------------------------------------------------------------------
# Corrupt and unsupported directories: one-line errors
# ---------------------------------------------------------------------------
def clone(src, dst, skip=()):
    """dst with links to src's files, except those named in skip."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name not in skip:
            (dst / f.name).symlink_to(f)
    return dst


def edit_json(path, fn):
    obj = json.loads(Path(path).read_text())
    fn(obj)
    if Path(path).is_symlink():
        Path(path).unlink()
    Path(path).write_text(json.dumps(obj))


def one_line_failure(run_cli, d, *needles):
    r = run_cli(["info", d])
    assert r.returncode > 0, f"exit {r.returncode} for a bad directory {d}"
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1, f"not one line:\n{err}"
    for n in needles:
        assert n in err, f"{n!r} not in {err!r}"
    return err


def head_bytes(src, n):
    with open(src, "rb") as f:
        return f.read(n)


def test_corrupt_safetensors(hf, run_cli, tmp_path):
    src = hf["f16"][0]
    st = src / "model.safetensors"
    hlen = int.from_bytes(head_bytes(st, 8), "little")

    d = clone(src, tmp_path / "truncated", skip={"model.safetensors"})
    (d / "model.safetensors").write_bytes(head_bytes(st, 8 + hlen + 1000))
    one_line_failure(run_cli, d, "safetensors:", "model.safetensors", "past the data area")

    d = clone(src, tmp_path / "header_past_eof", skip={"model.safetensors"})
    data = bytearray(head_bytes(st, 8 + hlen + 64))
    data[:8] = (hlen + 100).to_bytes(8, "little")
    (d / "model.safetensors").write_bytes(bytes(data))
    one_line_failure(run_cli, d, "model.safetensors", "runs past the end")

    d = clone(src, tmp_path / "bad_json", skip={"model.safetensors"})
    data = bytearray(head_bytes(st, 8 + hlen))
    data[8 + hlen // 2] = ord("}")
    (d / "model.safetensors").write_bytes(bytes(data))
    one_line_failure(run_cli, d, "model.safetensors")

    d = clone(src, tmp_path / "cut_header", skip={"model.safetensors"})
    (d / "model.safetensors").write_bytes(head_bytes(st, 5))
    one_line_failure(run_cli, d, "model.safetensors", "truncated")


def test_corrupt_index(hf, run_cli, tmp_path):
    src = hf["bf16"][0]
    d = clone(src, tmp_path / "missing_shard", skip={"model-00002-of-00003.safetensors"})
    one_line_failure(run_cli, d, "model-00002-of-00003.safetensors")

    d = clone(src, tmp_path / "wrong_map")
    edit_json(d / "model.safetensors.index.json",
              lambda j: j["weight_map"].update({"model.norm.weight": "model-00001-of-00003.safetensors"}
                                               if j["weight_map"]["model.norm.weight"] != "model-00001-of-00003.safetensors"
                                               else {"model.norm.weight": "model-00002-of-00003.safetensors"}))
    one_line_failure(run_cli, d, "model.norm.weight", "weight_map")

    d = clone(src, tmp_path / "escape")
    edit_json(d / "model.safetensors.index.json",
              lambda j: j["weight_map"].update({"model.norm.weight": "../x.safetensors"}))
    one_line_failure(run_cli, d, "not a .safetensors file name")


@pytest.mark.parametrize("case,edit,needle", [
    ("no_hidden_size", lambda j: j.pop("hidden_size"), "'hidden_size' is missing"),
    ("arch", lambda j: j.update(architectures=["Qwen2ForCausalLM"]), "Qwen2ForCausalLM' is not supported"),
    ("rope_scaling", lambda j: j.update(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "rope scaling 'llama3'"),
    ("bias", lambda j: j.update(attention_bias=True), "biases are not supported"),
    ("quantized", lambda j: j.update(quantization_config={"quant_method": "bitsandbytes"}), "quant_method 'bitsandbytes'"),
    ("awq_no_qweight", lambda j: j.update(quantization_config={"quant_method": "awq", "bits": 4, "group_size": 32}),
     "missing tensor 'model.layers.0.self_attn.q_proj.qweight'"),
    ("bad_heads", lambda j: j.update(num_key_value_heads=2), "do not fit"),
    ("vocab", lambda j: j.update(vocab_size=1000), "embed_tokens.weight' has shape"),
])
def test_bad_config(hf, run_cli, tmp_path, case, edit, needle):
    d = clone(hf["f16"][0], tmp_path / case)
    edit_json(d / "config.json", edit)
    one_line_failure(run_cli, d, needle)


def test_bad_config_json(hf, run_cli, tmp_path):
    d = clone(hf["f16"][0], tmp_path / "cfg", skip={"config.json"})
    (d / "config.json").write_text('{"hidden_size": 5')
    one_line_failure(run_cli, d, "config.json", "not a valid JSON")
    d = clone(hf["f16"][0], tmp_path / "nocfg", skip={"config.json"})
    one_line_failure(run_cli, d, "config.json", "missing")
    d = clone(hf["f16"][0], tmp_path / "noweights", skip={"model.safetensors"})
    one_line_failure(run_cli, d, "no model.safetensors")


@pytest.mark.parametrize("case,edit,needle", [
    ("normalizer", lambda j: j.update(normalizer={"type": "NFC"}), "normalizer 'NFC' is not supported"),
    ("wordpiece", lambda j: j["model"].update(type="WordPiece"), "tokenizer model 'WordPiece'"),
    ("byte_fallback", lambda j: j["model"].update(byte_fallback=True), "byte_fallback"),
    ("pretok", lambda j: j.update(pre_tokenizer={"type": "Whitespace"}), "pre_tokenizer 'Whitespace'"),
    ("merge", lambda j: j["model"]["merges"].insert(0, ["Ġ", "zzzqqq"]), "model.merges[0]"),
    ("lstrip", lambda j: j["added_tokens"][1].update(lstrip=True), "lstrip"),
])
def test_bad_tokenizer(hf, run_cli, tmp_path, case, edit, needle):
    d = clone(hf["f16"][0], tmp_path / case)
    edit_json(d / "tokenizer.json", edit)
    err = one_line_failure(run_cli, d, needle)
    assert "tokenizer.json" in err


def test_no_tokenizer(hf, run_cli, tmp_path):
    d = clone(hf["f16"][0], tmp_path / "notok", skip={"tokenizer.json"})
    one_line_failure(run_cli, d, "no tokenizer.json")


# ---------------------------------------------------------------------------
# AutoAWQ (GEMM) and GPTQ (act-order) checkpoints
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_quant(tmp_path_factory, source):
    """4-bit directories made by gguf_to_hf.py --quant (packed as AutoAWQ and
    AutoGPTQ pack; torch and those libraries are not in the venv), each with
    a reference GGUF holding exactly (q - zero) * scale as F32."""
    conv, g = source
    root = tmp_path_factory.mktemp("hfq")
    out = {}
    for name, act_order in (("awq", False), ("gptq", True)):
        d = root / name
        conv.convert(g, str(d), "f16", 0, str(root / f"{name}.gguf"), name, 32, act_order)
        out[name] = (d, root / f"{name}.gguf")
    return out


@pytest.mark.parametrize("name,isa", [("awq", "scalar"), ("gptq", "scalar"), ("awq", "auto"), ("gptq", "auto")])
def test_quant_matches_reference(hf_quant, run_ok, name, isa):
    d, ref = hf_quant[name]
    cfg = json.loads((d / "config.json").read_text())["quantization_config"]
    assert cfg["quant_method"] == name and cfg["bits"] == 4
    # the scheme weights on the scalar reference and on the default kernels
    # (the 4-bit A16 kernels); the reference GGUF runs the same ISA
    a = generate(run_ok, d, "--isa", isa, "--max-tokens", 4)
    b = generate(run_ok, ref, "--isa", isa, "--max-tokens", 4)
    assert a["tokens"] == b["tokens"], f"{name}: tokens differ"
    for sa, sb in zip(a["top_logits"], b["top_logits"]):
        assert [t for t, _ in sa] == [t for t, _ in sb]
        for (_, va), (_, vb) in zip(sa, sb):
            assert abs(va - vb) <= 1e-4 * max(1.0, abs(vb)), f"{name}: logit {va} vs {vb}"
    info = run_ok(["info", d, "--json"]).json()
    assert info["hparams"]["n_layer"] == 30 and "i32" in {k.lower() for k in info["tensor_types"]}


# Written from the published unpackers, not from gguf_to_hf.py's packer:
# AutoAWQ awq/utils/packing_utils.py (unpack_awq, reverse_awq_order,
# dequantize_gemm) and AutoGPTQ's QuantLinear dequantization (qlinear_cuda_old:
# shifts 0, 4, ..., 28 along the packed dimension, zeros + 1, scales[g_idx]).
# Both give W transposed, (in, out).
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]


def unpack_nibbles_last(packed):
    """(r, c) int32 -> (r, 8c): word j's nibble i is column 8j + i."""
    u = packed.view(np.uint32)
    return ((u[:, :, None] >> (4 * np.arange(8, dtype=np.uint32))) & 15).reshape(u.shape[0], -1)


def awq_dequantize_gemm(qweight, qzeros, scales, group_size):
    iw, iz = unpack_nibbles_last(qweight), unpack_nibbles_last(qzeros)
    order = np.arange(iw.shape[-1]).reshape(-1, 8)[:, AWQ_REVERSE_ORDER].reshape(-1)
    iw, iz = iw[:, order], iz[:, order]
    s = np.repeat(scales.astype(np.float32), group_size, axis=0)
    z = np.repeat(iz, group_size, axis=0)
    return (iw.astype(np.float32) - z.astype(np.float32)) * s


def gptq_dequantize(qweight, qzeros, scales, g_idx):
    u = qweight.view(np.uint32)
    w = ((u[:, None, :] >> (4 * np.arange(8, dtype=np.uint32))[None, :, None]) & 15).reshape(-1, u.shape[1])
    z = (unpack_nibbles_last(qzeros) + 1) & 15  # the "gptq" checkpoint format stores zero - 1
    g = g_idx.astype(np.int64)
    return scales.astype(np.float32)[g] * (w.astype(np.float32) - z[g].astype(np.float32))


@pytest.mark.parametrize("name", ["awq", "gptq"])
def test_quant_layout_matches_published_unpackers(hf_quant, source, name):
    """The 4-bit tensors gguf_to_hf.py packs, unpacked the way AutoAWQ and
    AutoGPTQ unpack them, are the reference GGUF's weights exactly: the
    directories are in the libraries' real layouts, so luainfer matching the
    reference (test_quant_matches_reference) means it reads real checkpoints."""
    from gguf import GGUFReader
    from safetensors.numpy import load_file
    conv = source[0]
    d, ref = hf_quant[name]
    t = load_file(str(d / "model.safetensors"))
    group = json.loads((d / "config.json").read_text())["quantization_config"]["group_size"]
    cfg = json.loads((d / "config.json").read_text())
    heads = {"attn_q": cfg["num_attention_heads"], "attn_k": cfg["num_key_value_heads"]}
    ref_w = {tt.name: np.asarray(tt.data) for tt in GGUFReader(str(ref)).tensors}
    checked = 0
    for gname, w in ref_w.items():
        parts = gname.split(".")
        if len(parts) != 4 or parts[0] != "blk" or w.ndim != 2:
            continue
        base = f"model.layers.{parts[1]}.{conv.LAYER_NAMES[parts[2]]}"
        if name == "awq":
            got = awq_dequantize_gemm(t[base + ".qweight"], t[base + ".qzeros"], t[base + ".scales"], group)
        else:
            got = gptq_dequantize(t[base + ".qweight"], t[base + ".qzeros"], t[base + ".scales"], t[base + ".g_idx"])
        want = w.astype(np.float32)
        if parts[2] in heads:  # the GGUF holds Q and K in llama.cpp's rope order
            want = conv.unpermute(want, heads[parts[2]])
        assert got.shape == want.T.shape, (gname, got.shape, want.shape)
        assert np.array_equal(got, want.T), f"{name}: {base} unpacks to other weights than the reference"
        checked += 1
    assert checked == 30 * 7, checked


@pytest.mark.parametrize("name,tensor,edit,needle", [
    ("awq", "model.layers.0.mlp.up_proj.qzeros", None, "missing tensor 'model.layers.0.mlp.up_proj.qzeros'"),
    ("gptq", "model.layers.3.self_attn.q_proj.g_idx", "ones", "gives group"),
])
def test_quant_bad_tensors(hf_quant, run_cli, tmp_path, name, tensor, edit, needle):
    from safetensors.numpy import load_file, save_file
    src = hf_quant[name][0]
    d = clone(src, tmp_path / name, skip={"model.safetensors"})
    t = load_file(str(src / "model.safetensors"))
    if edit is None:
        del t[tensor]
    else:
        t[tensor] = np.ones_like(t[tensor])  # every column in group 1
    save_file(t, str(d / "model.safetensors"))
    one_line_failure(run_cli, d, needle)


@pytest.mark.parametrize("edit,needle", [
    (lambda q: q.update(version="gemv"), "AWQ version 'gemv'"),
    (lambda q: q.update(bits=3), "3 bits"),
    (lambda q: q.update(quant_method="bitsandbytes"), "quant_method 'bitsandbytes'"),
])
def test_quant_bad_config(hf_quant, run_cli, tmp_path, edit, needle):
    d = clone(hf_quant["awq"][0], tmp_path / "q")
    edit_json(d / "config.json", lambda j: edit(j["quantization_config"]))
    one_line_failure(run_cli, d, needle)
