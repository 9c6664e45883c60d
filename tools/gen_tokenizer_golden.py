#!/usr/bin/env python3
"""gen_tokenizer_golden.py — golden token ids for the SmolLM2 tokenizer.

Builds a deterministic (seeded) corpus of >= 10,000 strings (English, code,
whitespace runs, numbers, many scripts, combining marks, emoji with ZWJ and
skin tones, special-token lookalikes, contractions, empty-ish strings), then
encodes every string with Hugging Face `tokenizers` built from the GGUF's own
vocabulary and merges, and writes tests/golden/tokenizer_smollm2.jsonl.gz
(one {"text": ..., "ids": [...]} per line).

References (all loaded from the local GGUF, no Hub access):
  hf-orig  the golden one: SmolLM2's Hub tokenizer.json pipeline, i.e. the
           GGUF vocab/merges with pre_tokenizer Sequence[Digits(individual),
           ByteLevel(add_prefix_space=False)] and the CONTROL tokens added as
           special tokens (HF always splits added tokens out of the text, so it
           is our parse_special=true).
  hf-gguf  what `AutoTokenizer.from_pretrained(dir, gguf_file=...)` builds:
           transformers' own GGUF converter. It has no "smollm" split, so it
           groups digits (" 123" is one word); reported, not followed.
  llama.cpp llama-cpp-python's vocab_only tokenizer (when importable), with
           special=True; disagreements with hf-orig are reported.

Usage: .venv/bin/python tools/gen_tokenizer_golden.py [--model PATH] [--n N]
"""
import argparse
import gzip
import json
import os
import random
import sys
import time
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
DEFAULT_OUT = os.path.join(ROOT, "tests", "golden", "tokenizer_smollm2.jsonl.gz")
PRETOK_OUT = os.path.join(ROOT, "tests", "golden", "tokenizer_pretok.jsonl.gz")
N_PRETOK = 3000

# ---------------------------------------------------------------------------
# Corpus
# ---------------------------------------------------------------------------

EN_WORDS = """the of and to in is you that it he was for on are as with his they I at be
this have from or one had by word but not what all were we when your can said there use
an each which she do how their if will up other about out many then them these so some
her would make like him into time has look two more write go see number no way could
people my than first water been call who oil its now find long down day did get come
made may part tokenizer inference model engine kernel matrix vector quantized weights
Hello World Python JavaScript Linux GPU CPU OpenAI HuggingFace llama SmolLM ChatGPT
don't can't won't it's I'm you're they've we'll she'd isn't aren't wasn't
running jumped quickly beautiful extraordinary antidisestablishmentarianism naïve café
résumé coöperate façade jalapeño über straße""".split()

PUNCT = list(".,;:!?-—–()[]{}\"'`~@#$%^&*_+=|\\/<>…«»“”‘’")

SCRIPTS = {
    "cjk": "我们今天学习中文字符的分词这是一个测试汉字日本語の文章を書きますひらがなカタカナ東京大阪",
    "hangul": "안녕하세요한국어텍스트토크나이저테스트입니다서울부산",
    "arabic": "مرحبا بالعالم هذه جملة عربية للاختبار الكتابة من اليمين",
    "hebrew": "שלום עולם זהו משפט בעברית לבדיקה",
    "devanagari": "नमस्ते दुनिया यह हिंदी में एक परीक्षण वाक्य है क्षत्रिय",
    "bengali": "আমার সোনার বাংলা আমি তোমায় ভালোবাসি",
    "tamil": "வணக்கம் உலகம் தமிழ் மொழி",
    "thai": "สวัสดีชาวโลกภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "cyrillic": "Привет мир это тестовое предложение на русском языке Ёлка Україна",
    "greek": "Γειά σου κόσμε αυτή είναι μια ελληνική πρόταση ΑΒΓΔ",
    "armenian": "Բարեւ աշխարհ",
    "georgian": "გამარჯობა მსოფლიო",
    "ethiopic": "ሰላም ለዓለም",
    "latin_ext": "ÀÁÂÃÄÅÆÇÈÉÊËÌÍÎÏÐÑÒÓÔÕÖØÙÚÛÜÝÞßàáâãäåæçèéêëìíîïðñòóôõöøùúûüýþÿĀāĂăĄąĆćŁłŒœŠšŽžƒǅǆ",
    "vietnamese": "Tiếng Việt có dấu thanh điệu phức tạp Nguyễn",
    "math": "∀x∈ℝ: x²≥0 ∑ᵢ aᵢ ≤ ∫₀^∞ f(x)dx ≠ ∞ √2 ≈ 1.414 π ½ ¾ ⅓ Ⅻ ① ٣ ४ ๓",
}

