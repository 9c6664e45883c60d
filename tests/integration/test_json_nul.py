"""JSON bodies are read without truncation (issue 18, "JSON").

cJSON took C strings, so `"Hello\\u0000 world"` reached the server as
"Hello". The HTTP routes now read bodies with jansson (lengths kept), so
every field that carries text is compared with msgpack-RPC given the same
bytes: a prompt keeps its NUL (tokenize, completion tokens and text); the
fields the engine keeps as C strings (stop strings, chat content and
roles, tenant, cache_salt) refuse a NUL with the same clear message on
both protocols instead of cutting it off.
"""

import json

import pytest

from test_server import PROMPTS, Rpc, http, server, serve_bin, tmpdir_mod  # noqa: F401 (fixtures)

NUL_TEXT = "Hello\u0000 world and more"


def post(server, path, obj):
    status, out = http(server, "POST", path, json.dumps(obj).encode(), {"Content-Type": "application/json"})
    return status, json.loads(out)


def test_tokenize_keeps_nul(server):
    status, out = post(server, "/tokenize", {"prompt": NUL_TEXT})
    assert status == 200, out
    rpc = Rpc(server.rpc).ok("tokenize", {"text": NUL_TEXT})
    assert out["tokens"] == rpc["tokens"] and out["count"] == rpc["count"]
    _, cut = post(server, "/tokenize", {"prompt": "Hello"})
    assert out["count"] > cut["count"] + 3, (out, cut)  # the text after the NUL is there


def test_completion_prompt_keeps_nul(server):
    status, out = post(server, "/v1/completions", {"prompt": NUL_TEXT, "max_tokens": 6, "temperature": 0})
    assert status == 200, out
    rpc = Rpc(server.rpc).ok("generate", {"prompt": NUL_TEXT, "max_tokens": 6, "temperature": 0})
    assert out["usage"]["prompt_tokens"] == rpc["usage"]["prompt_tokens"]
    assert out["choices"][0]["text"] == rpc["text"]
    # a list of prompts too
    status, out2 = post(server, "/v1/completions", {"prompt": [NUL_TEXT], "max_tokens": 6, "temperature": 0})
    assert status == 200 and out2["choices"][0]["text"] == rpc["text"]
    _, cut = post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 1})
    assert out["usage"]["prompt_tokens"] > cut["usage"]["prompt_tokens"] + 3


@pytest.mark.parametrize("field,body", [
    ("stop", {"prompt": PROMPTS[0], "stop": ["Paris\u0000"], "max_tokens": 8, "temperature": 0}),
    ("stop", {"prompt": PROMPTS[0], "stop": "Paris\u0000", "max_tokens": 8, "temperature": 0}),
    ("tenant", {"prompt": PROMPTS[0], "tenant": "a\u0000b", "max_tokens": 1}),
    ("cache_salt", {"prompt": PROMPTS[0], "cache_salt": "a\u0000b", "max_tokens": 1}),
])
def test_c_string_fields_refuse_nul_on_both_protocols(server, field, body):
    status, out = post(server, "/v1/completions", body)
    assert status == 400, out
    msg = out["error"]["message"]
    assert "NUL" in msg and field in msg, msg
    err, _ = Rpc(server.rpc).call("generate", body)
    assert err is not None and err["code"] == -32602 and err["message"] == msg, (err, msg)


@pytest.mark.parametrize("content", ["Hi\u0000 there", [{"type": "text", "text": "Hi\u0000 there"}]])
def test_chat_content_refuses_nul_on_both_protocols(server, content):
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 4, "temperature": 0}
    status, out = post(server, "/v1/chat/completions", body)
    assert status == 400, out
    msg = out["error"]["message"]
    assert "NUL" in msg and "messages[0].content" in msg, msg
    err, _ = Rpc(server.rpc).call("generate", body)
    assert err is not None and err["code"] == -32602 and err["message"] == msg
    # without the NUL both protocols agree on the text
    body["messages"][0]["content"] = "Hi there"
    status, out = post(server, "/v1/chat/completions", body)
    rpc = Rpc(server.rpc).ok("generate", body)
    assert status == 200 and out["choices"][0]["message"]["content"] == rpc["text"]
    assert out["usage"]["prompt_tokens"] == rpc["usage"]["prompt_tokens"]


