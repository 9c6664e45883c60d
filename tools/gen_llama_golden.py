#!/usr/bin/env python3
"""Generate the llama.cpp reference outputs that luainfer's parity tests check.

Run from anywhere:   .venv/bin/python tools/gen_llama_golden.py [--model M]

Writes two files (both compact JSON, meant to be committed):

  tests/golden/llama_cpp_greedy.json
      For each prompt: the prompt text, its token ids, up to 64 greedy tokens from
      llama.cpp, their text, and at every generated position the top-40
      (token id, raw logit) pairs of the logits that produced that token.

      Next to each top-40 row it also stores "ref_logits": the logits of the
      same 40 ids from an exact float64 forward pass of the same GGUF weights
      (dequantized; no activation quantization, no F16 KV cache -- see
      RefLlama below). llama.cpp itself rounds activations to 8 bits inside
      its matmuls, so its logits carry an error of a few tenths; the exact
      values let a test tell that rounding noise from an engine bug.

  tests/golden/llama_cpp_perplexity.json
      Perplexity of tests/data/alice_ch1.txt at ctx 128 and 512, computed with
      the chunk scheme of llama.cpp's `perplexity` tool (see ppl_chunks below).

Why a hand-written eval loop instead of Llama.__call__/create_completion: the
high-level API adds samplers, grammar hooks, BOS handling and stop strings that
we would have to reason about. Here every step is explicit: tokenize (special
tokens parsed, no BOS: the model has add_bos=false), eval, argmax, feed back,
stop at the first end-of-generation token (llama_vocab_is_eog), which is not
recorded -- the same rule as `luainfer generate --temperature 0`.

Argmax ties (never seen in practice with float logits) are broken toward the
lower token id, like a plain first-max scan.

Needs llama-cpp-python, jinja2 (comes with llama-cpp-python) and gguf
(for the reference pass).
"""

import argparse
import json
import math
import os
import platform
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
GOLDEN_DIR = os.path.join(ROOT, "tests", "golden")
PPL_TEXT = os.path.join(ROOT, "tests", "data", "alice_ch1.txt")

N_CTX = 2048          # llama.cpp context for the greedy runs (ppl uses its own)
N_THREADS = 2
MAX_TOKENS = 64
TOP_K_LOGITS = 40
PPL_CTXS = (128, 512)
LOGIT_DECIMALS = 4    # rounding of the stored exact (float64) logits
# llama.cpp's own logits are stored exactly: the shortest decimal that reads
# back as the same float32, so `luainfer generate --isa ggml` (llama.cpp's
# arithmetic) can be checked bit for bit.

# ---------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------
# kind "raw":  the text is passed to `generate --prompt` as is.
# kind "chat": `user` is the single user message; `generate --chat --prompt
#              USER` must produce exactly the rendered template text.
PROMPTS = [
    {"name": "prose", "kind": "raw",
     "text": "The old lighthouse keeper climbed the spiral stairs every "
             "evening, and on the night of the great storm he saw"},
    {"name": "question", "kind": "raw",
     "text": "Question: What is the largest planet in the solar system, "
             "and how big is it?\nAnswer:"},
    {"name": "python", "kind": "raw",
     "text": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number."
             "\"\"\"\n    if n < 2:\n"},
    {"name": "c_code", "kind": "raw",
     "text": "#include <stdio.h>\n#include <string.h>\n\n/* Reverse a string "
             "in place. */\nvoid reverse(char *s) {\n    size_t n = strlen(s);\n"},
    {"name": "unicode", "kind": "raw",
     "text": "Caf\u00e9, na\u00efve, fa\u00e7ade, se\u00f1or \u2014 "
             "\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3059\u3002"
             " \u041f\u0440\u0438\u0432\u0435\u0442! Emoji: \U0001F600\U0001F680"
             "\u2764\ufe0f. Translate to English:"},
    {"name": "numbers_list", "kind": "raw",
     "text": "Prime numbers below 100:\n2, 3, 5, 7, 11, 13,"},
    {"name": "markdown_list", "kind": "raw",
     "text": "## Packing list for a weekend hike\n\n1. Water (2 liters)\n"
             "2. Rain jacket\n3."},
    {"name": "whitespace", "kind": "raw",
     "text": "  Indented line\n\n\n\tTabbed line with    four spaces   and "
             "trailing  \nNext:"},
    {"name": "raw_special_tokens", "kind": "raw",
     "text": "<|im_start|>system\nYou are a terse assistant.<|im_end|>\n"
             "<|im_start|>user\nName three colors.<|im_end|>\n"
             "<|im_start|>assistant\n"},
    {"name": "chat_fact", "kind": "chat",
     "user": "What is the boiling point of water at sea level in Celsius "
             "and Fahrenheit?"},
    {"name": "chat_haiku", "kind": "chat",
     "user": "Write a haiku about autumn leaves."},
    {"name": "chat_code", "kind": "chat",
     "user": "How do I reverse a list in Python?"},
]


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------
def render_chat(template_src, user, bos, eos):
    """Render the GGUF's own chat template for one user message."""
    import jinja2

    env = jinja2.Environment(trim_blocks=False, lstrip_blocks=False,
                             keep_trailing_newline=True)
    tmpl = env.from_string(template_src)
    return tmpl.render(messages=[{"role": "user", "content": user}],
                       add_generation_prompt=True,
                       bos_token=bos, eos_token=eos)