COMBINING = ["\u0301", "\u0300", "\u0308", "\u0303", "\u0327", "\u0323", "\u0336", "\u20dd", "\u0489",
             "\u093f", "\u0947", "\u094d", "\u0e31", "\u0e49", "\u05b4", "\u064e", "\u0651"]

EMOJI = ["😀", "😂", "🥲", "🤖", "🚀", "🔥", "❤️", "👍", "🎉", "🍕", "🇺🇸", "🇯🇵", "🏳️‍🌈", "👨‍👩‍👧‍👦",
         "👩🏽‍💻", "🧑🏿‍🚀", "👍🏻", "👍🏼", "👍🏽", "👍🏾", "👍🏿", "✌️", "☺️", "1️⃣", "#️⃣", "🫠", "🧬", "⌛",
         "👁️‍🗨️", "🐻‍❄️", "❤️‍🔥", "🤷‍♀️", "🙋🏾‍♂️", "😶‍🌫️", "©", "™", "↔️", "🈶", "🀄"]

SPECIAL_LIKE = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start", "im_end|>", "<| im_end |>",
                "<|im_start|", "<<|im_end|>>", "<|endoftext|><|endoftext|>", "<|IM_START|>",
                "<repo_name>", "<filename>", "<gh_stars>", "<jupyter_code>", "<empty_output>",
                "< |endoftext| >", "<|im_start|>system", "<|im_end|>\n", "\n<|im_start|>assistant\n",
                "<|endoftext", "|>", "<|", "<file_sep><file_sep>", "<issue_start>x<issue_closed>"]

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'LL", "'S", "'RE", "’s", "’ll", "''s",
                "'", "''", "'x", "'sss", "'dd", "' s", "it's", "IT'S", "y'all", "rock'n'roll", "O'Neil"]

CODE_SNIPPETS = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "class Foo(Bar):\n    \"\"\"Doc string.\"\"\"\n\n    def __init__(self, x=42):\n        self.x = x\n",
    "for i in range(10):\n\tprint(f\"{i:>4d} -> {i**2}\")\n",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)\nprint(x.shape)  # (3, 4)\n",
    "#include <stdio.h>\n\nint main(void) {\n    printf(\"hello, %s\\n\", \"world\");\n    return 0;\n}\n",
    "static inline uint32_t rotl(uint32_t x, int k) { return (x << k) | (x >> (32 - k)); }\n",
    "for (size_t i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\r\n",
    "const add = (a, b) => a + b;\nconsole.log(add(1, 2));\n",
    "function foo() {\n  return new Promise((resolve) => setTimeout(resolve, 1000));\n}\n",
    "if (x !== undefined && y === null) { throw new Error(`bad: ${x}`); }\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;\n",
    "<div class=\"container\">\n  <p>Hello &amp; welcome</p>\n</div>\n",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}\n",
    "$ ls -la /usr/local/bin | grep -v '^d' && echo \"done\" >> log.txt 2>&1\n",
    "    \n\n        x = 1\n\n\n    y = 2\n",
    "fn main() -> Result<(), Box<dyn Error>> {\n    let v: Vec<u8> = vec![0xff; 16];\n    Ok(())\n}\n",
]

WHITESPACE = [" ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r\n\r\n", "\r",
              " \n", "\n ", " \t ", "\u00a0", "\u3000", "\u2003", "\u2028", "\u0085", "\x0b", "\x0c"]


def assigned_chars(rng_lo, rng_hi):
    # Python 3.11's unicodedata is Unicode 14.0, older than utf8proc's, so
    # every char it calls assigned has the same category everywhere.
    out = []
    for cp in range(rng_lo, rng_hi):
        c = chr(cp)
        if 0xD800 <= cp <= 0xDFFF:
            continue
        if unicodedata.category(c) not in ("Cn", "Cs"):
            out.append(c)
    return out


