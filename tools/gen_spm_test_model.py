#!/usr/bin/env python3
"""gen_spm_test_model.py — a small SentencePiece-BPE GGUF and golden ids.

Trains a real SentencePiece BPE model the way Llama's was made (byte
fallback, split digits, identity normalization, dummy prefix, whitespace-only
pieces), converts it to a vocab-only GGUF as llama.cpp's converter does
(tokens, scores, token types, tokenizer.ggml.model = "llama"), and records
llama.cpp's ids for a seeded corpus:

  tests/golden/spm_tiny.gguf          the vocabulary (architecture "llama", no tensors)
  tests/golden/spm_tiny.jsonl.gz      {"text", "ids"[, "rt": false]} per line

Golden ids come from llama.cpp (llama-cpp-python, vocab_only, special=True,
no BOS): for GGUF SPM files llama.cpp's behaviour is the definition. Two more
references are compared and their disagreements printed:
  sentencepiece   the trained model itself (on strings without special tokens,
                  which it would not parse);
  hf-gguf         transformers' GGUF converter (LlamaTokenizer with merges
                  rebuilt from scores).
"rt": false marks strings llama.cpp itself does not decode back to the text.

Needs: gguf, llama-cpp-python, transformers, sentencepiece
(`.venv/bin/pip install sentencepiece`).
Usage: .venv/bin/python tools/gen_spm_test_model.py
"""
import io
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from gguf_writer import write_golden, write_vocab_gguf  # noqa: E402  (tools/ is on the path now)

OUT_GGUF = os.path.join(ROOT, "tests", "golden", "spm_tiny.gguf")
OUT_GOLDEN = os.path.join(ROOT, "tests", "golden", "spm_tiny.jsonl.gz")

SEED = 7
VOCAB_SIZE = 2000
N_TRAIN = 4000
N_GOLDEN = 2000

EXTRA = ["", " ", "  ", "hello", " hello", "  hello  ", "Hello world", "<s>", "</s>", "<unk>", "<sep>",
         "<s>hello", "hello</s>", "a<sep>b", "a <sep> b", "<s> <s>", "<s></s>", "x\n\ny", "\t\ttab",
         "1234567890", "3.14159", "日本語のテキスト", "😀👍🏽", "naïve café", "e\u0301", "\u00a0nbsp",
         "trailing ", "▁literal", "<0x41>", "<unk>x<unk>", "  \n  ", "Ω≈ç√∫", "Привет мир"]


def train_sp(texts):
    import sentencepiece as spm
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=buf, model_type="bpe", vocab_size=VOCAB_SIZE,
        byte_fallback=True, split_digits=True, character_coverage=0.9995, normalization_rule_name="identity",
        add_dummy_prefix=True, remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
        user_defined_symbols=["<sep>"], unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1,
        max_sentence_length=1 << 16, minloglevel=2)
    return spm.SentencePieceProcessor(model_proto=buf.getvalue())


def write_gguf(sp, path):
    import gguf
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            t = gguf.TokenType.UNKNOWN
        elif sp.is_control(i):
            t = gguf.TokenType.CONTROL
        elif sp.is_unused(i):
            t = gguf.TokenType.UNUSED
        elif sp.is_byte(i):
            t = gguf.TokenType.BYTE
        elif tokens[-1] == "<sep>":
            t = gguf.TokenType.USER_DEFINED
        else:
            t = gguf.TokenType.NORMAL
        types.append(t)
    write_vocab_gguf(path, "spm-tiny", model="llama", pre="default", tokens=tokens, types=types, scores=scores,
                     bos_id=1, eos_id=2, unk_id=0, add_bos=True, add_eos=False, add_space_prefix=True)


