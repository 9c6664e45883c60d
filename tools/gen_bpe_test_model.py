#!/usr/bin/env python3
"""gen_bpe_test_model.py — a small Llama-3-style byte-level BPE GGUF and golden ids.

Trains a byte-level BPE with Hugging Face `tokenizers` the way Llama 3's is
set up (Llama 3 split regex, ByteLevel alphabet, ignore_merges, special
tokens <|begin_of_text|>, <|eot_id|>, ...), writes it as a vocab-only GGUF
with tokenizer.ggml.pre = "llama-bpe", and records HF's ids for a seeded
corpus:

  tests/golden/tokenizer_llama3_tiny.gguf
  tests/golden/tokenizer_llama3_tiny.jsonl.gz   {"text", "ids"[, "rt": false]}

This covers what the SmolLM2 vocabulary does not: the Llama 3 pre-tokenizer,
ignore_merges, BOS added by default, a vocabulary with every byte. llama.cpp
(llama-cpp-python, vocab_only, special=True) is compared and disagreements
are printed.

Usage: .venv/bin/python tools/gen_bpe_test_model.py
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from gguf_writer import write_golden, write_vocab_gguf  # noqa: E402  (tools/ is on the path now)

OUT_GGUF = os.path.join(ROOT, "tests", "golden", "tokenizer_llama3_tiny.gguf")
OUT_GOLDEN = os.path.join(ROOT, "tests", "golden", "tokenizer_llama3_tiny.jsonl.gz")

SEED = 11
VOCAB_SIZE = 3000
N_GOLDEN = 2000
UNREACHABLE = ["\u0120flibbertigibbet", "\u0120qwertyuiop", "Zyzzyva", "\u0120caf\u00c3\u00a9ine", "\u0120\u00e6\u0139\u00a5\u00e6\u013e\u00ac"]
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

EXTRA = ["", " ", " flibbertigibbet", "a qwertyuiop b", "Zyzzyva!", "caféine", " caféine", "x 日本"," 日本語", "hello", " hello", "Hello world", "<|begin_of_text|>Hi", "a<|eot_id|>b",
         "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>", "1234567", "  x  \n\n  y",
         "IT'S THEY'RE we'Ll", "日本語 😀", "\r\n\r\n", "<|eot_id", "<|begin_of_text|><|begin_of_text|>"]


def train(texts):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: F811
    from transformers.integrations.gguf.gguf_tokenizer_mapping import _LLAMA3_SPLIT
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    # Whole-word tokens no merge sequence reaches (real Llama 3 vocabularies
    # have such tokens): only ignore_merges can produce them.
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    for w in UNREACHABLE:
        if w not in vocab:
            vocab[w] = len(vocab)
    tok = Tokenizer.from_str(json.dumps(j))
    tok.add_special_tokens(SPECIALS)
    return tok


def write_gguf(tok, path):
    import gguf
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    for a in j["added_tokens"]:
        vocab[a["content"]] = a["id"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    assert all(t is not None for t in tokens)
    types = [gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    write_vocab_gguf(path, "llama3-tiny", model="gpt2", pre="llama-bpe", tokens=tokens, types=types,
                     merges=merges, bos_id=vocab["<|begin_of_text|>"], eos_id=vocab["<|end_of_text|>"],
                     eot_id=vocab["<|eot_id|>"], add_bos=True)


def main():
    import random
    from gen_tokenizer_golden import make_corpus
    from llama_cpp import Llama

    tok = train([t for t in make_corpus(4000, SEED) if t.strip()])
    write_gguf(tok, OUT_GGUF)
    print(f"wrote {OUT_GGUF} ({os.path.getsize(OUT_GGUF)} bytes, {tok.get_vocab_size()} tokens)")

    rng = random.Random(SEED + 1)
    corpus = EXTRA + [t for t in make_corpus(N_GOLDEN, SEED + 1) if "\x00" not in t]
    for _ in range(100):
        s = corpus[rng.randrange(len(EXTRA), len(corpus))]
        k = rng.randrange(len(s) + 1)
        corpus.append(s[:k] + rng.choice(SPECIALS) + s[k:])
    corpus = list(dict.fromkeys(corpus))

    golden = [e.ids for e in tok.encode_batch(corpus, add_special_tokens=False)]
    rt = [tok.decode(ids, skip_special_tokens=False) == s for s, ids in zip(corpus, golden)]

    # How much ignore_merges matters here: the same tokenizer without it.
    j = json.loads(tok.to_str())
    j["model"]["ignore_merges"] = False
    from tokenizers import Tokenizer
    plain = Tokenizer.from_str(json.dumps(j))
    n_im = sum(1 for s, ids in zip(corpus, golden) if plain.encode(s, add_special_tokens=False).ids != ids)
    assert n_im > 0, "the corpus should exercise ignore_merges"
    print(f"strings where ignore_merges changes the ids: {n_im}")

    llm = Llama(model_path=OUT_GGUF, vocab_only=True, verbose=False)
    lc = [llm.tokenize(s.encode("utf-8"), add_bos=False, special=True) for s in corpus]
    diff = [i for i in range(len(corpus)) if lc[i] != golden[i]]
    print(f"hf vs llama.cpp: {len(diff)}/{len(corpus)} differ")
    for i in diff[:5]:
        print(f"  {corpus[i][:50]!r}: hf={golden[i][:12]} lc={lc[i][:12]}")

    write_golden(OUT_GOLDEN, corpus, golden, rt)
    print(f"wrote {OUT_GOLDEN} ({os.path.getsize(OUT_GOLDEN)} bytes, {len(corpus)} strings, "
          f"{len(rt) - sum(rt)} do not round-trip)")


if __name__ == "__main__":
    main()
