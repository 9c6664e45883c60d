"""Medusa heads through the CLI and `luainfer serve` (issue 19).

Heads files come from tools/gen_medusa_heads.py (the gguf package), not from
`luainfer train-medusa`: zero heads (each gives the base's own next-token
logits) are a valid file whose tree drafts are sometimes accepted.

- `generate --medusa` at temperature 0 gives the tokens of `generate`
  without speculation, and reports method medusa with drafts;
- `serve --medusa --medusa-tree` serves the same greedy tokens, a request
  asking `{method: "medusa", k: 6}` drafts with it, and `stats` and
  `/metrics` count the drafts under method="medusa";
- bad settings stop with one line: heads made for another model (naming
  both vocabulary hashes), a bad tree, a path deeper than the heads,
  --medusa-tree without --medusa, Medusa on --isa ggml, with
  --tensor-parallel 2.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_util import gguf_field  # noqa: E402
from test_server import THREADS, Rpc, Server, http, stream  # noqa: E402

PROMPT = "Repeat this list exactly: apple, banana, cherry, dates, elderberry, fig, grape. Again: apple, banana,"


@pytest.fixture(scope="module")
def zero_heads(model_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("medusa") / "zero.gguf"
    subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "gen_medusa_heads.py"), "--model", str(model_path),
                    "--out", str(out), "--heads", "3", "--init", "zero"], check=True, capture_output=True)
    return out


def test_generate_medusa_same_tokens(run_ok, model_path, thread_args, zero_heads):
    args = ["generate", "--model", model_path, "--prompt", PROMPT, "--temperature", "0", "--max-tokens", "32",
            "--json", *thread_args]
    base = run_ok(args).json()
    for tree in ([], ["--medusa-tree", "0;1;2;0,0;1,0;0,0,0"]):
        got = run_ok([*args, "--medusa", str(zero_heads), *tree]).json()
        assert got["tokens"] == base["tokens"], tree
        sp = got["speculation"]
        assert sp["method"] == "medusa" and sp["drafted"] > 0, sp


def test_serve_medusa(luainfer_bin, run_ok, model_path, tmp_path, zero_heads):
    s = Server(luainfer_bin, ["--model", str(model_path), "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                              "--threads", THREADS, "--kv-memory", "32M", "--medusa", str(zero_heads),
                              "--medusa-tree", "0;1;2;3;0,0;1,0;0,0,0"], 2, tmp_path)
    try:
        want = run_ok(["generate", "--model", model_path, "--prompt", PROMPT, "--temperature", "0", "--max-tokens",
                       "20", "--json", "--threads", THREADS]).json()
        _, _, got = stream(s.rpc, {"prompt": PROMPT, "max_tokens": 20, "temperature": 0})
        assert got["tokens"] == want["tokens"]
        c = Rpc(s.rpc)
        sp = c.ok("stats")["speculation"]
        assert sp["method"] == "medusa" and sp["by_method"]["medusa"]["drafted"] > 0, sp
        before = sp["by_method"]["medusa"]["drafted"]
        code, body = http(s, "POST", "/v1/completions",
                          json.dumps({"prompt": PROMPT, "max_tokens": 12, "temperature": 0,
                                      "speculation": {"method": "medusa", "k": 6}}).encode(),
                          {"Content-Type": "application/json"})
        assert code == 200, body
        assert json.loads(body)["choices"][0]["text"] == run_ok(
            ["generate", "--model", model_path, "--prompt", PROMPT, "--temperature", "0", "--max-tokens", "12",
             "--json", "--threads", THREADS]).json()["text"]
        assert c.ok("stats")["speculation"]["by_method"]["medusa"]["drafted"] > before
        c.close()
        code, body = http(s, "GET", "/metrics")
        assert code == 200
        line = [l for l in body.decode().splitlines()
                if l.startswith('luainfer_spec_draft_tokens_total{method="medusa"}')]
        assert line and float(line[0].split()[-1]) > 0, line
    finally:
        assert s.stop() == 0, s.stderr()[-2000:]


@pytest.mark.parametrize("cmd", ["generate", "serve"])
@pytest.mark.parametrize("flags,want", [
    (["HASH"], "heads made for 'Smollm2"),
    (["--medusa-tree", "0;x"], "medusa tree '0;x'"),
    (["--medusa-tree", "0,0,0,0"], "a path of depth 4, the heads file has 3 heads"),
    (["--isa", "ggml"], "batch-invariant"),
    (["--tensor-parallel", "2"], "tensor_parallel 2 with Medusa heads is not supported yet"),
    (["NOHEADS", "--medusa-tree", "0;1"], "--medusa-tree needs --medusa FILE"),
])
def test_medusa_bad_settings(luainfer_bin, model_path, zero_heads, tmp_path, cmd, flags, want):
    if cmd == "serve" and flags[0] not in ("HASH", "--tensor-parallel"):
        pytest.skip("serve shares generate's checks (li_runtime_open_medusa); two cases run through it")
    heads = str(zero_heads)
    if flags[0] == "HASH":
        heads = str(tmp_path / "other.gguf")
        subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "gen_medusa_heads.py"), "--model", str(model_path),
                        "--out", heads, "--heads", "1", "--vocab-hash", "0123456789abcdef"], check=True,
                       capture_output=True)
        flags = []
    medusa = [] if flags and flags[0] == "NOHEADS" else ["--medusa", heads]
    flags = [f for f in flags if f != "NOHEADS"]
    args = ["serve", "--listen", "127.0.0.1:0"] if cmd == "serve" else ["generate", "--prompt", "hi",
                                                                        "--max-tokens", "2"]
    r = subprocess.run([str(luainfer_bin), *args, "--model", str(model_path), *medusa, *flags],
                       capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert r.returncode == 1, r
    assert want in r.stderr and r.stderr.count("\n") == 1, r.stderr
    if flags and flags[0] == "HASH":
        assert "0123456789abcdef" in r.stderr


def test_info_medusa_heads(luainfer_bin, zero_heads):
    """`luainfer info` describes a heads file (it refused it as a model
    before): the base and head count the gguf package reads from it."""
    gguf = pytest.importorskip("gguf")
    r = subprocess.run([str(luainfer_bin), "info", str(zero_heads), "--json", "--tensors"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    rd = gguf.GGUFReader(str(zero_heads))

    def field(k):
        return gguf_field(rd, k)

    assert got["architecture"] == "medusa" and got["n_heads"] == field("medusa.n_heads") == 3
    assert got["base"]["name"] == field("medusa.base.name")
    assert got["base"]["vocab_hash"] == field("medusa.base.vocab_hash")
    assert got["base"]["n_embd"] == field("medusa.n_embd")
    assert sorted(t["name"] for t in got["tensors"]) == sorted(t.name for t in rd.tensors)
    assert got["n_params"] == sum(int(t.n_elements) for t in rd.tensors)
