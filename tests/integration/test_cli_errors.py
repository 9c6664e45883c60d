"""Bad command lines must fail cleanly.

Each case: a non-zero exit (never death by a signal: a negative returncode
from subprocess), and a message on stderr that names the problem. Nothing is
printed on stdout that could be mistaken for a result.
"""

import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PPL_TEXT = REPO_ROOT / "tests" / "data" / "alice_ch1.txt"
MODEL_CONTEXT = 8192  # llama.context_length of SmolLM2-135M


def assert_clean_failure(r, *patterns):
    """r failed with an exit code > 0 and stderr matches one of patterns."""
    assert r.returncode >= 0, (f"killed by signal {-r.returncode}: {r.describe()}\n"
                               f"stderr:\n{r.stderr[-2000:]}")
    assert r.returncode != 0, (f"exit 0 for a bad command line: {r.describe()}\n"
                               f"stdout[:300]={r.stdout[:300]!r}")
    err = r.stderr.strip()
    assert err, f"no message on stderr: {r.describe()}"
    assert any(re.search(p, err, re.IGNORECASE) for p in patterns), (
        f"stderr does not name the problem (wanted one of {patterns}): {r.describe()}\n"
        f"stderr:\n{err[:2000]}")
    assert "Traceback" not in err and "Segmentation" not in err


def gen(model, *extra):
    return ["generate", "--model", model, "--temperature", "0", "--max-tokens", "4", *extra]


def test_unknown_flag(run_cli, model_path):
    r = run_cli(gen(model_path, "--prompt", "hi", "--no-such-flag"))
    assert_clean_failure(r, r"no-such-flag")


def test_unknown_flag_perplexity(run_cli, model_path):
    r = run_cli(["perplexity", "--model", model_path, "--file", PPL_TEXT, "--bogus", "1"])
    assert_clean_failure(r, r"bogus")


def test_unknown_subcommand(run_cli, model_path):
    r = run_cli(["frobnicate", "--model", model_path])
    assert_clean_failure(r, r"frobnicate", r"command", r"usage")


def test_no_arguments(run_cli):
    r = run_cli([])
    assert r.returncode > 0, f"exit {r.returncode} with no arguments"
    assert r.stderr.strip(), "no usage message on stderr"


def test_missing_model_file(run_cli, tmp_path):
    missing = tmp_path / "does-not-exist.gguf"
    r = run_cli(gen(missing, "--prompt", "hi"))
    assert_clean_failure(r, re.escape(missing.name), r"model")


def test_model_not_a_gguf(run_cli, tmp_path):
    bad = tmp_path / "garbage.gguf"
    bad.write_bytes(b"this is not a gguf file\n" * 100)
    r = run_cli(gen(bad, "--prompt", "hi"))
    assert_clean_failure(r, r"gguf", r"magic", r"garbage", r"model", r"invalid")


def test_missing_prompt(run_cli, model_path):
    r = run_cli(gen(model_path))
    assert_clean_failure(r, r"prompt")


def test_empty_prompt(run_cli, model_path):
    r = run_cli(gen(model_path, "--prompt", ""))
    assert_clean_failure(r, r"prompt", r"empty")


def test_flag_without_value(run_cli, model_path):
    r = run_cli(gen(model_path, "--prompt"))
    assert_clean_failure(r, r"prompt", r"value", r"argument")


def test_prompt_longer_than_context(run_cli, model_path):
    # " the" is one token; 10000 of them exceed the model's 8192 context.
    prompt = " the" * (MODEL_CONTEXT + 1808)
    r = run_cli(gen(model_path, "--prompt", prompt), timeout=600)
    assert_clean_failure(r, r"context", r"too long", r"exceed", r"n_ctx", r"ctx")


@pytest.mark.parametrize("value", ["-1", "abc", "1.5"])
def test_bad_max_tokens(run_cli, model_path, value):
    r = run_cli(["generate", "--model", model_path, "--prompt", "hi", "--max-tokens", value])
    assert_clean_failure(r, r"max[-_ ]tokens")


@pytest.mark.parametrize("value", ["-1", "nan", "x"])
def test_bad_temperature(run_cli, model_path, value):
    r = run_cli(["generate", "--model", model_path, "--prompt", "hi", "--max-tokens", "4",
                 "--temperature", value])
    assert_clean_failure(r, r"temperature")


