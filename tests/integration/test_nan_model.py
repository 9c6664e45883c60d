"""A model whose numbers go bad (NaN or Inf in its weights) ends each request
with finish_reason "error" and a log line that says why, never with an
empty answer and "stop"; `perplexity` refuses to print nan; the server
stays up. (engine.c li_engine_fail_logits, sampler.c li_sampler_logits_usable,
spec_step.c's sampled rounds, perplexity.c.)

Before: a row of NaN logits drew id 0, SmolLM2's <|endoftext|>, so every
request "stopped" at once with no text, and perplexity printed nan with
exit status 0 (and --json wrote a bare nan, which no JSON parser reads).

The models are tools/gen_tiny_llama.py's cut of the shipped model (its real
vocabulary, 2 blocks), rewritten by the gguf package with one tensor
changed."""
import json
import subprocess
import sys

import gguf
import numpy as np
import pytest

from test_server import Server, http

PROMPT = "one two three four five six seven eight nine ten. one two three four five six seven eight nine ten. one two"
FAIL_LOG = "hold no finite value"


def rewrite(src, dst, change):
    """src with change(name, data, type) -> [(name, data, type), ...] applied to every tensor."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vt = f.types[0]
        w.add_key_value(key, f.contents(), vt, sub_type=f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        for name, data, tt in change(t.name, np.array(t.data), t.tensor_type):
            w.add_tensor(name, data, raw_dtype=tt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def poisoned(tiny, name, bad):
    """tiny with NaN input embeddings at the ids in bad, its output head
    kept apart (output.weight) and sound, so the model still writes them."""
    def change(n, data, tt):
        if n != "token_embd.weight":
            return [(n, data, tt)]
        p = data.copy()
        p[list(bad)] = np.nan
        return [(n, p, tt), ("output.weight", data, tt)]
    return rewrite(tiny, tiny.with_name(name), change)


def proposing(tiny, name, y, z):
    """A draft whose head is row y = +1000 e_0, row z = -1000 e_0 and every
    other row 0: its argmax is y or z by the sign of one hidden channel."""
    def change(n, data, tt):
        if n != "token_embd.weight":
            return [(n, data, tt)]
        head = np.zeros_like(data)
        head[y, 0], head[z, 0] = 1000, -1000
        return [(n, data, tt), ("output.weight", head, tt)]
    return rewrite(tiny, tiny.with_name(name), change)


@pytest.fixture(scope="module")
def tiny(model_path, repo_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("nan") / "tiny.gguf"
    subprocess.run([sys.executable, str(repo_root / "tools/gen_tiny_llama.py"), str(model_path), str(out)],
                   check=True, timeout=600)
    return out


@pytest.fixture(scope="module")
def nan_model(tiny):
    """Every output-norm weight NaN: every row of logits is NaN."""
    def change(name, data, tt):
        return [(name, np.full_like(data, np.nan) if name == "output_norm.weight" else data, tt)]
    return rewrite(tiny, tiny.with_name("nan.gguf"), change)


def gen(model, thread_args, *extra):
    return ["generate", "--model", str(model), "--prompt", PROMPT, "--max-tokens", "16", "--json", *thread_args,
            *extra]


@pytest.mark.parametrize("extra", [("--temperature", "0"), ("--temperature", "0.7", "--seed", "3"),
                                   ("--temperature", "0", "--spec-k", "4"),
                                   ("--temperature", "0.7", "--seed", "3", "--spec-k", "4")],
                         ids=["greedy", "sampled", "greedy-ngram", "sampled-ngram"])
def test_generate_ends_with_error(run_cli, nan_model, thread_args, extra):
    r = run_cli(gen(nan_model, thread_args, *extra))
    assert r.returncode == 1, r.describe()
    assert json.loads(r.stdout)["finish_reason"] == "error"
    assert FAIL_LOG in r.stderr and 'finish_reason "error"' in r.stderr
    assert "generate: the request ended with an error" in r.stderr.strip().splitlines()[-1]


def test_perplexity_refuses_nan(run_cli, nan_model, repo_root, thread_args):
    for extra in ([], ["--json"]):
        r = run_cli(["perplexity", "--model", str(nan_model), "--file", str(repo_root / "tests/data/alice29.txt"),
                     "--chunks", "1", "--ctx", "64", *thread_args, *extra])
        assert r.returncode == 1, r.describe()
        assert "chunk 1, position 32: the model's logits hold NaN or Inf" in r.stderr
        assert "nan" not in r.stdout


def test_healthy_model_unchanged(run_ok, tiny, thread_args):
    """The same prompts on the model before the change: no error, text, and
    n-gram speculation gives the same greedy tokens."""
    plain = run_ok(gen(tiny, thread_args, "--temperature", "0")).json()
    spec = run_ok(gen(tiny, thread_args, "--temperature", "0", "--spec-k", "4")).json()
    assert plain["finish_reason"] == "length" and plain["tokens"] == spec["tokens"]
    assert spec["speculation"]["drafted"] > 0


def test_bad_token_embedding_same_tokens_with_speculation(run_cli, run_ok, tiny, thread_args):
    """A token whose input embedding is NaN (the output head kept apart and
    sound, so the model still writes it): the request runs until the token
    after it, then ends with "error". Greedy n-gram speculation gives the
    same tokens and the same end: a row is read only where sampling alone
    would read it."""
    plain = run_ok(gen(tiny, thread_args, "--temperature", "0")).json()
    bad = next((t for t in plain["tokens"] if t not in plain["prompt_tokens"]), None)
    assert bad is not None, f"every generated id is in the prompt: {plain}"
    at = plain["tokens"].index(bad)
    model = poisoned(tiny, "poisoned.gguf", [bad])
    for extra in ([], ["--spec-k", "4"]):
        r = run_cli(gen(model, thread_args, "--temperature", "0", *extra))
        assert r.returncode == 1, r.describe()
        out = json.loads(r.stdout)
        assert out["finish_reason"] == "error" and out["tokens"] == plain["tokens"][:at + 1], (extra, out)
        assert f"logits for position {len(plain['prompt_tokens']) + at + 1} hold no finite value" in r.stderr


def test_server_answers_error_and_stays_up(luainfer_bin, nan_model, thread_args, tmp_path):
    s = Server(luainfer_bin, ["--model", str(nan_model), "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                              *thread_args], 2, tmp_path)
    try:
        for _ in range(2):
            body = json.dumps({"model": "x", "prompt": PROMPT, "max_tokens": 8, "temperature": 0}).encode()
            code, out = http(s, "POST", "/v1/completions", body, {"Content-Type": "application/json"})
            choice = json.loads(out)["choices"][0]
            assert code == 200 and choice["finish_reason"] == "error" and choice["text"] == "", out
        code, metrics = http(s, "GET", "/metrics")
        assert code == 200 and 'luainfer_requests_total{finish_reason="error"} 2' in metrics.decode()
        assert s.proc.poll() is None
    finally:
        rc = s.stop()
    assert rc == 0 and s.stderr().count(FAIL_LOG) == 2, s.stderr()[-2000:]


def test_draft_of_bad_tokens_is_never_read(run_cli, run_ok, tiny, thread_args):
    """Two ids Y, Z the model never writes here get NaN input embeddings (the
    output head kept apart and sound), and a draft model proposes only them
    (its head: row Y = +1000 e_0, row Z = -1000 e_0, every other row 0, so
    its argmax is Y or Z by the sign of one hidden channel). Every round's
    row after the first draft is NaN. Greedy: the target rejects the draft
    on row 0 and never reads the NaN row, so the tokens are those of the
    run without speculation. Temperature 0.7: a sampled round with a row
    that cannot be drawn from keeps none of its drafts and draws from row 0
    alone (spec_step.c sample_root_only): no error, nothing accepted."""
    plain = run_ok(gen(tiny, thread_args, "--temperature", "0")).json()
    used = set(plain["prompt_tokens"]) | set(plain["tokens"])
    y, z = [t for t in range(5000, 5100) if t not in used][:2]
    tm, dm = poisoned(tiny, "target_yz.gguf", [y, z]), proposing(tiny, "draft_yz.gguf", y, z)
    spec = run_ok(gen(tm, thread_args, "--temperature", "0", "--draft-model", str(dm), "--spec-k", "2")).json()
    assert spec["tokens"] == plain["tokens"] and spec["finish_reason"] == "length"
    assert spec["speculation"]["drafted"] > 0 and spec["speculation"]["accepted"] == 0
    r = run_cli(gen(tm, thread_args, "--temperature", "0.7", "--seed", "5", "--draft-model", str(dm),
                    "--spec-k", "2"))
    assert r.returncode == 0 and FAIL_LOG not in r.stderr, r.describe()
    out = json.loads(r.stdout)
    assert out["finish_reason"] == "length" and len(out["tokens"]) == 16
    assert out["speculation"]["drafted"] > 0 and out["speculation"]["accepted"] == 0
    assert not {y, z} & set(out["tokens"])


def test_sampled_draft_never_reads_past_a_bad_token(run_cli, run_ok, tiny, thread_args):
    """The model's own first token B gets a NaN input embedding (the head
    kept sound), and the draft proposes B or an unused Z. Sampling alone
    would end a request with "error" on the row after B, so with
    speculation no token may follow B either. (Before sample_root_only, a
    sampled round whose draft B was accepted drew the bonus token from the
    NaN row, and one that started on it drew from NaN: id 0, and "stop".)"""
    plain = run_ok(gen(tiny, thread_args, "--temperature", "0")).json()
    b = plain["tokens"][0]
    used = set(plain["prompt_tokens"]) | set(plain["tokens"])
    z = next(t for t in range(5000, 5100) if t not in used)
    tm, dm = poisoned(tiny, "target_b.gguf", [b]), proposing(tiny, "draft_b.gguf", b, z)
    ended_on_b = 0
    for seed in range(1, 7):
        r = run_cli(gen(tm, thread_args, "--temperature", "0.7", "--seed", str(seed), "--draft-model", str(dm),
                        "--spec-k", "2"))
        out = json.loads(r.stdout)
        if b in out["tokens"]:
            ended_on_b += 1
            assert out["tokens"].index(b) == len(out["tokens"]) - 1, (seed, out)
            assert out["finish_reason"] == "error" and r.returncode == 1 and FAIL_LOG in r.stderr, (seed, out)
        else:
            assert out["finish_reason"] == "length" and r.returncode == 0, (seed, out)
    assert ended_on_b >= 2  # seeds that reached B: the case this test is for
    greedy = run_cli(gen(tm, thread_args, "--temperature", "0", "--draft-model", str(dm), "--spec-k", "2"))
    assert json.loads(greedy.stdout)["tokens"] == [b] and greedy.returncode == 1