def make_corpus(n, seed):
    rng = random.Random(seed)
    pool_bmp = assigned_chars(0x20, 0x3000) + assigned_chars(0xA000, 0xD7A4) + assigned_chars(0xF900, 0xFFFE)
    pool_astral = assigned_chars(0x10000, 0x10800) + assigned_chars(0x1D400, 0x1D800) + assigned_chars(0x1F000, 0x1FB00) \
        + assigned_chars(0x20000, 0x20200)
    script_words = {k: v.split() if " " in v else [v[i:i + rng.randint(1, 6)] for i in range(0, len(v), 3)]
                    for k, v in SCRIPTS.items()}

    def en_sentence():
        k = rng.randint(1, 18)
        words = [rng.choice(EN_WORDS) for _ in range(k)]
        if rng.random() < 0.3:
            words[0] = words[0].capitalize()
        s = " ".join(words)
        if rng.random() < 0.3:
            s = s.upper() if rng.random() < 0.3 else s
        return s + rng.choice([".", "!", "?", "", ",", "...", " :)"])

    def number():
        kind = rng.randint(0, 7)
        if kind == 0:
            return str(rng.randint(0, 10 ** rng.randint(1, 20)))
        if kind == 1:
            return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 8)}f}"
        if kind == 2:
            return f"{rng.randint(1, 12)}/{rng.randint(1, 28)}/{rng.randint(1900, 2100)}"
        if kind == 3:
            return f"+1 ({rng.randint(100, 999)}) {rng.randint(100, 999)}-{rng.randint(1000, 9999)}"
        if kind == 4:
            return f"{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(0, 255)}"
        if kind == 5:
            return f"0x{rng.getrandbits(32):08x}"
        if kind == 6:
            return f"{rng.uniform(0, 1):.3e}"
        return "".join(rng.choice("0123456789٠١٢٣४५६๑๒௧①½²³") for _ in range(rng.randint(1, 12)))

    def code():
        s = rng.choice(CODE_SNIPPETS)
        if rng.random() < 0.3:
            s = s.replace("    ", "\t")
        if rng.random() < 0.3:
            s = s.replace("\n", "\r\n")
        if rng.random() < 0.3:
            lines = s.split("\n")
            s = "\n".join((" " * rng.randint(0, 12)) + ln for ln in lines)
        return s

    def ws():
        return "".join(rng.choice(WHITESPACE) for _ in range(rng.randint(1, 8)))

    def script_text():
        k = rng.choice(list(script_words))
        words = script_words[k]
        sep = "" if k in ("cjk", "thai", "hangul") and rng.random() < 0.5 else " "
        return sep.join(rng.choice(words) for _ in range(rng.randint(1, 8)))

    def combining():
        base = rng.choice(["e", "a", "o", "n", "क", "ก", "ש", "ب", " ", "1", "!", "Z"])
        return base + "".join(rng.choice(COMBINING) for _ in range(rng.randint(1, 4)))

    def emoji():
        parts = [rng.choice(EMOJI) for _ in range(rng.randint(1, 5))]
        sep = rng.choice(["", " ", "", "\n"])
        return sep.join(parts)

    def special_like():
        a = rng.choice(SPECIAL_LIKE)
        if rng.random() < 0.5:
            return a
        return rng.choice([en_sentence, script_text, emoji, ws])() + a + rng.choice([en_sentence, number, ws, lambda: ""])()

    def contraction():
        w = rng.choice(EN_WORDS)
        return w + rng.choice(CONTRACTIONS) + rng.choice(["", " ", " " + rng.choice(EN_WORDS), "s", "\n"])

    def random_chars():
        pool = pool_astral if rng.random() < 0.3 else pool_bmp
        return "".join(rng.choice(pool) for _ in range(rng.randint(1, 12)))

    def ascii_noise():
        # No NUL: the C test reads texts as C strings.
        return "".join(chr(rng.randint(1, 127)) for _ in range(rng.randint(1, 24)))

    gens = [en_sentence, number, code, ws, script_text, combining, emoji, special_like, contraction,
            random_chars, ascii_noise]
    weights = [16, 8, 8, 6, 12, 4, 6, 8, 6, 8, 4]

    corpus = ["", " ", "  ", "\n", "\t", "\r\n", "a", "0", "00", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
              "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n", "Hello world", " Hello", "Hello ",
              "'s", "’s", "'LL", "don't", "I'm", "😀", "👨‍👩‍👧‍👦", "👍🏽", "é", "e\u0301", "日本", "123456789",
              " 1 2 3", "a1b2c3", "x  \n  y", "   leading", "trailing   ", "\u00a0\u00a0", "\r\r\n\n"]
    seen = set(corpus)
    while len(corpus) < n:
        k = rng.choices(range(len(gens)), weights)[0]
        s = gens[k]()
        if rng.random() < 0.25:  # mix categories
            s = s + rng.choice(["", " ", "\n", "\t"]) + rng.choice(gens)()
        if s not in seen:
            seen.add(s)
            corpus.append(s)
    return corpus


# ---------------------------------------------------------------------------
# References
# ---------------------------------------------------------------------------

def load_gguf_tokenizer_dict(model):
    from gguf import GGUFReader
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING
    r = GGUFReader(model)
    meta = {k: f.contents() for k, f in r.fields.items()
            if k.startswith("tokenizer.") or k == "general.architecture"}
    d = {name: meta[f"tokenizer.{key}"] for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
         if f"tokenizer.{key}" in meta}
    return meta["general.architecture"], d


