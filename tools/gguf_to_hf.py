#!/usr/bin/env python3
"""gguf_to_hf.py — a Llama GGUF as a Hugging Face checkpoint directory.

Reads the GGUF with the `gguf` package (and dequantizes every tensor with
it), then writes, with the maintained writers only:

  config.json, generation_config.json   transformers' LlamaConfig / GenerationConfig
  model.safetensors, or model-0000N-of-0000M.safetensors + model.safetensors.index.json
                                        `safetensors` (BF16, F16 or F32)
  tokenizer.json, tokenizer_config.json, special_tokens_map.json
                                        `tokenizers` (via transformers' GGUF tokenizer
                                        converter) and PreTrainedTokenizerFast, with
                                        the GGUF's chat template

llama.cpp's converter permutes the rows of the Q and K projections so its rope
can rotate adjacent pairs; Hugging Face's Llama rotates halves of each head.
The permutation is undone here, so the directory is a real HF checkpoint.

--gguf-out PATH also writes the reference GGUF "expanded the same way": the
same metadata, the same dequantized-then-rounded weights in the same dtype
(norms as F32, which holds BF16/F16 values exactly), in GGUF layout. A Q4_1
file dequantized to F16 is not the Q4_1 numbers; luainfer on DIR must match
luainfer on this GGUF, token for token and logit for logit.

    .venv/bin/python tools/gguf_to_hf.py OUT_DIR [--model GGUF] [--dtype bf16|f16|f32]
        [--shard-size 100MB] [--gguf-out REF.gguf] [--quant awq|gptq --group-size 32 [--act-order]]

--quant writes the decoder's Linears as a 4-bit AutoAWQ "GEMM" or GPTQ
checkpoint (qweight / qzeros / scales [/ g_idx], packed as those libraries
pack them, quantized here from the dequantized weights); the reference GGUF
then holds exactly the values (q - zero) * scale as F32.
"""
import argparse
import json
import os
import re
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")

# GGUF tensor name (per layer, after "blk.N.") -> HF name (after "model.layers.N.")
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def fail(msg):
    print(f"gguf_to_hf: {msg}", file=sys.stderr)
    sys.exit(1)


def parse_size(s):
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?B?)\s*", s.upper())
    if not m:
        raise argparse.ArgumentTypeError(f"bad size '{s}' (e.g. 50MB, 2GB, 4096)")
    mult = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "G": 1 << 30, "GB": 1 << 30}
    return int(float(m.group(1)) * mult[m.group(2)])


# ---------------------------------------------------------------------------
# Reading the GGUF
# ---------------------------------------------------------------------------

def read_gguf(path):
    from gguf import GGUFReader
    from gguf.quants import dequantize
    r = GGUFReader(path)
    meta = {k: f.contents() for k, f in r.fields.items()}
    arch = meta.get("general.architecture")
    if arch not in ("llama", "mistral", "granite", "deci"):
        fail(f"{path}: architecture {arch!r} is not a Llama-family model")
    n_ff(meta.get(f"{arch}.feed_forward_length", 0))  # refuse per-block widths before dequantizing
    tensors = {}
    for t in r.tensors:
        # dequantize gives numpy shape (rows, k), i.e. the HF (out, in) order
        tensors[t.name] = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
    return r, meta, arch, tensors


def n_ff(v):
    """one width: a config.json's intermediate_size has no per-layer form"""
    if isinstance(v, (list, tuple)):
        if len(set(int(x) for x in v)) != 1:
            fail("the blocks' FFN widths differ (feed_forward_length is a per-layer array): "
                 "a Hugging Face LlamaConfig has one intermediate_size")
        v = v[0]
    return int(v)