def top_k_pairs(row, k):
    """The k largest logits as [[id, logit], ...], by logit desc, id asc."""
    idx = np.argpartition(-row, k)[:k]
    order = sorted(idx.tolist(), key=lambda i: (-float(row[i]), i))
    return [[int(i), f32_exact(row[i])] for i in order]


def f32_exact(v):
    """A float32 as the shortest decimal that round-trips to it."""
    return float(str(np.float32(v)))


def argmax_first(row):
    return int(np.argmax(row))  # numpy returns the first maximal index


def greedy(llm, is_eog, prompt_ids):
    """Greedy decode MAX_TOKENS tokens with an explicit eval loop."""
    llm.reset()
    llm.eval(prompt_ids)
    gen, tops = [], []
    finish, stop_top = "length", None
    for _ in range(MAX_TOKENS):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        tok = argmax_first(row)
        if is_eog(tok):
            finish, stop_top = "stop", top_k_pairs(row, TOP_K_LOGITS)
            break
        tops.append(top_k_pairs(row, TOP_K_LOGITS))
        gen.append(tok)
        llm.eval([tok])
    return gen, tops, finish, stop_top


def log_softmax_at(row, tok):
    row = row.astype(np.float64)
    m = row.max()
    return float(row[tok] - m - math.log(np.exp(row - m).sum()))


def ppl_chunks(llm, tokens, ctx):
    """llama.cpp `perplexity` scheme.

    n_chunks = floor(n_tokens / ctx). Chunk c is tokens[c*ctx:(c+1)*ctx],
    evaluated from an empty cache (no BOS is inserted: add_bos=false). The
    scored positions are j = ctx/2 .. ctx-2; each contributes
    -log p(token[j+1] | logits at j). ppl = exp(sum nll / n_scored).
    """
    n_chunks = len(tokens) // ctx
    first = ctx // 2
    nll_sum, n_scored, per_chunk = 0.0, 0, []
    for c in range(n_chunks):
        chunk = tokens[c * ctx:(c + 1) * ctx]
        llm.reset()
        llm.eval(chunk)
        scores = llm.scores[:ctx]
        c_nll, c_n = 0.0, 0
        for j in range(first, ctx - 1):
            c_nll -= log_softmax_at(np.asarray(scores[j]), chunk[j + 1])
            c_n += 1
        nll_sum += c_nll
        n_scored += c_n
        per_chunk.append(round(math.exp(nll_sum / n_scored), 6))
    return {
        "ctx": ctx,
        "n_chunks": n_chunks,
        "n_scored": n_scored,
        "nll_sum": round(nll_sum, 6),
        "perplexity": round(math.exp(nll_sum / n_scored), 6),
        "running_ppl_per_chunk": per_chunk,
    }