def build_hf(model):
    # transformers' GGUF converter, called directly: AutoTokenizer's gguf_file
    # path reads the header with a module that imports torch, which this venv
    # does not need for tokenizers. What it builds is the same object.
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer
    from tokenizers import pre_tokenizers
    arch, d = load_gguf_tokenizer_dict(model)
    hf_gguf, _ = convert_gguf_tokenizer(arch, d)
    hf_orig, _ = convert_gguf_tokenizer(arch, d)
    if d.get("pre_tokenizer_type") == "smollm":
        hf_orig.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ])
    return hf_orig, hf_gguf


def missing_bytes(tok):
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    vocab = tok.get_vocab()
    return {b for b, c in bytes_to_unicode().items() if c not in vocab}


def load_llama_cpp(model):
    try:
        from llama_cpp import Llama
    except Exception as e:  # not built yet, or not installed
        print(f"llama.cpp cross-check skipped: {e}")
        return None
    return Llama(model_path=model, vocab_only=True, verbose=False)


def write_pretok(corpus, path):
    """HF's word splits for the three pre-tokenizers we implement, as byte
    lengths: gpt2 (ByteLevel regex), smollm (Digits + ByteLevel), llama3
    (transformers' Llama 3 Split regex). Tests the scanners on their own,
    llama3 included, for which we ship no vocabulary."""
    from tokenizers import Regex, pre_tokenizers
    from transformers.integrations.gguf.gguf_tokenizer_mapping import _LLAMA3_SPLIT
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    modes = {
        "gpt2": bl,
        "smollm": pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), bl]),
        "llama3": pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
                                           pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
    }
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
        for s in corpus:
            rec = {"text": s}
            for name, pt in modes.items():
                # ByteLevel spells each byte as one char: piece length = bytes.
                lens = [len(p) for p, _ in pt.pre_tokenize_str(s)]
                assert sum(lens) == len(s.encode("utf-8")), (name, s)
                rec[name] = lens
            f.write((json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8"))
    print(f"wrote {path} ({os.path.getsize(path)} bytes, {len(corpus)} strings)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=20240611)
    args = ap.parse_args()

    corpus = make_corpus(args.n, args.seed)
    hf_orig, hf_gguf = build_hf(args.model)
    llm = load_llama_cpp(args.model)

    t0 = time.time()
    golden = [e.ids for e in hf_orig.encode_batch(corpus, add_special_tokens=False)]
    gguf_ids = [e.ids for e in hf_gguf.encode_batch(corpus, add_special_tokens=False)]
    print(f"hf: {len(corpus)} strings in {time.time() - t0:.2f}s")

    n_gguf_diff = sum(1 for a, b in zip(golden, gguf_ids) if a != b)
    print(f"hf-orig vs hf-gguf (transformers GGUF loader): {n_gguf_diff} differ")
    ex = [(s, a, b) for s, a, b in zip(corpus, golden, gguf_ids) if a != b][:3]
    for s, a, b in ex:
        print(f"  {s[:40]!r}: orig={a[:12]} gguf={b[:12]}")

    if llm is not None:
        t0 = time.time()
        lc = [llm.tokenize(s.encode("utf-8"), add_bos=False, special=True) for s in corpus]
        print(f"llama.cpp: {len(corpus)} strings in {time.time() - t0:.2f}s")
        diffs = [(s, a, b) for s, a, b in zip(corpus, golden, lc) if a != b]
        missing = missing_bytes(hf_orig)
        n_missing = sum(1 for s, _, _ in diffs if set(s.encode("utf-8")) & missing)
        # Known: where a byte the vocabulary lacks sits between two symbols,
        # HF drops it and merges across the gap, llama.cpp keeps the gap. We
        # follow HF.
        print(f"hf-orig vs llama.cpp: {len(diffs)} differ, {n_missing} of them on bytes missing from the vocab")
        for s, a, b in diffs[:20]:
            print(f"  {s[:60]!r}\n    hf={a[:16]}\n    lc={b[:16]}")

    # A string round-trips unless it has bytes the vocabulary cannot spell
    # (SmolLM2 lacks 0x04, 0x06, 0x13, 0x14, 0x16, 0x1d, 0xc0, 0xc1, 0xf1,
    # 0xf2, 0xf5..0xff); HF then drops them, and "rt": false says so.
    rt = [hf_orig.decode(ids, skip_special_tokens=False) == s for s, ids in zip(corpus, golden)]
    print(f"hf decode: {len(rt) - sum(rt)} strings do not round-trip "
          f"(bytes missing from the vocab: {sorted(hex(b) for b in missing_bytes(hf_orig))})")

    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    # mtime=0 keeps the gzip byte-identical across runs.
    with open(args.out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
        for s, ids, ok in zip(corpus, golden, rt):
            rec = {"text": s, "ids": ids}
            if not ok:
                rec["rt"] = False
            f.write((json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8"))
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes, {len(corpus)} strings)")
    write_pretok(corpus[:N_PRETOK], PRETOK_OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