def hparams(meta, arch):
    def get(key, default=None):
        v = meta.get(f"{arch}.{key}", default)
        if v is None:
            fail(f"missing metadata key {arch}.{key}")
        return v
    n_embd = int(get("embedding_length"))
    n_head = int(get("attention.head_count"))
    hp = {
        "n_embd": n_embd,
        "n_layer": int(get("block_count")),
        "n_head": n_head,
        "n_head_kv": int(get("attention.head_count_kv", n_head)),
        "n_ff": n_ff(get("feed_forward_length")),
        "n_ctx": int(get("context_length", 2048)),
        "eps": float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        "theta": float(get("rope.freq_base", 10000.0)),
        "head_dim": int(get("attention.key_length", n_embd // n_head)),
    }
    if int(get("rope.dimension_count", hp["head_dim"])) != hp["head_dim"]:
        fail("partial rotary dimensions are not a Llama checkpoint")
    if meta.get(f"{arch}.rope.scaling.type", "none") != "none":
        fail("rope scaling is not supported by this converter")
    return hp


# ---------------------------------------------------------------------------
# Q/K permutation (llama.cpp convert_hf_to_gguf.py's LlamaModel.permute)
# ---------------------------------------------------------------------------

def unpermute(w, n_head):
    """GGUF rows (per head: pairs (0,1),(2,3)...) -> HF rows (per head: halves)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute(w, n_head):
    """The inverse of unpermute: what llama.cpp's converter does."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ---------------------------------------------------------------------------
# dtypes: one rounding, shared by the directory and the reference GGUF
# ---------------------------------------------------------------------------

def round_to(a, dtype):
    """(array in the target dtype's bits, safetensors dtype name)."""
    if dtype == "f32":
        return np.ascontiguousarray(a, dtype=np.float32), "float32"
    if dtype == "f16":
        return np.ascontiguousarray(a.astype(np.float16)), "float16"
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize
    bits = quantize(np.ascontiguousarray(a, dtype=np.float32), GGMLQuantizationType.BF16)
    return np.ascontiguousarray(bits).view(np.uint16).reshape(a.shape), "bfloat16"


def as_f32(bits, dtype):
    if dtype == "bf16":
        return (bits.astype(np.uint32) << 16).view(np.float32)
    return bits.astype(np.float32)


# ---------------------------------------------------------------------------
# AWQ / GPTQ 4-bit layouts (AutoAWQ's WQLinear_GEMM packing, AutoGPTQ's
# QuantLinear packing), for checking luainfer's loader of those checkpoints
# ---------------------------------------------------------------------------

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # word nibble i holds output column 8c + AWQ_ORDER[i]


def quantize_4bit(w, g_idx, n_groups, zmin):
    """Asymmetric 4-bit per (row, group): q (out, in), zeros and F16 scales
    (out, groups), and the f32 values (q - z) * s the loader must compute."""
    out_f, in_f = w.shape
    q = np.zeros((out_f, in_f), np.uint32)
    z = np.zeros((out_f, n_groups), np.uint32)
    s16 = np.zeros((out_f, n_groups), np.float16)
    for g in range(n_groups):
        cols = np.nonzero(g_idx == g)[0]
        blk = w[:, cols]
        lo, hi = np.minimum(blk.min(1), 0), np.maximum(blk.max(1), 0)
        sc = ((hi - lo) / 15).astype(np.float16)
        sc[sc == 0] = np.float16(1e-4)
        s32 = sc.astype(np.float32)
        zz = np.clip(np.round(-lo / s32), zmin, 15)
        q[:, cols] = np.clip(np.round(blk / s32[:, None]) + zz[:, None], 0, 15).astype(np.uint32)
        z[:, g], s16[:, g] = zz.astype(np.uint32), sc
    s32 = s16.astype(np.float32)
    deq = (q.astype(np.float32) - z[:, g_idx].astype(np.float32)) * s32[:, g_idx]
    return q, z, s16, deq


def pack_cols(a, order=range(8)):
    """(r, c) codes -> (r, c/8) int32: word nibble i holds column 8j + order[i]."""
    words = np.zeros((a.shape[0], a.shape[1] // 8), np.uint32)
    for i, o in enumerate(order):
        words |= (a[:, o::8] & 15) << np.uint32(4 * i)
    return words.view(np.int32)


def quant_tensors(base, w, method, group, act_order, rng):
    """HF tensors of one Linear (w: (out, in) f32) and its dequantized values."""
    out_f, in_f = w.shape
    gs = group if group > 0 else in_f
    n_groups = in_f // gs
    g_idx = np.arange(in_f) // gs
    if method == "gptq" and act_order:
        g_idx = np.empty(in_f, np.int64)
        g_idx[rng.permutation(in_f)] = np.arange(in_f) // gs
    q, z, s16, deq = quantize_4bit(w, g_idx, n_groups, 1 if method == "gptq" else 0)
    if method == "awq":
        t = {"qweight": pack_cols(q.T, AWQ_ORDER), "qzeros": pack_cols(z.T, AWQ_ORDER)}
    else:
        t = {"qweight": pack_cols(q).T.copy(),       # (in/8, out): input i at nibble i % 8
             "qzeros": pack_cols(z.T - 1),           # checkpoint_format "gptq" stores zero - 1
             "g_idx": g_idx.astype(np.int32)}
    t["scales"] = np.ascontiguousarray(s16.T)
    return {f"{base}.{k}": (np.ascontiguousarray(v), {np.dtype(np.int32): "int32", np.dtype(np.float16): "float16"}[v.dtype])
            for k, v in t.items()}, deq


# ---------------------------------------------------------------------------
# Writing safetensors (the package's serializer; BF16 goes through its
# TensorSpec API because numpy has no bfloat16 dtype)
# ---------------------------------------------------------------------------

def save_safetensors(tensors, path, metadata):
    """tensors: name -> (bits array, safetensors dtype name)."""
    import safetensors
    from safetensors.numpy import save_file
    tmp = path + ".tmp"
    if all(dt != "bfloat16" for _, dt in tensors.values()):
        save_file({k: a for k, (a, _) in tensors.items()}, tmp, metadata=metadata)
    else:
        specs = {k: safetensors.TensorSpec(dtype=dt, shape=list(a.shape), data_ptr=a.ctypes.data,
                                           data_len=a.nbytes)
                 for k, (a, dt) in tensors.items()}
        safetensors.serialize_file(specs, tmp, metadata=metadata)
    os.replace(tmp, path)


def write_weights(out, tensors, shard_size):
    metadata = {"format": "pt"}
    names = list(tensors)
    total = sum(a.nbytes for a, _ in tensors.values())
    if not shard_size or total <= shard_size:
        save_safetensors(tensors, os.path.join(out, "model.safetensors"), metadata)
        return 1
    shards, cur, cur_bytes = [], [], 0
    for n in names:
        nb = tensors[n][0].nbytes
        if cur and cur_bytes + nb > shard_size:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(n)
        cur_bytes += nb
    if cur:
        shards.append(cur)
    weight_map = {}
    for i, group in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_safetensors({n: tensors[n] for n in group}, os.path.join(out, fname), metadata)
        weight_map.update({n: fname for n in group})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    write_json(os.path.join(out, "model.safetensors.index.json"), index)
    return len(shards)


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------
# Tokenizer and config
# ---------------------------------------------------------------------------

def build_tokenizer(meta, arch):
    """tokenizers.Tokenizer from the GGUF vocab/merges via transformers'
    converter, with the pre-tokenizer the GGUF's `tokenizer.ggml.pre` names
    (the converter has no "smollm" split, so that one is set here, as
    tools/gen_tokenizer_golden.py does for the golden set)."""
    from tokenizers import pre_tokenizers
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (GGUF_TOKENIZER_MAPPING,
                                                                        convert_gguf_tokenizer)
    d = {name: meta[f"tokenizer.{key}"] for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
         if f"tokenizer.{key}" in meta}
    if meta.get("tokenizer.ggml.model") != "gpt2":
        fail("only byte-level BPE (tokenizer.ggml.model = gpt2) vocabularies are converted")
    tok, extra = convert_gguf_tokenizer("llama" if arch == "deci" else arch, d)  # deci: llama.cpp's Llama
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ])
    elif pre not in ("gpt2", "default"):
        fail(f"pre-tokenizer {pre!r}: no faithful tokenizer.json mapping here yet")
    return tok


def token_text(meta, key):
    i = meta.get(key)
    toks = meta["tokenizer.ggml.tokens"]
    return toks[int(i)] if i is not None and 0 <= int(i) < len(toks) else None


def write_tokenizer(out, meta, arch):
    from transformers import PreTrainedTokenizerFast
    tok = build_tokenizer(meta, arch)
    kw = {}
    for name, key in (("bos_token", "tokenizer.ggml.bos_token_id"), ("eos_token", "tokenizer.ggml.eos_token_id"),
                      ("unk_token", "tokenizer.ggml.unknown_token_id"), ("pad_token", "tokenizer.ggml.padding_token_id")):
        t = token_text(meta, key)
        if t is not None:
            kw[name] = t
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False,
                                   model_max_length=int(meta.get(f"{arch}.context_length", 2048)), **kw)
    if "tokenizer.chat_template" in meta:
        fast.chat_template = meta["tokenizer.chat_template"]
    fast.save_pretrained(out)


def write_config(out, meta, arch, hp, dtype, tied, quant=None):
    from transformers import GenerationConfig, LlamaConfig
    ids = {k: meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "padding")}
    cfg = LlamaConfig(
        vocab_size=len(meta["tokenizer.ggml.tokens"]),
        hidden_size=hp["n_embd"],
        intermediate_size=hp["n_ff"],
        num_hidden_layers=hp["n_layer"],
        num_attention_heads=hp["n_head"],
        num_key_value_heads=hp["n_head_kv"],
        head_dim=hp["head_dim"],
        max_position_embeddings=hp["n_ctx"],
        rms_norm_eps=hp["eps"],
        rope_theta=hp["theta"],
        tie_word_embeddings=tied,
        bos_token_id=None if ids["bos"] is None else int(ids["bos"]),
        eos_token_id=None if ids["eos"] is None else int(ids["eos"]),
        pad_token_id=None if ids["padding"] is None else int(ids["padding"]),
        torch_dtype={"bf16": "bfloat16", "f16": "float16", "f32": "float32"}[dtype],
        architectures=["LlamaForCausalLM"],
        **({"quantization_config": quant} if quant else {}),
    )
    cfg.save_pretrained(out)
    GenerationConfig(bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id,
                     pad_token_id=cfg.pad_token_id).save_pretrained(out)


