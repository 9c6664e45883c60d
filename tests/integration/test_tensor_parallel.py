"""Tensor parallelism end to end (docs/parallel.md): `luainfer generate
--tensor-parallel N` and the Lua engine table's `tensor_parallel`.

The C test (tests/unit/test_tp.c) checks the sharded pass against one rank
and the KV paging under it; these check the command line and the Lua
binding reach it, and that every bad value is one clear error line.
"""
import re

PROMPT = "The capital of France is"


def gen(model, *extra):
    return ["generate", "--model", model, "--prompt", PROMPT, "--temperature", "0", "--max-tokens", "8", "--json",
            *extra]


def test_generate_tensor_parallel_2(run_ok, model_path):
    one = run_ok(gen(model_path)).json()
    two = run_ok(gen(model_path, "--tensor-parallel", "2")).json()
    assert len(two["tokens"]) == 8
    # greedy on this prompt has no near tie in its first 8 tokens (test_tp.c
    # bounds the logit differences; a near tie may flip elsewhere)
    assert two["tokens"] == one["tokens"], (one, two)


def test_lua_engine_tensor_parallel(run_ok, tmp_path, model_path):
    script = tmp_path / "tp.lua"
    script.write_text(
        'local luainfer = require("luainfer")\n'
        f'local e = luainfer.engine{{ model = "{model_path}", tensor_parallel = 3 }}\n'
        f'local text, r = luainfer.generate(e, "{PROMPT}", {{ max_tokens = 4, temperature = 0 }})\n'
        'local s = e:stats()\n'
        'print(#r.tokens, s.tensor_parallel, s.time_allreduce > 0)\n'
        'e:close()\n')
    r = run_ok(["run", script])
    assert r.stdout.split() == ["4", "3", "true"], r.stdout


def assert_one_line_error(r, pattern):
    assert r.returncode > 0, f"exit {r.returncode}: {r.describe()}"
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and re.search(pattern, err), err
    assert not r.stdout.strip()


def test_tensor_parallel_errors(run_cli, model_path):
    assert_one_line_error(run_cli(gen(model_path, "--tensor-parallel", "0")), r"--tensor-parallel must be in \[1, 64\]")
    assert_one_line_error(run_cli(gen(model_path, "--tensor-parallel", "4")), r"tensor_parallel must be in \[1, 3\].*KV heads")
    assert_one_line_error(run_cli(gen(model_path, "--tensor-parallel", "2", "--isa", "ggml")), r"tensor parallel.*ggml")
    assert_one_line_error(run_cli(gen(model_path, "--tensor-parallel", "2", "--spec-layers", "4", "--spec-k", "2")),
                          r"layerskip.*not supported")
    assert_one_line_error(run_cli(gen(model_path, "--tensor-parallel", "x")), r"--tensor-parallel expects an integer")


def test_serve_tensor_parallel_refused(run_cli, model_path):
    # serve takes the option too; an impossible split ends it with the engine's line
    r = run_cli(["serve", "--model", model_path, "--tensor-parallel", "4", "--listen", "127.0.0.1:0", "--no-http"],
                timeout=60)
    assert r.returncode > 0 and re.search(r"tensor_parallel must be in \[1, 3\]", r.stderr), r.stderr