def test_json_errors_are_clear(server):
    for raw, want in [(b'{"prompt": "x", "prompt": "y"}', "duplicate"),
                      (b'{"prompt": "x", "seed": 123456789012345678901234567890}', "too big integer"),
                      (b'{"prompt": "\\ud800"}', "invalid Unicode"),
                      (b'{"prompt": "x"', "not valid JSON")]:
        status, out = http(server, "POST", "/v1/completions", raw, {"Content-Type": "application/json"})
        assert status == 400, (raw, out)
        assert want in json.loads(out)["error"]["message"], (raw, out)


# ---- NUL in generated text ------------------------------------------------------------
# SmolLM2's byte-level vocabulary holds a token for every byte: byte 0 is
# the piece "Ā" (GPT-2's byte map), which decodes to one NUL byte. A bias
# of +100 forces it, so every generated token is a NUL: responses must carry
# it as \u0000 (jansson keeps lengths; cJSON wrote U+FFFD), the same text
# msgpack-RPC sends as a str with a 0 byte in it.

NUL_TOKEN = 190
FORCE = {"logit_bias": {str(NUL_TOKEN): 100}, "temperature": 0}


def nul_token(server):
    out = Rpc(server.rpc).ok("detokenize", {"tokens": [NUL_TOKEN]})
    if out.get("text") != "\x00":
        pytest.skip(f"token {NUL_TOKEN} is not the NUL byte in this model's vocabulary: {out!r}")


def test_detokenize_writes_nul(server):
    nul_token(server)
    status, raw = http(server, "POST", "/detokenize", json.dumps({"tokens": [NUL_TOKEN, 9906, NUL_TOKEN]}).encode(),
                       {"Content-Type": "application/json"})
    assert status == 200, raw
    assert b"\\u0000" in raw and "\ufffd".encode() not in raw, raw
    text = json.loads(raw)["prompt"]
    rpc = Rpc(server.rpc).ok("detokenize", {"tokens": [NUL_TOKEN, 9906, NUL_TOKEN]})
    assert text == rpc["text"] and text.startswith("\x00") and text.endswith("\x00") and len(text) > 2, (text, rpc)


def test_generated_nul_over_rpc_and_http(server):
    nul_token(server)
    body = {"prompt": PROMPTS[0], "max_tokens": 3, **FORCE}
    rpc = Rpc(server.rpc).ok("generate", body)
    assert rpc["text"] == "\x00\x00\x00", rpc  # a str whose 3 bytes are 0
    status, raw = http(server, "POST", "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    assert status == 200, raw
    assert raw.count(b"\\u0000") == 3 and "\ufffd".encode() not in raw, raw
    assert json.loads(raw)["choices"][0]["text"] == rpc["text"]


def test_generated_nul_with_the_openai_client(server):
    nul_token(server)
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="unused", max_retries=0, timeout=60)
    bias = FORCE["logit_bias"]
    c = client.completions.create(model="m", prompt=PROMPTS[0], max_tokens=3, temperature=0, logit_bias=bias,
                                  logprobs=1)
    assert c.choices[0].text == "\x00" * 3
    assert c.choices[0].logprobs.tokens == ["\x00"] * 3, c.choices[0].logprobs
    # (top_logprobs are the model's raw ones, before the bias: no NUL there)
    msgs = [{"role": "user", "content": "Say something."}]
    ch = client.chat.completions.create(model="m", messages=msgs, max_tokens=3, temperature=0, logit_bias=bias,
                                        logprobs=True, top_logprobs=1)
    assert ch.choices[0].message.content == "\x00" * 3
    lp = ch.choices[0].logprobs.content
    assert [t.token for t in lp] == ["\x00"] * 3 and [t.bytes for t in lp] == [[0]] * 3, lp
    stream = client.chat.completions.create(model="m", messages=msgs, max_tokens=3, temperature=0, logit_bias=bias,
                                            stream=True)
    deltas = "".join(ev.choices[0].delta.content or "" for ev in stream if ev.choices)
    assert deltas == "\x00" * 3
    stream = client.completions.create(model="m", prompt=PROMPTS[0], max_tokens=3, temperature=0, logit_bias=bias,
                                       stream=True)
    assert "".join(ev.choices[0].text for ev in stream if ev.choices) == "\x00" * 3