def lc_detokenize(llm, ids):
    # llama_detokenize itself (the Python wrapper's detokenize skips its
    # leading-space rule): keep specials, unparse them to text.
    import ctypes
    import llama_cpp
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    cap = 16 * len(ids) + 16
    for _ in range(2):
        buf = ctypes.create_string_buffer(cap)
        n = llama_cpp.llama_detokenize(llm._model.vocab, arr, len(ids), buf, cap, False, True)
        if n >= 0:
            return buf.raw[:n]
        cap = -n  # too small: it says how much it needs
    raise RuntimeError("llama_detokenize failed")


def hf_from_gguf(path):
    from gen_tokenizer_golden import load_gguf_tokenizer_dict
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer
    arch, d = load_gguf_tokenizer_dict(path)
    tok, _ = convert_gguf_tokenizer(arch, d)
    return tok


def main():
    import gen_tokenizer_golden as g
    from gen_tokenizer_golden import make_corpus
    from llama_cpp import Llama

    # Train on the natural-language parts of the corpus only; the random
    # codepoints would need thousands of single-char pieces. Characters left
    # out still get tested: they take the byte-fallback path.
    common = set("".join(g.SCRIPTS.values()) + " ".join(g.EN_WORDS) + "".join(g.CODE_SNIPPETS)
                 + "".join(g.PUNCT) + "0123456789 \t\n")
    train = [t for t in make_corpus(N_TRAIN, SEED) if t.strip() and set(t) <= common]
    sp = train_sp(train)
    os.makedirs(os.path.dirname(OUT_GGUF), exist_ok=True)
    write_gguf(sp, OUT_GGUF)
    print(f"wrote {OUT_GGUF} ({os.path.getsize(OUT_GGUF)} bytes, {sp.vocab_size()} tokens)")

    rng = random.Random(SEED + 1)
    corpus = EXTRA + [t for t in make_corpus(N_GOLDEN, SEED + 1) if "\x00" not in t]
    # Special tokens dropped into plain text, after and before spaces.
    for i in range(200):
        s = corpus[rng.randrange(len(EXTRA), len(corpus))]
        k = rng.randrange(len(s) + 1)
        corpus.append(s[:k] + rng.choice(["<s>", "</s>", "<sep>", "<unk>", " <s> ", "<s> "]) + s[k:])
    corpus = list(dict.fromkeys(corpus))

    llm = Llama(model_path=OUT_GGUF, vocab_only=True, verbose=False)
    golden = [llm.tokenize(s.encode("utf-8"), add_bos=False, special=True) for s in corpus]
    rt = [lc_detokenize(llm, ids) == s.encode("utf-8") for s, ids in zip(corpus, golden)]

    specials = ("<s>", "</s>", "<unk>", "<sep>")
    plain = [i for i, s in enumerate(corpus) if not any(x in s for x in specials)]
    sp_diff = [i for i in plain if sp.encode(corpus[i]) != golden[i]]
    print(f"llama.cpp vs sentencepiece: {len(sp_diff)}/{len(plain)} plain strings differ")
    for i in sp_diff[:5]:
        print(f"  {corpus[i][:50]!r}: lc={golden[i][:12]} sp={sp.encode(corpus[i])[:12]}")
    hf = hf_from_gguf(OUT_GGUF)
    hf_ids = [e.ids for e in hf.encode_batch(corpus, add_special_tokens=False)]
    hf_diff = [i for i in range(len(corpus)) if hf_ids[i] != golden[i]]
    print(f"llama.cpp vs hf-gguf: {len(hf_diff)}/{len(corpus)} differ "
          f"({sum(1 for i in hf_diff if i in set(plain))} without special tokens)")
    for i in hf_diff[:5]:
        print(f"  {corpus[i][:50]!r}: lc={golden[i][:12]} hf={hf_ids[i][:12]}")
    print(f"llama.cpp round-trip: {sum(rt)}/{len(rt)}")

    write_golden(OUT_GOLDEN, corpus, golden, rt)
    print(f"wrote {OUT_GOLDEN} ({os.path.getsize(OUT_GOLDEN)} bytes, {len(corpus)} strings)")


if __name__ == "__main__":
    main()
