"""Speculation through `luainfer serve` (issue 19): the serve flags, a
request's own `speculation = {method, k}` over msgpack-RPC and HTTP, and
the drafts counted per proposer in `stats` and `/metrics`.

- `serve --spec-layers 29 --spec-k 4` (layerskip by default) serves the
  greedy tokens of `generate` without speculation, over RPC and HTTP;
- a request asking `{method: "ngram", k: 5}` drafts with n-gram, one
  asking `false` drafts nothing; an unavailable method or a k out of range
  is a clear invalid-params error (RPC) / 400 (HTTP);
- `stats.speculation` and the `luainfer_spec_*{method=...}` metrics count
  the drafts of each proposer;
- bad flags (k out of range, an unknown method, spec-layers past the model,
  speculation with --isa ggml) stop serve with a one-line error.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_server import THREADS, Rpc, Server, http, stream  # noqa: E402

PROMPTS = ["Repeat this list exactly: apple, banana, cherry, dates, elderberry, fig, grape. Again: apple, banana,",
           "one two three four five six seven eight nine ten one two three four five six seven"]


def test_serve_spec_flags_and_stats(luainfer_bin, run_ok, model_path, tmp_path):
    s = Server(luainfer_bin, ["--model", str(model_path), "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                              "--threads", THREADS, "--kv-memory", "32M", "--spec-layers", "29", "--spec-k", "4"],
               2, tmp_path)
    try:
        for p in PROMPTS:
            want = run_ok(["generate", "--model", model_path, "--prompt", p, "--temperature", "0", "--max-tokens",
                           "20", "--json", "--threads", THREADS]).json()
            _, _, got = stream(s.rpc, {"prompt": p, "max_tokens": 20, "temperature": 0})
            assert got["tokens"] == want["tokens"] and got["text"] == want["text"], p
            code, body = http(s, "POST", "/v1/completions",
                              json.dumps({"prompt": p, "max_tokens": 20, "temperature": 0}).encode(),
                              {"Content-Type": "application/json"})
            assert code == 200, body
            assert json.loads(body)["choices"][0]["text"] == want["text"], p
        c = Rpc(s.rpc)
        sp = c.ok("stats")["speculation"]
        assert sp["method"] == "layerskip" and sp["k"] == 4, sp
        ls = sp["by_method"]["layerskip"]
        assert ls["drafted"] > 0 and 0 < ls["accepted"] <= ls["drafted"] and ls["rounds"] > 0, sp
        assert sp["by_method"]["ngram"]["drafted"] == 0, sp

        # a request's own speculation over RPC and HTTP
        err, res = c.call("generate", {"prompt": PROMPTS[0], "max_tokens": 20, "temperature": 0,
                                       "speculation": {"method": "ngram", "k": 5}})
        assert err is None, err
        code, body = http(s, "POST", "/v1/completions",
                          json.dumps({"prompt": PROMPTS[1], "max_tokens": 20, "temperature": 0,
                                      "speculation": {"method": "ngram", "k": 5}}).encode(),
                          {"Content-Type": "application/json"})
        assert code == 200, body
        sp2 = c.ok("stats")["speculation"]
        assert sp2["by_method"]["ngram"]["drafted"] > 0, sp2
        before = sp2["drafted"]
        err, res = c.call("generate", {"prompt": PROMPTS[0], "max_tokens": 20, "temperature": 0, "speculation": False})
        assert err is None, err
        assert c.ok("stats")["speculation"]["drafted"] == before

        for bad, want in [({"method": "draft", "k": 2}, "'draft' is not available"),
                          ({"method": "ngram", "k": 17}, "'speculation.k' must be an integer in [0, 16]"),
                          ({"method": "tree", "k": 2}, "unknown speculation method 'tree'")]:
            err, _ = c.call("generate", {"prompt": "hi", "max_tokens": 4, "speculation": bad})
            assert err is not None and want in json.dumps(err), (bad, err)
            code, body = http(s, "POST", "/v1/completions",
                              json.dumps({"prompt": "hi", "max_tokens": 4, "speculation": bad}).encode(),
                              {"Content-Type": "application/json"})
            assert code == 400 and want in body.decode(), (bad, code, body)
        c.close()

        code, body = http(s, "GET", "/metrics")
        assert code == 200
        text = body.decode()
        for line in ('luainfer_spec_draft_tokens_total{method="layerskip"}',
                     'luainfer_spec_accepted_tokens_total{method="ngram"}',
                     'luainfer_spec_acceptance_ratio{method="draft"} 0'):
            assert line in text, line
        drafted = [l for l in text.splitlines() if l.startswith('luainfer_spec_draft_tokens_total{method="layerskip"}')]
        assert float(drafted[0].split()[-1]) > 0, drafted
    finally:
        assert s.stop() == 0, s.stderr()[-2000:]


@pytest.mark.parametrize("flags,want", [
    (["--spec-k", "17"], "--spec-tokens must be in [0, 16]"),
    (["--spec-k", "2", "--spec-method", "lookahead"], "unknown speculation method 'lookahead'"),
    (["--spec-k", "2", "--spec-layers", "30"], "--spec-layers must be in [1, 29]"),
    (["--spec-k", "2", "--spec-method", "draft"], "needs a draft model"),
    (["--spec-k", "2", "--spec-method", "layerskip"], "needs --spec-layers N"),
    (["--spec-k", "2", "--isa", "ggml"], "batch-invariant"),
])
def test_serve_bad_spec_flags(luainfer_bin, model_path, flags, want):
    r = subprocess.run([str(luainfer_bin), "serve", "--model", str(model_path), "--listen", "127.0.0.1:0", *flags],
                       capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert r.returncode == 1, r
    assert want in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert "listening on" not in r.stdout


@pytest.mark.parametrize("flags,want", [
    (["--spec-k", "17"], "--spec-k must be in [0, 16]"),
    (["--spec-k", "2", "--spec-method", "bogus"], "unknown speculation method 'bogus'"),
    (["--spec-k", "2", "--spec-layers", "30"], "--spec-layers must be in [1, 29]"),
    (["--spec-k", "2", "--isa", "ggml"], "batch-invariant"),
])
def test_generate_bad_spec_flags(run_cli, model_path, flags, want):
    r = run_cli(["generate", "--model", model_path, "--prompt", "hi", "--max-tokens", "2", *flags])
    assert r.returncode == 1, r.stderr
    assert want in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_generate_spec_same_tokens(run_ok, model_path, thread_args):
    p = PROMPTS[0]
    base = run_ok(["generate", "--model", model_path, "--prompt", p, "--temperature", "0", "--max-tokens", "24",
                   "--json", *thread_args]).json()
    for flags, method in [(["--spec-k", "4"], "ngram"), (["--spec-layers", "29", "--spec-k", "3"], "layerskip")]:
        got = run_ok(["generate", "--model", model_path, "--prompt", p, "--temperature", "0", "--max-tokens", "24",
                      "--json", *thread_args, *flags]).json()
        assert got["tokens"] == base["tokens"], flags
        assert got["speculation"]["method"] == method and got["speculation"]["drafted"] > 0, got["speculation"]