def dump(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {os.path.relpath(path, ROOT)} ({os.path.getsize(path)} bytes)")


# ---------------------------------------------------------------------------
# Exact reference: float64 forward pass over the dequantized GGUF weights
# ---------------------------------------------------------------------------
class RefLlama:
    """The Llama architecture written as plain math, in float64.

    Weights are the GGUF's own, dequantized (so quantization of the weights
    is part of the model); everything else is exact: no 8-bit activations,
    no F16 KV cache, float64 accumulation. Rope is llama.cpp's "normal" mode
    (adjacent pairs), which is what GGUF llama checkpoints are permuted for.
    """

    def __init__(self, path):
        import gguf

        r = gguf.GGUFReader(path)

        def meta(key):
            f = r.fields[key]
            return f.parts[f.data[0]][0]

        self.n_layer = int(meta("llama.block_count"))
        self.n_head = int(meta("llama.attention.head_count"))
        self.n_head_kv = int(meta("llama.attention.head_count_kv"))
        self.eps = float(meta("llama.attention.layer_norm_rms_epsilon"))
        self.rope_base = float(meta("llama.rope.freq_base"))
        self.w = {t.name: gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
                  for t in r.tensors}
        self.dim = self.w["token_embd.weight"].shape[1]
        self.head_dim = self.dim // self.n_head
        # tied embeddings: no output.weight, the token embedding is the head
        self.out = self.w.get("output.weight", self.w["token_embd.weight"])

    def _rms(self, x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * g

    def _rope(self, x, pos):            # x: (T, heads, head_dim)
        hd = self.head_dim
        theta = pos[:, None] * self.rope_base ** (-np.arange(0, hd, 2) / hd)
        c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def _mm(self, h, l, name):
        """h times layer l's weight `name` (attn_q, ..., ffn_down), transposed:
        the one place a subclass can watch or alter a matmul's input."""
        return h @ self.w[f"blk.{l}.{name}.weight"].T

    def logits(self, tokens):
        """(len(tokens), n_vocab) logits, causal, from an empty cache."""
        w, T = self.w, len(tokens)
        hd, nh, nkv = self.head_dim, self.n_head, self.n_head_kv
        pos = np.arange(T, dtype=np.float64)
        mask = np.triu(np.full((T, T), -np.inf), 1)
        x = w["token_embd.weight"][tokens]
        for l in range(self.n_layer):
            p = f"blk.{l}."
            h = self._rms(x, w[p + "attn_norm.weight"])
            q = self._rope(self._mm(h, l, "attn_q").reshape(T, nh, hd), pos)
            k = self._rope(self._mm(h, l, "attn_k").reshape(T, nkv, hd), pos)
            v = self._mm(h, l, "attn_v").reshape(T, nkv, hd)
            att = np.empty((T, nh, hd))
            for i in range(nh):
                j = i // (nh // nkv)                      # grouped-query attention
                sc = q[:, i] @ k[:, j].T / math.sqrt(hd) + mask
                sc = np.exp(sc - sc.max(-1, keepdims=True))
                att[:, i] = (sc / sc.sum(-1, keepdims=True)) @ v[:, j]
            x = x + self._mm(att.reshape(T, -1), l, "attn_output")
            h = self._rms(x, w[p + "ffn_norm.weight"])
            g = self._mm(h, l, "ffn_gate")
            u = self._mm(h, l, "ffn_up")
            x = x + self._mm(g / (1.0 + np.exp(-g)) * u, l, "ffn_down")
        return self._rms(x, w["output_norm.weight"]) @ self.out.T


def ref_rows(ref, rec):
    """Exact logits of the ids in each top-40 row of rec, aligned with it."""
    L = ref.logits(rec["prompt_tokens"] + rec["tokens"])
    P = len(rec["prompt_tokens"])

    def pick(row, pairs):
        return [round(float(row[i]), LOGIT_DECIMALS) for i, _ in pairs]

    rows = [pick(L[P - 1 + i], pairs) for i, pairs in enumerate(rec["top_logits"])]
    stop = pick(L[-1], rec["stop_top_logits"]) if rec["stop_top_logits"] else None
    top1 = [int(np.argmax(L[P - 1 + i])) for i in range(len(rec["tokens"]))]
    return rows, stop, top1


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.environ.get("LUAINFER_MODEL", DEFAULT_MODEL))
    ap.add_argument("--skip-ppl", action="store_true")
    args = ap.parse_args()

    import llama_cpp
    from llama_cpp import Llama

    def load(n_ctx):
        return Llama(model_path=args.model, n_ctx=n_ctx, n_threads=N_THREADS,
                     logits_all=True, seed=0, verbose=False)

    llm = load(N_CTX)
    vocab = llm._model.vocab
    n_vocab = llm.n_vocab()

    def is_eog(t):
        return bool(llama_cpp.llama_vocab_is_eog(vocab, t))

    eog_ids = [t for t in range(n_vocab) if is_eog(t)]
    meta = llm.metadata
    template_src = meta["tokenizer.chat_template"]
    bos = llm.detokenize([int(meta["tokenizer.ggml.bos_token_id"])], special=True).decode()
    eos = llm.detokenize([int(meta["tokenizer.ggml.eos_token_id"])], special=True).decode()

    cp = llm.context_params
    source = {
        "tool": "tools/gen_llama_golden.py",
        "llama_cpp_python_version": llama_cpp.__version__,
        "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "model_file": os.path.basename(args.model),
        "model_size_bytes": os.path.getsize(args.model),
        "llama_flags": {
            "n_ctx": N_CTX, "n_threads": N_THREADS, "n_batch": llm.n_batch,
            "n_ubatch": cp.n_ubatch, "logits_all": True, "seed": 0,
            "flash_attn_type": int(cp.flash_attn_type),  # 0 = disabled
            "type_k": int(cp.type_k), "type_v": int(cp.type_v),  # 1 = F16 KV cache
            "n_gpu_layers": 0,
        },
        "tokenize": {"add_bos": False, "special": True},
        "sampling": "greedy argmax over raw logits (first max on ties)",
        "stop": "first token with llama_vocab_is_eog; not recorded",
        "logit_decimals": LOGIT_DECIMALS,
        "top_logits_precision": "float32, exact (shortest round-trip decimal)",
        "ref_logits": "RefLlama in this script: float64 forward over the "
                      "dequantized GGUF weights, aligned with top_logits ids",
    }

    # ---- greedy continuations -------------------------------------------
    out_prompts = []
    for p in PROMPTS:
        if p["kind"] == "chat":
            text = render_chat(template_src, p["user"], bos, eos)
        else:
            text = p["text"]
        prompt_ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        gen, tops, finish, stop_top = greedy(llm, is_eog, prompt_ids)
        rec = {
            "name": p["name"],
            "chat": p["kind"] == "chat",
            "prompt": text,
        }
        if p["kind"] == "chat":
            rec["user"] = p["user"]
        rec.update({
            "prompt_tokens": prompt_ids,
            "tokens": gen,
            "finish_reason": finish,
            "text": llm.detokenize(gen, special=False).decode("utf-8", errors="replace"),
            "text_special": llm.detokenize(gen, special=True).decode("utf-8", errors="replace"),
            "top_logits": tops,
            # the logits that picked the EOG token (finish_reason "stop" only):
            # lets a test judge a stop-vs-continue divergence as a near-tie
            "stop_top_logits": stop_top,
        })
        out_prompts.append(rec)
        print(f"{p['name']:>20}: {len(prompt_ids):3d} prompt tokens, "
              f"{len(gen):2d} generated ({finish}): {rec['text'][:60]!r}")

    del llm
    ref = RefLlama(args.model)
    agree = total = 0
    for rec in out_prompts:
        rows, stop, top1 = ref_rows(ref, rec)
        rec["ref_logits"] = rows
        rec["stop_ref_logits"] = stop
        agree += sum(a == b for a, b in zip(top1, rec["tokens"]))
        total += len(top1)
    del ref
    print(f"exact reference: argmax equals llama.cpp's token at {agree}/{total} positions")

    greedy_doc = {
        "source": source,
        "chat_template": template_src,
        "eog_token_ids": eog_ids,
        "max_tokens": MAX_TOKENS,
        "top_logits_k": TOP_K_LOGITS,
        "prompts": out_prompts,
    }
    os.makedirs(GOLDEN_DIR, exist_ok=True)
    dump(os.path.join(GOLDEN_DIR, "llama_cpp_greedy.json"), greedy_doc)

    # ---- perplexity ------------------------------------------------------
    if args.skip_ppl:
        return 0
    with open(PPL_TEXT, "rb") as f:
        raw = f.read()
    results = []
    for ctx in PPL_CTXS:
        llm = load(max(ctx, 512))
        toks = llm.tokenize(raw, add_bos=False, special=False)
        r = ppl_chunks(llm, toks, ctx)
        r["n_tokens"] = len(toks)
        print(f"ppl ctx={ctx}: {r['perplexity']:.4f} "
              f"({r['n_chunks']} chunks, {r['n_scored']} scored, {len(toks)} tokens)")
        results.append(r)
        del llm
    ppl_source = dict(source, llama_flags=dict(source["llama_flags"], n_ctx="max(ctx, 512)"),
                      tokenize={"add_bos": False, "special": False})
    for key in ("sampling", "stop", "ref_logits", "top_logits_precision"):
        ppl_source.pop(key)
    ppl_doc = {
        "source": ppl_source,
        "text_file": os.path.relpath(PPL_TEXT, ROOT),
        "scheme": "llama.cpp perplexity: floor(n/ctx) chunks of ctx tokens, each "
                  "from an empty cache; score j = ctx/2 .. ctx-2 with "
                  "-log p(tok[j+1] | logits[j]); ppl = exp(mean)",
        "results": results,
    }
    dump(os.path.join(GOLDEN_DIR, "llama_cpp_perplexity.json"), ppl_doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
