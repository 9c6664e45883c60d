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