@pytest.mark.parametrize("flag,value", [("--top-p", "-0.1"), ("--top-p", "abc"),
                                        ("--seed", "abc"), ("--threads", "-2"),
                                        ("--top-logits", "-1")])
def test_bad_sampling_values(run_cli, model_path, flag, value):
    r = run_cli(["generate", "--model", model_path, "--prompt", "hi", "--max-tokens", "4",
                 flag, value])
    # the message may spell the flag top-p or top_p
    assert_clean_failure(r, re.escape(flag.lstrip("-")).replace("\\-", "[-_ ]"))


def test_perplexity_missing_file(run_cli, model_path, tmp_path):
    missing = tmp_path / "no-such-text.txt"
    r = run_cli(["perplexity", "--model", model_path, "--file", missing, "--ctx", "128"])
    assert_clean_failure(r, re.escape(missing.name), r"file")


def test_text_inputs_binary_directory_latin1(run_cli, run_ok, model_path, tmp_path):
    """Text read as text (perplexity's --file, a calibration file, distill's
    --data; util/utf8.c li_read_text): a file holding a NUL byte is not text
    (a GGUF given by mistake) and is refused naming the offset; a directory
    names the system's reason; a Latin-1 file reads, with a warning naming
    the first byte that is not UTF-8."""
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(range(256)) * 8)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(PPL_TEXT.read_bytes()[:3000] + "Caf\xe9 cr\xe8me, na\xefve. ".encode("latin-1") * 40)
    cases = [["perplexity", "--model", model_path, "--ctx", "128", "--chunks", "1", "--file"],
             ["quantize", "--method", "w8a8", "--samples", "1", "--seq-len", "64", model_path,
              tmp_path / "q.gguf", "--calib"],
             ["distill", "--teacher", model_path, "--student", model_path, "--steps", "1", "--seq-len", "64",
              "--train", "norms", tmp_path / "d.gguf", "--data"]]
    for args in cases:
        r = run_cli([*args, binary])
        assert_clean_failure(r, r"weights\.bin' holds a NUL byte at offset 5: not a text file")
        r = run_cli([*args, tmp_path])
        assert_clean_failure(r, r"cannot read .*: Is a directory")
    r = run_ok(["perplexity", "--model", model_path, "--ctx", "128", "--chunks", "1", "--file", latin1])
    assert re.search(r"latin1\.txt' is not UTF-8 from byte 3003 \(0xe9\)", r.stderr), r.stderr
    assert not list(tmp_path.glob("*.gguf*"))


def test_perplexity_text_shorter_than_ctx(run_cli, model_path, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("Just a few words.\n")
    r = run_cli(["perplexity", "--model", model_path, "--file", short, "--ctx", "128"])
    assert_clean_failure(r, r"token", r"short", r"chunk", r"ctx", r"context")


@pytest.mark.parametrize("value", ["0", "-5", "1"])
def test_perplexity_bad_ctx(run_cli, model_path, value):
    r = run_cli(["perplexity", "--model", model_path, "--file", PPL_TEXT, "--ctx", value])
    assert_clean_failure(r, r"ctx", r"context")


@pytest.mark.parametrize("value,pattern", [
    ("x+1", r"--logit-bias 'x\+1'"), ("7042", r"--logit-bias '7042'"), ("7042+1x", r"ID\+BIAS"),
    ("-5+1", r"ID\+BIAS"), ("99999+1", r"outside the vocabulary"), ("7042+500", r"\[-100, 100\]"),
    ("7042=nan", r"\[-100, 100\]"),
])
def test_bad_logit_bias(run_cli, model_path, value, pattern):
    r = run_cli(gen(model_path, "--prompt", "hi", "--logit-bias", value))
    assert_clean_failure(r, pattern)


def test_logit_bias_bans_greedy_first_token(run_ok, model_path):
    """The CLI's --logit-bias (llama.cpp's ID-BIAS form): banning the first
    greedy token gives its unbiased runner-up, read from --logprobs."""
    import json
    args = gen(model_path, "--prompt", "The capital of France is", "--json", "--logprobs", "2")
    base = json.loads(run_ok(args).stdout)
    first, runner_up = base["tokens"][0], base["logprobs"][0]["top"][1]["id"]
    banned = json.loads(run_ok(args + ["--logit-bias", f"{first}-100"]).stdout)
    assert banned["tokens"][0] == runner_up != first
    assert banned["logprobs"][0]["logprob"] == pytest.approx(base["logprobs"][0]["top"][1]["logprob"], abs=1e-5)
