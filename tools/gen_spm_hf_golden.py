#!/usr/bin/env python3
"""gen_spm_hf_golden.py — SentencePiece-style tokenizer.json files and their golden ids.

A Hugging Face Llama-family directory with a SentencePiece vocabulary ships
a tokenizer.json whose model is BPE with byte_fallback. Two shapes exist in
the wild, and transformers' GGUF converter builds both from the same
vocabulary (tests/golden/spm_tiny.gguf, made by tools/gen_spm_test_model.py):

  spm_tiny_tokenizer.json         architecture "llama": pre_tokenizer
                                  Metaspace(prepend_scheme "first", split
                                  false), no normalizer (what current
                                  transformers writes for Llama 2, Mistral);
  spm_tiny_legacy_tokenizer.json  architecture "phi3": normalizer
                                  Sequence[Prepend("▁"), Replace(" ", "▁")],
                                  no pre_tokenizer (the older files);
  spm_tiny_split_tokenizer.json   the first with Metaspace split true and
                                  prepend_scheme "always" (words start at
                                  each "▁"; merges stay inside a word), an
                                  edit of the converter's file, since no
                                  builder writes it.

Nobody here writes those files: the vocabulary and scores are read with the
`gguf` package and handed to transformers' convert_gguf_tokenizer, which
builds the merges from the scores and picks normalizer, pre-tokenizer and
decoder itself. The golden ids are what Hugging Face `tokenizers` gives
(encode without special tokens; added tokens are always split out, so it is
luainfer's parse_special = true) for every string of spm_tiny.jsonl.gz and
of tokenizer_smollm2.jsonl.gz (> 12,000 strings): spm_tiny_hf.jsonl.gz and
spm_tiny_legacy_hf.jsonl.gz, "rt": false where tokenizers' own decode does
not give the text back.

Needs: gguf, tokenizers, transformers (tools/requirements-test.txt).
Usage: .venv/bin/python tools/gen_spm_hf_golden.py
"""
import gzip
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from gguf_writer import write_golden  # noqa: E402  (tools/ is on the path now)

GOLDEN = os.path.join(ROOT, "tests", "golden")
SRC = os.path.join(GOLDEN, "spm_tiny.gguf")
CORPORA = [os.path.join(GOLDEN, "spm_tiny.jsonl.gz"), os.path.join(GOLDEN, "tokenizer_smollm2.jsonl.gz")]
VARIANTS = [("llama", "spm_tiny_tokenizer.json", "spm_tiny_hf.jsonl.gz", None),
            ("phi3", "spm_tiny_legacy_tokenizer.json", "spm_tiny_legacy_hf.jsonl.gz", None),
            ("llama", "spm_tiny_split_tokenizer.json", "spm_tiny_split_hf.jsonl.gz",
             lambda j: j["pre_tokenizer"].update(split=True, prepend_scheme="always"))]


def tokenizer_dict(path):
    """transformers' tokenizer dict (GGUF_TOKENIZER_MAPPING's names) from the GGUF metadata."""
    import gguf
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING
    r = gguf.GGUFReader(path)
    d = {}
    for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items():
        f = r.fields.get("tokenizer." + key)
        if f is not None:
            d[name] = f.contents()
    return d


def main():
    from tokenizers import Tokenizer
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer
    corpus, seen = [], set()
    for c in CORPORA:
        with gzip.open(c, "rt", encoding="utf-8") as f:
            for line in f:
                s = json.loads(line)["text"]
                if s not in seen:
                    seen.add(s)
                    corpus.append(s)
    d = tokenizer_dict(SRC)
    for arch, json_name, golden_name, edit in VARIANTS:
        backend, _ = convert_gguf_tokenizer(arch, dict(d))
        text = backend.to_str(pretty=True)
        if edit:
            j = json.loads(text)
            edit(j)
            text = json.dumps(j, ensure_ascii=False, indent=2)
        tok = Tokenizer.from_str(text)  # the file as written, read back
        out = os.path.join(GOLDEN, json_name)
        with open(out + ".tmp", "w", encoding="utf-8") as f:
            f.write(text + "\n")
        os.replace(out + ".tmp", out)
        ids = [tok.encode(s, add_special_tokens=False).ids for s in corpus]
        rt = [tok.decode(i, skip_special_tokens=False) == s for i, s in zip(ids, corpus)]
        gout = os.path.join(GOLDEN, golden_name)
        write_golden(gout + ".tmp", corpus, ids, rt)
        os.replace(gout + ".tmp", gout)
        j = json.loads(text)
        print(f"{json_name}: normalizer {j['normalizer'] and j['normalizer']['type']}, pre_tokenizer "
              f"{j['pre_tokenizer'] and j['pre_tokenizer']['type']}; {golden_name}: {len(corpus)} strings, "
              f"{sum(rt)} round-trip")


if __name__ == "__main__":
    main()
