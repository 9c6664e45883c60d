"""One request parser, three paths (issue 13, part 7).

The same generate request goes through
  * msgpack-RPC (Python `msgpack` over a socket),
  * HTTP (the official `openai` client, /v1/completions),
  * `luainfer run` with a script calling engine:add (Lua table),
and must give the same tokens (RPC, Lua) and text (all three), greedy and
sampled with a seed; every sampling field is given explicitly, so the
OpenAI route's own defaults play no part. Bad values are refused on all
three with the same message.

Environment: LUAINFER_BIN (default build/luainfer), LUAINFER_MODEL.
"""
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import msgpack
import pytest

REPO = Path(__file__).resolve().parents[2]
THREADS = os.environ.get("LUAINFER_THREADS", "2")
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def server(luainfer_bin, model_path):
    """`luainfer serve` on loopback ports 0: (process, rpc addr, http addr)."""
    tmp = tempfile.mkdtemp(prefix="luainfer-paths-")
    log = open(Path(tmp) / "server.log", "w+")
    proc = subprocess.Popen([str(luainfer_bin), "serve", "--model", str(model_path), "--listen", "127.0.0.1:0",
                             "--http", "127.0.0.1:0", "--threads", THREADS, "--kv-memory", "64M"],
                            stdout=subprocess.PIPE, stderr=log, cwd=REPO, text=True)
    addrs, done = {}, threading.Event()

    def read():
        for line in proc.stdout:
            if "listening on" in line:
                addr, proto = line.split("listening on ")[1].strip().rsplit(" ", 1)
                addrs[proto.strip("()")] = addr
                if len(addrs) == 2:
                    done.set()
        done.set()

    threading.Thread(target=read, daemon=True).start()
    if not done.wait(180) or len(addrs) < 2:
        proc.kill()
        log.seek(0)
        pytest.fail(f"server did not start: {log.read()[-3000:]}")
    yield proc, addrs["msgpack-rpc"], addrs["http"]
    proc.terminate()
    try:
        assert proc.wait(timeout=60) == 0
    finally:
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def rpc_call(addr, method, params):
    """-> (error, result) of one msgpack-RPC call on a fresh connection."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=120) as s:
        s.sendall(msgpack.packb([0, 1, method, params]))
        up = msgpack.Unpacker(raw=False, strict_map_key=False)
        while True:
            data = s.recv(65536)
            assert data, "the server closed the connection"
            up.feed(data)
            for m in up:
                if m[0] == 1 and m[1] == 1:
                    return m[2], m[3]


def lua_literal(v):
    """A Python value as a Lua expression (dict keys: names or [integer])."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid Lua string here (ASCII)
    if isinstance(v, (list, tuple)):
        return "{" + ", ".join(lua_literal(x) for x in v) + "}"
    if isinstance(v, dict):
        items = []
        for k, x in v.items():
            key = f"[{k}]" if isinstance(k, int) else k
            items.append(f"{key} = {lua_literal(x)}")
        return "{" + ", ".join(items) + "}"
    raise TypeError(v)


def lua_run(luainfer_bin, model_path, requests):
    """engine:add for each request in one `luainfer run` script; per request
    {"tokens", "text"} or {"error"}."""
    script = [
        "local luainfer = require('luainfer')",
        f"local e = luainfer.engine{{ model = {json.dumps(str(model_path))}, threads = {int(THREADS)} }}",
        "local function hex(s) return (s:gsub('.', function(c) return string.format('%02x', c:byte()) end)) end",
    ]
    for req in requests:
        script.append(f"""do
  local ok, id = pcall(e.add, e, {lua_literal(req)})
  if not ok then print('ERR ' .. hex(tostring(id))) else
    e:run()
    local r = e:result(id)
    print('TOK ' .. table.concat(r.tokens, ' '))
    print('TXT ' .. hex(r.text))
    e:release(id)
  end
end""")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write("\n".join(script) + "\n")
        path = f.name
    try:
        r = subprocess.run([str(luainfer_bin), "run", path], capture_output=True, timeout=600, cwd=REPO)
    finally:
        os.unlink(path)
    assert r.returncode == 0, r.stderr.decode(errors="replace")[-3000:]
    out, cur = [], None
    for line in r.stdout.decode().splitlines():
        tag, _, rest = line.partition(" ")
        if tag == "ERR":
            out.append({"error": bytes.fromhex(rest).decode()})
        elif tag == "TOK":
            cur = {"tokens": [int(t) for t in rest.split()]}
        elif tag == "TXT":
            cur["text"] = bytes.fromhex(rest).decode("utf-8", errors="replace")
            out.append(cur)
    assert len(out) == len(requests), r.stdout.decode()
    return out


