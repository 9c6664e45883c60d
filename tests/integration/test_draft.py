"""--draft PATH: a draft model next to the target (core/engine/runner.h).

The draft is the real model's first 4 layers (tools/make_draft.py), made
once per session in a pytest tmp dir. It runs every step's batch over the
target's KV blocks but proposes nothing yet, so it must not change what the
target generates:

- `generate --draft` prints exactly the greedy tokens and text (and logits)
  of `generate` without it;
- `serve --draft` announces the draft, serves the same greedy text and
  reports its KV bytes in stats;
- a missing file, a vocabulary-only GGUF and a draft with a different
  vocabulary (the cut with its vocabulary truncated to 32768 tokens) are
  one-line errors naming the draft, exit code 1, for generate and serve.
"""

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_server import THREADS, Rpc, Server, stream  # noqa: E402

gguf = pytest.importorskip("gguf", reason="the gguf Python package is needed to make a draft")

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
SMALL_VOCAB = 32768


@pytest.fixture(scope="module")
def draft_path(model_path, tmp_path_factory):
    dst = tmp_path_factory.mktemp("draft") / "draft4.gguf"
    r = subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "make_draft.py"), str(model_path), str(dst),
                        "--layers", "4"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return dst


@pytest.fixture(scope="module")
def small_vocab_draft(draft_path):
    """The draft with only its first SMALL_VOCAB tokens: embeddings rows, the
    tokenizer's arrays and the merges that stay inside them."""
    r = gguf.GGUFReader(str(draft_path))
    dst = draft_path.with_name("draft4_small_vocab.gguf")
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = f.types[0]
        if vtype != gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, f.contents(), vtype)
            continue
        v = f.contents()
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            v = v[:SMALL_VOCAB]
        elif key == "tokenizer.ggml.merges":
            kept = set(r.fields["tokenizer.ggml.tokens"].contents()[:SMALL_VOCAB])
            v = [m for m in v if all(p in kept for p in m.split(" ", 1)) and m.replace(" ", "", 1) in kept]
        w.add_key_value(key, v, vtype, sub_type=f.types[-1])
    for t in r.tensors:
        data = t.data[:SMALL_VOCAB] if t.name in ("token_embd.weight", "output.weight") else t.data
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def gen(model_path, thread_args, prompt, *extra):
    return ["generate", "--model", model_path, "--prompt", prompt, "--temperature", "0", "--max-tokens", "24",
            "--json", *thread_args, *extra]


def test_generate_with_draft_is_the_same(run_ok, model_path, thread_args, draft_path):
    for p in PROMPTS:
        want = run_ok(gen(model_path, thread_args, p, "--top-logits", "3")).json()
        got = run_ok(gen(model_path, thread_args, p, "--top-logits", "3", "--draft", draft_path)).json()
        assert got["tokens"] == want["tokens"] and got["text"] == want["text"], p
        assert got["top_logits"] == want["top_logits"], p  # logits, bit for bit as JSON prints them
        assert len(want["tokens"]) > 0


def test_generate_chat_with_draft_is_the_same(run_ok, model_path, thread_args, draft_path):
    args = gen(model_path, thread_args, "Name three colors.", "--chat")
    assert run_ok([*args, "--draft", draft_path]).json()["tokens"] == run_ok(args).json()["tokens"]


def bad_drafts(draft_path, small_vocab_draft):
    return [
        (draft_path.with_name("no-such-draft.gguf"), r"draft model .*no-such-draft\.gguf.*No such file"),
        (REPO_ROOT / "tests" / "golden" / "spm_tiny.gguf", r"draft model .*spm_tiny\.gguf: model: missing tensor"),
        (small_vocab_draft, rf"draft model .*: its vocabulary has {SMALL_VOCAB} tokens, the target's 49152"),
    ]


def assert_refused(r, pattern):
    import re

    assert r.returncode == 1, f"exit {r.returncode}, want 1: {r.stderr[-1000:]}"
    lines = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert len(lines) == 1 and re.search(pattern, lines[0]), (pattern, r.stderr[-1000:])
    assert "Segmentation" not in r.stderr and "AddressSanitizer" not in r.stderr


def test_generate_bad_draft_is_a_clear_error(run_cli, model_path, thread_args, draft_path, small_vocab_draft):
    for path, pattern in bad_drafts(draft_path, small_vocab_draft):
        r = run_cli(gen(model_path, thread_args, "hi", "--draft", path), timeout=120)
        assert_refused(r, pattern)
        assert r.stdout == "", r.stdout[:300]
    r = run_cli(gen(model_path, thread_args, "hi", "--draft"), timeout=60)
    assert_refused(r, r"option --draft needs a value")


def test_serve_bad_draft_is_a_clear_error(luainfer_bin, model_path, draft_path, small_vocab_draft):
    for path, pattern in bad_drafts(draft_path, small_vocab_draft):
        r = subprocess.run([str(luainfer_bin), "serve", "--model", str(model_path), "--listen", "127.0.0.1:0",
                            "--draft", str(path)], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
        assert_refused(r, pattern)
        assert "listening on" not in r.stdout


def test_serve_with_draft_is_the_same(luainfer_bin, run_ok, model_path, draft_path, tmp_path):
    s = Server(luainfer_bin, ["--model", str(model_path), "--listen", "127.0.0.1:0", "--threads", THREADS,
                              "--kv-memory", "32M", "--draft", str(draft_path)], 1, tmp_path)
    try:
        for p in PROMPTS:
            want = run_ok(["generate", "--model", model_path, "--prompt", p, "--temperature", "0", "--max-tokens",
                           "16", "--json", "--threads", THREADS]).json()
            text, toks, got = stream(s.rpc, {"prompt": p, "max_tokens": 16, "temperature": 0})
            assert got["tokens"] == want["tokens"] and got["text"] == want["text"] == text, p
        c = Rpc(s.rpc)
        kv = c.ok("stats")["kv"]
        c.close()
        assert 0 < kv["draft_bytes"] < kv["bytes"], kv
        assert "luainfer: draft model" in s.stderr()
    finally:
        assert s.stop() == 0, s.stderr()[-2000:]
