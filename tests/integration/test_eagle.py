"""EAGLE drafts through the CLI and `luainfer serve` (issue 19).

Draft files come from tools/gen_eagle_draft.py (the gguf package), not from
`luainfer train-eagle`: a seeded random block over a draft vocabulary, a
valid file whose drafts are rarely accepted (the unit tests check the block
against float64 and its KV against the draft run alone).

- `generate --eagle` at temperature 0 gives the tokens of `generate`
  without speculation and reports method eagle with drafts (the default
  method once a draft is given);
- `serve --eagle` serves the same greedy tokens; `stats` and `/metrics`
  count the drafts under method="eagle";
- bad settings stop with one line: a draft made for another model (naming
  both vocabulary hashes), a Medusa heads file given as a draft, EAGLE on
  --isa ggml, with --tensor-parallel 2, with --medusa, --spec-method eagle
  without a draft.
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

PROMPT = "Write a short poem about the sea and the wind."
RAW = "The history of the printing press begins"


def gen(model_path, out, *extra):
    subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "gen_eagle_draft.py"), "--model", str(model_path),
                    "--out", str(out), *extra], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def draft(model_path, tmp_path_factory):
    return gen(model_path, tmp_path_factory.mktemp("eagle") / "draft.gguf", "--vocab", "4096")


def test_generate_eagle_same_tokens(run_ok, model_path, thread_args, draft):
    args = ["generate", "--model", model_path, "--chat", "--prompt", PROMPT, "--temperature", "0", "--max-tokens",
            "24", "--json", *thread_args]
    base = run_ok(args).json()
    for extra in ([], ["--spec-k", "5"]):
        got = run_ok([*args, "--eagle", str(draft), *extra]).json()
        assert got["tokens"] == base["tokens"], extra
        sp = got["speculation"]
        assert sp["method"] == "eagle" and sp["drafted"] > 0, sp


def test_serve_eagle(luainfer_bin, run_ok, model_path, tmp_path, draft):
    s = Server(luainfer_bin, ["--model", str(model_path), "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                              "--threads", THREADS, "--kv-memory", "32M", "--eagle", str(draft)], 2, tmp_path)
    try:
        want = run_ok(["generate", "--model", model_path, "--prompt", RAW, "--temperature", "0", "--max-tokens",
                       "16", "--json", "--threads", THREADS]).json()
        _, _, got = stream(s.rpc, {"prompt": RAW, "max_tokens": 16, "temperature": 0})
        assert got["tokens"] == want["tokens"] and len(got["tokens"]) == 16
        c = Rpc(s.rpc)
        sp = c.ok("stats")["speculation"]
        assert sp["method"] == "eagle" and sp["by_method"]["eagle"]["drafted"] > 0, sp
        c.close()
        code, body = http(s, "GET", "/metrics")
        assert code == 200
        line = [l for l in body.decode().splitlines()
                if l.startswith('luainfer_spec_draft_tokens_total{method="eagle"}')]
        assert line and float(line[0].split()[-1]) > 0, line
    finally:
        assert s.stop() == 0, s.stderr()[-2000:]


@pytest.mark.parametrize("cmd,flags,want", [
    ("generate", ["HASH"], "draft made for 'Smollm2"),
    ("serve", ["HASH"], "draft made for 'Smollm2"),
    ("generate", ["MEDUSAFILE"], "expected 'eagle' (not an EAGLE draft)"),
    ("generate", ["--isa", "ggml"], "batch-invariant"),
    ("serve", ["--tensor-parallel", "2"], "tensor_parallel 2 with an EAGLE draft is not supported yet"),
    ("generate", ["WITHMEDUSA"], "an EAGLE draft with Medusa heads is not supported yet"),
    ("generate", ["NODRAFT", "--spec-method", "eagle", "--spec-k", "3"], "method 'eagle' needs an EAGLE draft"),
    ("serve", ["NODRAFT", "--eagle-lazy"], "eagle_lazy needs an EAGLE draft"),
])
def test_eagle_bad_settings(luainfer_bin, model_path, draft, tmp_path, cmd, flags, want):
    path = str(draft)
    extra = []
    if flags[0] == "HASH":
        path = str(gen(model_path, tmp_path / "other.gguf", "--vocab-hash", "0123456789abcdef"))
    if flags[0] in ("MEDUSAFILE", "WITHMEDUSA"):
        heads = tmp_path / "heads.gguf"
        subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "gen_medusa_heads.py"), "--model", str(model_path),
                        "--out", str(heads), "--heads", "1"], check=True, capture_output=True)
        if flags[0] == "MEDUSAFILE":
            path = str(heads)
        else:
            extra = ["--medusa", str(heads)]
    eagle = [] if flags[0] == "NODRAFT" else ["--eagle", path]
    flags = [f for f in flags if f not in ("HASH", "MEDUSAFILE", "WITHMEDUSA", "NODRAFT")]
    args = ["serve", "--listen", "127.0.0.1:0"] if cmd == "serve" else ["generate", "--prompt", "hi",
                                                                        "--max-tokens", "2"]
    r = subprocess.run([str(luainfer_bin), *args, "--model", str(model_path), *extra, *eagle, *flags],
                       capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert r.returncode == 1, r
    assert want in r.stderr and r.stderr.count("\n") == 1, r.stderr
    if "HASH" in want or want.startswith("draft made"):
        assert "0123456789abcdef" in r.stderr


def test_info_eagle_draft(luainfer_bin, model_path, tmp_path):
    """`luainfer info` describes a draft instead of refusing it as a model:
    what the gguf package reads from the same file (base, shape, features,
    draft vocabulary, parameters without the vocabulary's ids), and --kv is
    refused in one line. A draft for another vocabulary is described too
    (info checks the file alone; generate and serve check it against the
    model)."""
    gguf = pytest.importorskip("gguf")
    path = gen(model_path, tmp_path / "d.gguf", "--vocab", "1000", "--features", "1,7", "--n-ff", "96",
               "--vocab-hash", "0123456789abcdef")
    r = subprocess.run([str(luainfer_bin), "info", str(path), "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    rd = gguf.GGUFReader(str(path))

    def field(k):
        return gguf_field(rd, k)

    assert got["architecture"] == "eagle"
    assert got["base"] == {"name": field("eagle.base.name"), "vocab_hash": "0123456789abcdef",
                           "n_embd": field("eagle.n_embd"), "n_vocab": field("eagle.n_vocab"),
                           "n_layer": field("eagle.base.n_layer")}
    assert got["draft"]["feature_layers"] == [1, 7] and got["draft"]["n_ff"] == 96
    assert got["draft"]["n_draft_vocab"] == 1000
    assert got["n_params"] == sum(int(t.n_elements) for t in rd.tensors if t.name != "eagle.vocab")
    assert got["file_bytes"] == path.stat().st_size
    text = subprocess.run([str(luainfer_bin), "info", str(path)], capture_output=True, text=True, timeout=60)
    assert text.returncode == 0 and "use with --eagle" in text.stdout and "draft vocab:  1000 of" in text.stdout
    r = subprocess.run([str(luainfer_bin), "info", str(path), "--kv"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "is an EAGLE draft" in r.stderr and r.stderr.count("\n") == 1, r.stderr