def openai_completion(client, model, req):
    """req through /v1/completions: the OpenAI fields as arguments, the rest in extra_body."""
    std = {"prompt", "max_tokens", "temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "stop"}
    kw = {k: v for k, v in req.items() if k in std}
    if "logit_bias" in req:
        kw["logit_bias"] = {str(k): v for k, v in req["logit_bias"].items()}
    extra = {k: v for k, v in req.items() if k not in std and k != "logit_bias"}
    return client.completions.create(model=model, extra_body=extra, **kw)


def test_openai_fields_that_change_the_reply_are_refused(server):
    """The openai client's own arguments for JSON mode, tools, echo and suffix
    get a 400 naming the field (luainfer serves none of them, and must not
    answer as if they had not been asked); its other extras are still ignored."""
    openai = pytest.importorskip("openai")
    _, _, http = server
    client = openai.OpenAI(base_url=f"http://{http}/v1", api_key="unused", max_retries=0, timeout=60)
    model = client.models.list().data[0].id
    msgs = [{"role": "user", "content": "Give me a JSON object."}]
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
    refused = [
        (lambda: client.chat.completions.create(model=model, messages=msgs, max_tokens=2,
                                                response_format={"type": "json_object"}), "'response_format'"),
        (lambda: client.chat.completions.create(model=model, messages=msgs, max_tokens=2, tools=[tool]), "'tools'"),
        (lambda: client.chat.completions.create(model=model, messages=msgs, max_tokens=2,
                                                tool_choice="required"), "'tool_choice'"),
        (lambda: client.completions.create(model=model, prompt="x", max_tokens=2, echo=True), "'echo'"),
        (lambda: client.completions.create(model=model, prompt="x", max_tokens=2, suffix="end"), "'suffix'"),
        (lambda: client.completions.create(model=model, prompt="x", max_tokens=2, best_of=3), "'best_of'"),
    ]
    for call, field in refused:
        with pytest.raises(openai.BadRequestError) as e:
            call()
        body = e.value.body if isinstance(e.value.body, dict) else {}
        msg = body.get("error", body).get("message", "")
        assert field in msg and "not supported" in msg, (field, e.value.body)
    # the neutral values, and fields that change nothing in the reply, are served
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=2, temperature=0,
                                       response_format={"type": "text"}, user="u1", store=False)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 2
    r = client.completions.create(model=model, prompt="x", max_tokens=2, echo=False, best_of=1, temperature=0)
    assert r.usage.completion_tokens == 2


def test_same_request_same_output_on_three_paths(server, luainfer_bin, model_path):
    openai = pytest.importorskip("openai")
    _, rpc, http = server
    base = {"prompt": PROMPT, "max_tokens": 10, "temperature": 0, "top_p": 1, "top_k": 0, "min_p": 0,
            "ignore_eos": True}
    err, plain = rpc_call(rpc, "generate", base)
    assert err is None, err
    first = plain["tokens"][0]
    reqs = [
        base,
        # penalties (one through the alias), a banned token, a stop token id
        dict(base, max_tokens=24, repeat_penalty=1.3, penalty_last_n=8, logit_bias={first: -100}),
        dict(base, max_tokens=24, presence_penalty=1.5, frequency_penalty=1.0, penalty_last_n=-1),
        # sampled: the seed and every truncation field decide the tokens
        {"prompt": PROMPT, "max_tokens": 12, "temperature": 0.9, "top_p": 0.9, "top_k": 30, "min_p": 0.02,
         "seed": 1234, "ignore_eos": True, "repetition_penalty": 1.1, "penalty_last_n": 64},
    ]
    rpc_out = []
    for req in reqs:
        err, res = rpc_call(rpc, "generate", req)
        assert err is None, (req, err)
        rpc_out.append(res)
    assert rpc_out[1]["tokens"][0] != first, "the banned token was not drawn"
    assert rpc_out[1]["tokens"][:10] != rpc_out[0]["tokens"], "the penalty and the bias changed the output"
    assert rpc_out[2]["tokens"][:10] != rpc_out[0]["tokens"], "the penalties changed the output"
    lua_out = lua_run(luainfer_bin, model_path, reqs)
    client = openai.OpenAI(base_url=f"http://{http}/v1", api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    for req, r, l in zip(reqs, rpc_out, lua_out):
        assert "error" not in l, (req, l)
        assert l["tokens"] == r["tokens"], (req, r["tokens"], l["tokens"])
        assert l["text"] == r["text"]
        h = openai_completion(client, model, req)
        assert h.choices[0].text == r["text"], (req, h.choices[0].text, r["text"])
        assert h.usage.completion_tokens == len(r["tokens"])


def test_bad_values_refused_alike_on_three_paths(server, luainfer_bin, model_path):
    openai = pytest.importorskip("openai")
    _, rpc, http = server
    bad = [
        {"temperature": -1},
        {"temperature": "hot"},
        {"top_p": 0},
        {"max_tokens": 2000000},
        {"n": 65},
        {"seed": -5},
        {"penalty_last_n": -2},
        {"repeat_penalty": 0},
        {"logprobs": 21},
        {"min_p": 1.5},
        {"stop": [""]},
        {"stop_token_ids": [49152]},
        {"logit_bias": {49152: 1}},
        {"logit_bias": {5: 101}},
        {"max_tokens": 4, "min_tokens": 5},
        {"ignore_eos": 1},
    ]
    reqs = [dict({"prompt": "x", "max_tokens": 1}, **b) for b in bad]
    lua_out = lua_run(luainfer_bin, model_path, reqs)
    client = openai.OpenAI(base_url=f"http://{http}/v1", api_key="unused", max_retries=0, timeout=60)
    model = client.models.list().data[0].id
    for req, l in zip(reqs, lua_out):
        err, _ = rpc_call(rpc, "generate", req)
        assert err is not None and err["code"] == -32602, (req, err)
        assert err["message"].startswith("invalid params: ")
        assert l.get("error") == err["message"], (req, l, err["message"])
        with pytest.raises(openai.BadRequestError) as e:
            openai_completion(client, model, req)
        body = e.value.body if isinstance(e.value.body, dict) else {}
        assert body.get("error", body).get("message") == err["message"], (req, e.value.body)
    # nothing is left running
    err, st = rpc_call(rpc, "stats", {})
    assert err is None