# ---------------------------------------------------------------------------
# The reference GGUF (same numbers, GGUF layout)
# ---------------------------------------------------------------------------

def write_ref_gguf(path, reader, arch, gguf_tensors, dtype):
    from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter
    tmp = path + ".tmp"
    w = GGUFWriter(tmp, arch)
    ftype = {"f32": 0, "f16": 1, "bf16": 32}[dtype]
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = GGUFValueType(int(f.types[0]))
        if key == "general.file_type":
            w.add_key_value(key, ftype, vtype)
        elif vtype == GGUFValueType.ARRAY:
            w.add_key_value(key, f.contents(), vtype, sub_type=GGUFValueType(int(f.types[1])))
        else:
            w.add_key_value(key, f.contents(), vtype)
    for name, (bits, dt) in gguf_tensors.items():
        kind = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[dt]
        if bits.ndim == 1:
            w.add_tensor(name, as_f32(bits, kind))  # norms: F32, as llama.cpp writes them
        elif kind == "bf16":
            w.add_tensor(name, bits.view(np.uint8).reshape(bits.shape[0], -1), raw_dtype=GGMLQuantizationType.BF16)
        else:
            w.add_tensor(name, bits)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)


# ---------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="output directory (created)")
    ap.add_argument("--model", default=DEFAULT_MODEL, help="input GGUF (default: the SmolLM2 Q4_1 model)")
    ap.add_argument("--dtype", choices=("bf16", "f16", "f32"), default="bf16")
    ap.add_argument("--shard-size", type=parse_size, default=0,
                    help="split the weights into shards of at most this many bytes (e.g. 100MB); default one file")
    ap.add_argument("--gguf-out", help="also write a GGUF with the same rounded weights (the comparison reference)")
    ap.add_argument("--quant", choices=("awq", "gptq"),
                    help="write the decoder Linears as a 4-bit AutoAWQ (GEMM) or GPTQ checkpoint")
    ap.add_argument("--group-size", type=int, default=32, help="--quant group size along the input (0: per channel)")
    ap.add_argument("--act-order", action="store_true", help="GPTQ: a g_idx that permutes the input columns (desc_act)")
    args = ap.parse_args()
    if not os.path.isfile(args.model):
        fail(f"{args.model}: no such file")

    convert(read_gguf(args.model), args.out, args.dtype, args.shard_size, args.gguf_out, args.quant, args.group_size,
            args.act_order)


def convert(gguf, out, dtype="bf16", shard_size=0, gguf_out=None, quant=None, group=32, act_order=False):
    """gguf: what read_gguf returned (read once, convert many times).
    quant "awq" / "gptq": the decoder Linears as 4-bit checkpoints (the
    reference GGUF then holds their dequantized values as F32)."""
    reader, meta, arch, src = gguf
    hp = hparams(meta, arch)
    tied = "output.weight" not in src
    hf, gg = {}, {}
    rng = np.random.default_rng(16)
    for name, a in src.items():
        m = re.fullmatch(r"blk\.(\d+)\.([a-z_]+)\.weight", name)
        if m:
            base = LAYER_NAMES.get(m.group(2))
            if base is None:
                fail(f"tensor {name}: no Hugging Face name for it")
            hf_name = f"model.layers.{m.group(1)}.{base}.weight"
        else:
            m = re.fullmatch(r"([a-z_]+)\.weight", name)
            if not m or m.group(1) not in GLOBAL_NAMES:
                fail(f"tensor {name}: no Hugging Face name for it")
            hf_name = GLOBAL_NAMES[m.group(1)] + ".weight"
        heads = hp["n_head"] if name.endswith("attn_q.weight") else \
            hp["n_head_kv"] if name.endswith("attn_k.weight") else 0
        if quant and a.ndim == 2 and name.startswith("blk."):
            ts, deq = quant_tensors(hf_name[:-len(".weight")], unpermute(a, heads) if heads else a,
                                    quant, group, act_order, rng)
            hf.update(ts)
            gg[name] = (np.ascontiguousarray(permute(deq, heads) if heads else deq), "float32")
            continue
        bits, st_dtype = round_to(a, dtype)
        gg[name] = (bits, st_dtype)
        if heads:
            bits = np.ascontiguousarray(unpermute(bits, heads))
        hf[hf_name] = (bits, st_dtype)

    os.makedirs(out, exist_ok=True)
    n_shards = write_weights(out, hf, shard_size)
    qcfg = None
    if quant == "awq":
        qcfg = {"quant_method": "awq", "bits": 4, "group_size": group or -1, "zero_point": True, "version": "gemm"}
    elif quant == "gptq":
        qcfg = {"quant_method": "gptq", "bits": 4, "group_size": group or -1, "desc_act": act_order, "sym": False,
                "checkpoint_format": "gptq"}
    write_config(out, meta, arch, hp, dtype, tied, qcfg)
    write_tokenizer(out, meta, arch)
    if gguf_out:
        write_ref_gguf(gguf_out, reader, arch, gg, dtype)
    print(f"gguf_to_hf: {out}: {len(hf)} tensors ({dtype}{', ' + quant if quant else ''}) in {n_shards} safetensors file(s)"
          + (f"; reference GGUF {gguf_out}" if gguf_out else ""))
    return n_shards


if __name__ == "__main__":
    main()
