"""End-to-end tests of `luainfer serve` with real clients.

The server runs the real model on loopback with port 0 (the printed port is
parsed). Clients: raw `msgpack` over a socket (streaming and not), the
third-party msgpack-rpc client `aio-msgpack-rpc`, the official `openai`
client, the Lua client (lua/luainfer/client.lua via `luainfer run`), the
Python and C examples, and the REPL through a pseudo-terminal.

Greedy outputs are compared with what a request gets alone, token for
token: the kernels are batch-invariant (a row's arithmetic does not depend
on what else is in the batch), so a near tie cannot flip between a lone and
a batched run. GAP_NATS = 0 keeps the whole output in the comparison; the
streamed deltas must also rebuild the final text exactly.

Environment: LUAINFER_BIN (default build/luainfer), LUAINFER_MODEL.
"""

import asyncio
import json
import os
import pty
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import msgpack
import pytest

REPO = Path(__file__).resolve().parents[2]
GAP_NATS = 0.0  # > 0 would exempt near ties; batch invariance makes that unnecessary
THREADS = os.environ.get("LUAINFER_THREADS", "2")
PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "The three primary colors are"]


# ---------------------------------------------------------------------------
# Starting servers
# ---------------------------------------------------------------------------
class Server:
    """One `luainfer serve` process; .rpc/.http/.unix are the printed addresses."""

    def __init__(self, binary, args, n_listeners, tmp):
        self.log = open(Path(tmp) / f"server-{time.time_ns()}.log", "w+")
        self.proc = subprocess.Popen([str(binary), "serve", *args], stdout=subprocess.PIPE,
                                     stderr=self.log, cwd=REPO, text=True)
        self.addrs = []
        lines, got_line = [], threading.Condition()

        def read_stdout():  # a thread: select() on a buffered text pipe can miss lines
            for line in self.proc.stdout:
                with got_line:
                    lines.append(line)
                    got_line.notify()
            with got_line:
                lines.append(None)
                got_line.notify()

        threading.Thread(target=read_stdout, daemon=True).start()
        deadline = time.time() + 180
        with got_line:
            while len(self.addrs) < n_listeners:
                while not lines and time.time() < deadline:
                    got_line.wait(0.5)
                line = lines.pop(0) if lines else None
                if line is None:
                    self.stop()
                    pytest.fail(f"server did not start: {self.stderr()[-3000:]}")
                if "listening on" in line:
                    addr, proto = line.split("listening on ")[1].strip().rsplit(" ", 1)
                    self.addrs.append((addr, proto.strip("()")))
        self.rpc = next((a for a, p in self.addrs if p == "msgpack-rpc" and not a.startswith("unix:")), None)
        self.unix = next((a for a, p in self.addrs if a.startswith("unix:")), None)
        self.http = next((a for a, p in self.addrs if p == "http"), None)

    @property
    def port(self):
        return int(self.rpc.rsplit(":", 1)[1])

    def stderr(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="module")
def serve_bin(luainfer_bin, model_path):
    r = subprocess.run([str(luainfer_bin), "serve", "--help"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        pytest.skip(f"{luainfer_bin} has no 'serve' command yet: {r.stderr.strip()[:200]}")
    return luainfer_bin


@pytest.fixture(scope="module")
def tmpdir_mod():
    d = tempfile.mkdtemp(prefix="luainfer-serve-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def server(serve_bin, tmpdir_mod):
    sock = os.path.join(tmpdir_mod, "rpc.sock")
    s = Server(serve_bin, ["--listen", "127.0.0.1:0", "--listen", f"unix:{sock}", "--http", "127.0.0.1:0",
                           "--threads", THREADS, "--kv-memory", "96M", "--admin-token", "admintok",
                           "--max-frame-bytes", "65536", "--max-inflight", "8"], 3, tmpdir_mod)
    yield s
    rc = s.stop()
    assert rc == 0, f"server exited {rc}: {s.stderr()[-2000:]}"


# ---------------------------------------------------------------------------
# A raw msgpack-RPC connection
# ---------------------------------------------------------------------------
class Rpc:
    def __init__(self, addr, timeout=60):
        if addr.startswith("unix:"):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(addr[5:])
        else:
            host, port = addr.rsplit(":", 1)
            self.sock = socket.create_connection((host, int(port)))
        self.sock.settimeout(timeout)
        self.unpacker = msgpack.Unpacker(raw=False)
        self.next_id = 1
        self.notes = []

    def send(self, obj, **kw):
        self.sock.sendall(msgpack.packb(obj, **kw))

    def read(self):
        """Next message, or None when the server closed the connection."""
        while True:
            for m in self.unpacker:
                return m
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not data:
                return None
            self.unpacker.feed(data)

    def call(self, method, params=None, **kw):
        """-> (error, result); notifications go to self.notes."""
        msgid = self.next_id
        self.next_id += 1
        self.send([0, msgid, method, {} if params is None else params], **kw)
        while True:
            m = self.read()
            if m is None:
                raise ConnectionError("closed")
            if m[0] == 2:
                self.notes.append(m)
            elif m[0] == 1 and m[1] == msgid:
                return m[2], m[3]

    def ok(self, method, params=None):
        err, res = self.call(method, params)
        assert err is None, f"{method} failed: {err}"
        return res

    def closed(self, timeout=10):
        """True once the server closed the connection (unread messages skipped)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                d = self.sock.recv(65536)
                if not d:
                    return True
                self.unpacker.feed(d)
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False

    def close(self):
        self.sock.close()


def stream(addr, params):
    """A streamed generate on a fresh connection -> (delta text, delta tokens, result)."""
    c = Rpc(addr)
    err, res = c.call("generate", dict(params, stream=True))
    c.close()
    assert err is None, err
    text = "".join(n[2]["text"] for n in c.notes if n[1] == "generate.delta")
    toks = [t for n in c.notes if n[1] == "generate.delta" for t in n[2]["tokens"]]
    return text, toks, res


def reliable_prefix(res):
    """Tokens of a lone greedy run before its first near tie (see the module doc)."""
    n = 0
    for e in res["logprobs"]:
        top = e["top"]
        if GAP_NATS > 0 and len(top) > 1 and top[0][1] - top[1][1] < GAP_NATS:
            break
        n += 1
    return n


def wait_idle(rpc, timeout=30):
    deadline = time.time() + timeout
    while True:
        st = rpc.ok("stats")
        if st["requests"]["live"] == 0 and st["kv"]["blocks_used"] == 0:
            return st
        if time.time() > deadline:
            pytest.fail(f"server not idle: {st}")
        time.sleep(0.05)


# ---------------------------------------------------------------------------
# msgpack over a raw socket
# ---------------------------------------------------------------------------
def test_generate_matches_cli(server, run_ok):
    """A plain generate returns what `luainfer generate` computes for one request."""
    c = Rpc(server.rpc)
    res = c.ok("generate", {"prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0})
    assert res["finish_reason"] == "length"
    assert res["usage"]["completion_tokens"] == 8 and res["usage"]["prompt_tokens"] > 0
    assert set(res["timings"]) == {"ttft_ms", "tpot_ms", "total_ms"}
    assert res["timings"]["total_ms"] >= res["timings"]["ttft_ms"] > 0
    cli = run_ok(["generate", "--prompt", PROMPTS[0], "--max-tokens", "8", "--temperature", "0", "--json",
                  "--threads", THREADS]).json()
    assert res["tokens"] == cli["tokens"] and res["text"] == cli["text"]
    c.close()


def test_stream_deltas_rebuild_the_result(server):
    text, toks, res = stream(server.rpc, {"prompt": PROMPTS[1], "max_tokens": 12, "temperature": 0})
    assert text == res["text"] and toks == res["tokens"] and len(toks) == 12
    c = Rpc(server.rpc)
    err, _ = c.call("generate", {"prompt": PROMPTS[1], "max_tokens": 3, "temperature": 0, "stream": True})
    assert err is None
    deltas = [n for n in c.notes if n[1] == "generate.delta"]
    assert [d[2]["request_id"] for d in deltas] == [1] * 3  # request_id = the msgid
    assert all(set(d[2]) >= {"id", "request_id", "text", "tokens", "index"} for d in deltas)
    c.close()


def test_params_forms_and_unix_socket(server):
    """params as a map, as [map] (what msgpack-rpc libraries send), over TCP and a Unix socket."""
    for addr in (server.rpc, server.unix):
        c = Rpc(addr)
        a = c.ok("generate", {"prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0})
        b = c.ok("generate", [{"prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0}])
        assert a["tokens"] == b["tokens"]
        assert c.ok("health", [])["status"] == "ok"
        c.close()


def test_chat_tokens_n_stop_logprobs(server):
    c = Rpc(server.rpc)
    chat = c.ok("generate", {"messages": [{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": "Say hello."}],
                             "max_tokens": 8, "temperature": 0})
    assert chat["text"] and chat["usage"]["prompt_tokens"] > 10
    toks = c.ok("tokenize", {"text": PROMPTS[0]})["tokens"]
    by_tokens = c.ok("generate", {"tokens": toks, "max_tokens": 6, "temperature": 0})
    by_text = c.ok("generate", {"prompt": PROMPTS[0], "max_tokens": 6, "temperature": 0})
    assert by_tokens["tokens"] == by_text["tokens"]
    assert c.ok("detokenize", {"tokens": by_text["tokens"]})["text"] == by_text["text"]
    multi = c.ok("generate", {"prompt": PROMPTS[1], "max_tokens": 5, "n": 3, "temperature": 0.9, "seed": 7})
    assert len(multi["choices"]) == 3 and [ch["index"] for ch in multi["choices"]] == [0, 1, 2]
    assert multi["usage"]["completion_tokens"] == sum(len(ch["tokens"]) for ch in multi["choices"])
    again = c.ok("generate", {"prompt": PROMPTS[1], "max_tokens": 5, "n": 3, "temperature": 0.9, "seed": 7})
    assert [ch["tokens"] for ch in again["choices"]] == [ch["tokens"] for ch in multi["choices"]]
    full = by_text["text"]
    stop_at = full.strip().split()[0] if full.strip() else None
    if stop_at:
        stopped = c.ok("generate", {"prompt": PROMPTS[0], "max_tokens": 6, "temperature": 0, "stop": [stop_at]})
        assert stopped["finish_reason"] == "stop" and stop_at not in stopped["text"]
    lp = c.ok("generate", {"prompt": PROMPTS[0], "max_tokens": 3, "temperature": 0, "logprobs": 2})
    assert len(lp["logprobs"]) == 3 and all(len(e["top"]) == 2 for e in lp["logprobs"])
    assert [e["token"] for e in lp["logprobs"]] == lp["tokens"]
    # prefix cache: a repeated prompt reuses its full blocks, unless the cache_salt differs
    long = "The history of the Roman empire spans many centuries and includes " * 6
    c.ok("generate", {"prompt": long, "max_tokens": 1})
    assert c.ok("generate", {"prompt": long, "max_tokens": 1})["usage"]["cached_tokens"] >= 16
    assert c.ok("generate", {"prompt": long, "max_tokens": 1, "cache_salt": "t2"})["usage"]["cached_tokens"] == 0
    zero = c.ok("generate", {"prompt": PROMPTS[0], "max_tokens": 0})
    assert zero["finish_reason"] == "length" and zero["tokens"] == []
    c.close()


def test_info_methods(server):
    c = Rpc(server.rpc)
    models = c.ok("models")
    assert models[0]["id"] and models[0]["n_vocab"] > 1000
    assert c.ok("health")["status"] == "ok"
    st = c.ok("stats")
    for k in ("requests", "queues", "kv", "engine", "policy", "throughput", "connections"):
        assert k in st
    assert st["kv"]["blocks_total"] > 0 and st["policy"]["name"]
    assert set(c.ok("methods")) >= {"generate", "cancel", "tokenize", "detokenize", "stats", "policy.reload"}
    c.close()


def test_cancel(server):
    c = Rpc(server.rpc)
    c.send([0, 1, "generate", {"prompt": PROMPTS[2], "max_tokens": 500, "ignore_eos": True, "stream": True}])
    first = c.read()
    assert first[0] == 2 and first[1] == "generate.delta"
    c.send([0, 2, "cancel", {"id": first[2]["id"]}])
    got = {}
    while len(got) < 2:
        m = c.read()
        if m[0] == 1:
            got[m[1]] = m
    assert got[2][3] == {"cancelled": True}
    assert got[1][3]["finish_reason"] == "cancelled" and len(got[1][3]["tokens"]) < 500
    assert c.ok("cancel", {"request_id": 12345}) == {"cancelled": False}
    c.close()


# ---------------------------------------------------------------------------
# A third-party msgpack-rpc client
# ---------------------------------------------------------------------------
def test_third_party_msgpack_rpc_client(server):
    """aio-msgpack-rpc (asyncio; msgpack 1.x) for plain calls. It sends params as
    an array of arguments, so one map argument arrives as [map]."""
    aio = pytest.importorskip("aio_msgpack_rpc")

    async def main():
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        client = aio.Client(reader, writer, response_timeout=60)
        health = await client.call("health")
        toks = await client.call("tokenize", {"text": "hello world"})
        res = await client.call("generate", {"prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0})
        with pytest.raises(aio.error.RPCResponseError):
            await client.call("no.such.method")
        client.close()
        return health, toks, res

    health, toks, res = asyncio.run(main())
    assert health["status"] == "ok" and toks["count"] == len(toks["tokens"]) > 0
    assert res["finish_reason"] == "length" and len(res["tokens"]) == 4


# ---------------------------------------------------------------------------
# HTTP: the official openai client, raw requests
# ---------------------------------------------------------------------------
def test_openai_client(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="unused", max_retries=0, timeout=60)
    models = client.models.list()
    model = models.data[0].id
    c = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=8, temperature=0)
    rpc = Rpc(server.rpc).ok("generate", {"prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0})
    assert c.choices[0].text == rpc["text"] and c.choices[0].finish_reason == "length"
    assert c.usage.completion_tokens == 8
    parts, roles, finish = [], [], None
    for chunk in client.chat.completions.create(model=model, stream=True, max_tokens=10, temperature=0,
                                                messages=[{"role": "user", "content": "Name a color."}]):
        if chunk.choices:
            d = chunk.choices[0].delta
            roles.append(d.role)
            parts.append(d.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert roles[0] == "assistant" and finish in ("stop", "length")
    whole = client.chat.completions.create(model=model, max_tokens=10, temperature=0,
                                           messages=[{"role": "user", "content": "Name a color."}])
    assert "".join(parts) == whole.choices[0].message.content
    # logprobs in both OpenAI shapes
    c = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=3, temperature=0, logprobs=2)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == 3 and len(lp.token_logprobs) == 3 and all(len(t) == 2 for t in lp.top_logprobs)
    assert "".join(lp.tokens) == c.choices[0].text and lp.text_offset[0] == 0
    ch = client.chat.completions.create(model=model, max_tokens=3, temperature=0, logprobs=True, top_logprobs=2,
                                        messages=[{"role": "user", "content": "Name a color."}])
    content = ch.choices[0].logprobs.content
    assert len(content) == 3 and all(len(e.top_logprobs) == 2 for e in content)
    assert content[0].logprob == pytest.approx(content[0].top_logprobs[0].logprob, abs=1e-4)
    # logprobs=True without top_logprobs: the chosen tokens' logprobs alone
    # (the sampler computes the normalizer only when asked), the same values
    bare = client.chat.completions.create(model=model, max_tokens=3, temperature=0, logprobs=True,
                                          messages=[{"role": "user", "content": "Name a color."}])
    bc = bare.choices[0].logprobs.content
    assert [e.token for e in bc] == [e.token for e in content]
    assert all(e.logprob < 0 or e.logprob == pytest.approx(0, abs=1e-6) for e in bc)
    assert [e.logprob for e in bc] == pytest.approx([e.logprob for e in content], abs=1e-4)
    assert all(e.top_logprobs == [] for e in bc)
    # without logprobs there is no logprobs object at all
    none = client.chat.completions.create(model=model, max_tokens=3, temperature=0,
                                          messages=[{"role": "user", "content": "Name a color."}])
    assert none.choices[0].logprobs is None


def test_logit_bias_rpc_and_openai(server):
    """logit_bias through msgpack-RPC (integer ids) and the openai client
    (JSON: ids as strings): banning greedy's first token yields the unbiased
    runner-up; +100 forces a token; both transports agree; bad maps are
    refused with 400 / -32602."""
    openai = pytest.importorskip("openai")
    rpc = Rpc(server.rpc)
    base = rpc.ok("generate", {"prompt": PROMPTS[0], "max_tokens": 6, "temperature": 0, "logprobs": 2})
    first, runner_up = base["tokens"][0], base["logprobs"][0]["top"][1]
    runner_up = runner_up["id"] if isinstance(runner_up, dict) else runner_up[0]
    banned = rpc.ok("generate", {"prompt": PROMPTS[0], "max_tokens": 6, "temperature": 0,
                                 "logit_bias": {first: -100}})
    assert banned["tokens"][0] == runner_up != first
    client = openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="unused", max_retries=0, timeout=60)
    model = client.models.list().data[0].id
    c = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=6, temperature=0,
                                  logit_bias={str(first): -100})
    assert c.choices[0].text == banned["text"]
    forced = base["tokens"][1] if base["tokens"][1] != first else banned["tokens"][0]
    f = rpc.ok("generate", {"prompt": PROMPTS[0], "max_tokens": 5, "temperature": 1.0, "seed": 3, "n": 2,
                            "ignore_eos": True, "logit_bias": {forced: 100}})
    assert [ch["tokens"] for ch in f["choices"]] == [[forced] * 5] * 2
    ch = client.chat.completions.create(model=model, max_tokens=4, temperature=1.0, seed=3,
                                        logit_bias={str(forced): 100},
                                        messages=[{"role": "user", "content": "Name a color."}])
    assert ch.choices[0].message.content == rpc.ok("detokenize", {"tokens": [forced] * 4})["text"]
    for bad in [{"x": 1}, {"-1": 1}, {"5": 101}, {"5": "a"}, {"49152": 1}, [1, 2], {str(i): 1 for i in range(1025)}]:
        err, _ = rpc.call("generate", {"prompt": "x", "logit_bias": bad})
        assert err is not None and err["code"] == -32602 and "logit_bias" in err["message"], (bad, err)
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model=model, prompt="x", max_tokens=1, logit_bias=bad)
    # msgpack may repeat a key inside a map; one id twice is refused
    frame = b"\x94\x00\x07\xa8generate\x82\xa6prompt\xa1x\xaalogit_bias\x82\x05\x01\x05\x02"
    c = Rpc(server.rpc)
    c.sock.sendall(frame)
    m = c.read()
    assert m[0] == 1 and m[2]["code"] == -32602 and "twice" in m[2]["message"], m
    c.close()
    rpc.close()


def test_min_tokens_and_stop_token_ids(server):
    """vLLM's min_tokens and stop_token_ids over msgpack-RPC and, as extra
    body fields, through the openai client; bad values are refused."""
    openai = pytest.importorskip("openai")
    rpc = Rpc(server.rpc)
    chat = [{"role": "user", "content": "Say hi."}]
    base = rpc.ok("generate", {"messages": chat, "max_tokens": 48, "temperature": 0})
    n = len(base["tokens"])
    assert base["finish_reason"] == "stop" and 4 <= n < 48
    st = base["tokens"][3]
    cut = rpc.ok("generate", {"messages": chat, "max_tokens": 48, "temperature": 0, "stop_token_ids": [st]})
    k = base["tokens"].index(st)
    assert cut["finish_reason"] == "stop" and cut["tokens"] == base["tokens"][:k]
    long = rpc.ok("generate", {"messages": chat, "max_tokens": 48, "temperature": 0, "min_tokens": n + 4})
    assert len(long["tokens"]) >= n + 4 and long["tokens"][:n] == base["tokens"]
    client = openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="unused", max_retries=0, timeout=60)
    model = client.models.list().data[0].id
    c = client.chat.completions.create(model=model, messages=chat, max_tokens=48, temperature=0,
                                       extra_body={"min_tokens": n + 4})
    assert c.choices[0].message.content == long["text"] and c.usage.completion_tokens == len(long["tokens"])
    c = client.chat.completions.create(model=model, messages=chat, max_tokens=48, temperature=0,
                                       extra_body={"stop_token_ids": [st]})
    assert c.choices[0].message.content == cut["text"] and c.choices[0].finish_reason == "stop"
    for bad in [{"min_tokens": 9, "max_tokens": 8}, {"min_tokens": -1}, {"stop_token_ids": [49152]},
                {"stop_token_ids": [-1]}, {"stop_token_ids": 5}, {"stop_token_ids": list(range(65))}]:
        err, _ = rpc.call("generate", {"prompt": "x", **bad})
        assert err is not None and err["code"] == -32602, (bad, err)
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model=model, prompt="x", max_tokens=bad.get("max_tokens", 16),
                                      extra_body={k: v for k, v in bad.items() if k != "max_tokens"})
    rpc.close()


def test_error_messages_quoting_bad_bytes_are_utf8(server):
    """An error that quotes a client's invalid UTF-8 (an unknown parameter
    name, a logit_bias key) still replies with a valid UTF-8 message."""
    frames = [
        # {"prompt": "x", "\xff\xfe": 1}
        b"\x94\x00\x09\xa8generate\x82\xa6prompt\xa1x\xa2\xff\xfe\x01",
        # {"prompt": "x", "logit_bias": {"\xe2\x82": 1}} (a cut 3-byte sequence)
        b"\x94\x00\x09\xa8generate\x82\xa6prompt\xa1x\xaalogit_bias\x81\xa2\xe2\x82\x01",
    ]
    for frame, want in zip(frames, ["unknown parameter '??'", "key '??' is not a token id"]):
        c = Rpc(server.rpc)
        c.sock.sendall(frame)
        m = c.read()  # raw=False: an invalid UTF-8 message would raise here
        assert m[0] == 1 and m[1] == 9 and m[2]["code"] == -32602 and want in m[2]["message"], m
        assert c.ok("health")["status"] == "ok"
        c.close()


def test_openai_streamed_logprobs_equal_non_streamed(server):
    """stream: true with logprobs sends each token's logprobs in its chunk; put
    together they equal the non-streamed response's (text_offset counts from
    the start of the sample's text in both)."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="unused", max_retries=0, timeout=60)
    model = client.models.list().data[0].id
    kw = dict(model=model, prompt=PROMPTS[0], max_tokens=8, temperature=0, logprobs=3, n=2)
    whole = client.completions.create(**kw)
    keys = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    got = {i: {"text": "", **{k: [] for k in keys}} for i in range(2)}
    for chunk in client.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            got[ch.index]["text"] += ch.text
            if ch.logprobs is not None:
                for k in keys:
                    got[ch.index][k] += getattr(ch.logprobs, k)
    for ch in whole.choices:
        want, g = ch.logprobs, got[ch.index]
        assert g["text"] == ch.text and g["tokens"] == want.tokens and len(want.tokens) == 8
        assert g["token_logprobs"] == pytest.approx(want.token_logprobs, abs=1e-5)
        assert [sorted(t) for t in g["top_logprobs"]] == [sorted(t) for t in want.top_logprobs]
        assert [t[k] for t in g["top_logprobs"] for k in sorted(t)] == \
            pytest.approx([t[k] for t in want.top_logprobs for k in sorted(t)], abs=1e-5)
        assert g["text_offset"] == want.text_offset and want.text_offset[-1] > 0

    msgs = [{"role": "user", "content": "Name a color."}]
    ckw = dict(model=model, messages=msgs, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2)
    want = client.chat.completions.create(**ckw).choices[0].logprobs.content
    streamed, text = [], ""
    for chunk in client.chat.completions.create(stream=True, **ckw):
        for ch in chunk.choices:
            text += ch.delta.content or ""
            if ch.logprobs is not None:
                streamed += ch.logprobs.content
    assert len(want) > 0 and [e.token for e in streamed] == [e.token for e in want]
    assert [e.bytes for e in streamed] == [e.bytes for e in want]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in want], abs=1e-5)
    assert [[(t.token, t.bytes) for t in e.top_logprobs] for e in streamed] == \
        [[(t.token, t.bytes) for t in e.top_logprobs] for e in want]
    assert [t.logprob for e in streamed for t in e.top_logprobs] == \
        pytest.approx([t.logprob for e in want for t in e.top_logprobs], abs=1e-5)


def replace_per_byte(b):
    """A token's text as the server writes it: each byte that does not start a
    valid UTF-8 character (or is NUL) becomes one U+FFFD."""
    out, i = [], 0
    while i < len(b):
        for n in (1, 2, 3, 4):
            try:
                ch = b[i:i + n].decode("utf-8")
            except UnicodeDecodeError:
                continue
            if len(ch) == 1 and ch != "\0":
                out.append(ch)
                i += n
                break
        else:
            out.append("\ufffd")
            i += 1
    return "".join(out)


def test_logprobs_of_partial_utf8_tokens(server):
    """Byte-level tokens that hold part of a character (an emoji's first bytes,
    its continuation bytes): `bytes` are the token's raw bytes, `token` is
    valid JSON text with U+FFFD for each byte that starts no character."""
    emoji = "\U0001F600" * 8
    body = {"messages": [{"role": "user", "content": emoji}], "max_tokens": 8, "temperature": 0,
            "logprobs": True, "top_logprobs": 3}
    status, raw = http(server, "POST", "/v1/chat/completions", json.dumps(body).encode(),
                       {"Content-Type": "application/json"})
    assert status == 200, raw
    ch = json.loads(raw.decode("utf-8"))["choices"][0]  # strict UTF-8: no raw partial bytes leak out
    content = ch["logprobs"]["content"]
    entries = content + [t for e in content for t in e["top_logprobs"]]
    partial = [e for e in entries if "\ufffd" in bytes(e["bytes"]).decode("utf-8", "replace")]
    assert partial, f"no partial-UTF-8 token to check: {[e['bytes'] for e in content]}"
    for e in entries:
        assert all(0 <= b <= 255 for b in e["bytes"]) and e["token"] == replace_per_byte(bytes(e["bytes"])), e
    # the chosen tokens' raw bytes, put together, are the generated text
    assert b"".join(bytes(e["bytes"]) for e in content).decode("utf-8", "replace") == ch["message"]["content"]
    # the completions shape: partial tokens are valid strings there too (tokens, top_logprobs keys)
    body = {"prompt": emoji, "max_tokens": 8, "temperature": 0, "logprobs": 3}
    status, raw = http(server, "POST", "/v1/completions", json.dumps(body).encode(),
                       {"Content-Type": "application/json"})
    assert status == 200, raw
    lp = json.loads(raw.decode("utf-8"))["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == 8 and any("\ufffd" in t for t in lp["tokens"]), lp["tokens"]
    assert all(isinstance(k, str) for m in lp["top_logprobs"] for k in m)


def http(server, method, path, body=None, headers=None):
    req = urllib.request.Request(f"http://{server.http}{path}", data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_http_errors_health_metrics(server):
    for body, want in [(b"{not json", 400), (b"[1,2]", 400), (b'{"prompt": 5}', 400),
                       (b'{"prompt": "x", "temperature": -1}', 400), (b'{"prompt": "x", "n": 1000}', 400),
                       (b"{" + b'"a":[' * 100 + b"]" * 100 + b"}", 400),
                       # a repeated key (JSON allows it): refused, not merged past fixed room
                       (b'{"prompt": "x", "stop": [' + b",".join(b'"s%d"' % i for i in range(16)) + b'], "stop": ["t"]}',
                        400),
                       (b'{"prompt": "x", "top_k": -1, "max_tokens": 1}', 200),
                       # an empty key: unknown, so ignored as OpenAI's other extras are
                       (b'{"": 1, "prompt": "x", "max_tokens": 1}', 200)]:
        status, out = http(server, "POST", "/v1/completions", body, {"Content-Type": "application/json"})
        assert status == want, (body[:40], status, out)
        assert want == 200 or json.loads(out)["error"]["message"]
    status, out = http(server, "POST", "/v1/completions", b'{"prompt":"' + b"a" * 70000 + b'"}')
    assert status == 413
    assert http(server, "GET", "/nope")[0] == 404
    assert http(server, "GET", "/v1/completions")[0] == 405
    status, out = http(server, "GET", "/health")
    assert status == 200 and json.loads(out)["status"] == "ok"
    status, out = http(server, "GET", "/metrics")
    text = out.decode()
    assert status == 200
    for name in ("luainfer_requests_total{finish_reason=\"length\"}", "luainfer_prompt_tokens_total",
                 "luainfer_generation_tokens_total", "luainfer_time_to_first_token_seconds_bucket",
                 "luainfer_time_per_output_token_seconds_bucket", "luainfer_kv_blocks_used",
                 "luainfer_kv_blocks_total", "luainfer_preemptions_total", "luainfer_policy_errors_total",
                 "luainfer_policy_fallback_steps_total", "luainfer_step_duration_seconds_bucket"):
        assert name in text, name


def test_http_tokenize_detokenize(server):
    """vLLM's /tokenize and /detokenize: the same ids and text as the
    msgpack-RPC methods; bad bodies are 400, GET is 405."""
    rpc = Rpc(server.rpc)
    text = "Hello world, caf\u00e9 \u2603"
    want = rpc.ok("tokenize", {"text": text})["tokens"]
    st, body = http(server, "POST", "/tokenize", json.dumps({"prompt": text}).encode(),
                    {"Content-Type": "application/json"})
    got = json.loads(body)
    assert st == 200 and got["tokens"] == want and got["count"] == len(want) and got["max_model_len"] > 0
    st, body = http(server, "POST", "/tokenize", json.dumps({"prompt": text, "add_special_tokens": False}).encode())
    assert st == 200 and json.loads(body)["tokens"] == rpc.ok("tokenize", {"text": text, "special": False})["tokens"]
    st, body = http(server, "POST", "/detokenize", json.dumps({"tokens": want}).encode())
    assert st == 200 and json.loads(body)["prompt"] == rpc.ok("detokenize", {"tokens": want})["text"]
    assert json.loads(body)["prompt"].endswith(text)
    for path, payload in [("/tokenize", {}), ("/tokenize", {"prompt": 5}), ("/tokenize", {"prompt": "x", "add_special_tokens": 1}),
                          ("/detokenize", {}), ("/detokenize", {"tokens": [1, -2]}), ("/detokenize", {"tokens": [1.5]}),
                          ("/detokenize", {"tokens": [10 ** 9]}), ("/detokenize", {"tokens": "1 2"})]:
        st, body = http(server, "POST", path, json.dumps(payload).encode())
        assert st == 400 and json.loads(body)["error"]["message"], (path, payload, body)
    st, _ = http(server, "GET", "/tokenize")
    assert st == 405
    st, _ = http(server, "POST", "/tokenize", b"[1]")
    assert st == 400
    rpc.close()


def test_head_sends_headers_without_body(server):
    """HEAD gets GET's status and headers, Content-Length included, and no
    body: on one keep-alive connection the next response follows the
    header at once."""
    host, port = server.http.rsplit(":", 1)

    def exchange(reqs):
        """Sends the requests on one connection -> the bytes until it closes."""
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(b"".join(reqs))
            out = b""
            while True:
                d = s.recv(65536)
                if not d:
                    return out
                out += d

    def split(resp):
        head, _, rest = resp.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:])
        return int(lines[0].split()[1]), headers, rest

    def req(method, path, close=False):
        return (f"{method} {path} HTTP/1.1\r\nHost: x\r\n" + ("Connection: close\r\n" if close else "") +
                "\r\n").encode()

    for path, status in (("/health", 200), ("/v1/models", 200), ("/metrics", 200), ("/v1/completions", 405),
                         ("/nope", 404)):
        out = exchange([req("GET", path, close=True)])
        g_status, g_headers, g_body = split(out)
        assert g_status == status and int(g_headers["Content-Length"]) == len(g_body) > 0
        out = exchange([req("HEAD", path), req("GET", "/health", close=True)])
        h_status, h_headers, rest = split(out)
        assert h_status == status, (path, out[:200])
        assert rest.startswith(b"HTTP/1.1 200 "), f"HEAD {path} sent a body: {rest[:80]!r}"
        assert h_headers["Content-Type"] == g_headers["Content-Type"]
        if path != "/metrics":  # the metrics text changes between the two requests
            assert int(h_headers["Content-Length"]) == len(g_body), path
        assert split(rest)[2] == b'{"status":"ok"}'


# ---------------------------------------------------------------------------
# Concurrency: 128 streaming clients
# ---------------------------------------------------------------------------
def test_128_concurrent_streams_match_lone_runs(server):
    alone = []
    c = Rpc(server.rpc)
    for p in PROMPTS:
        alone.append(c.ok("generate", {"prompt": p, "max_tokens": 8, "temperature": 0, "logprobs": 2}))
    c.close()
    out, errors = [None] * 128, []

    def worker(i):
        try:
            out[i] = stream(server.rpc, {"prompt": PROMPTS[i % 4], "max_tokens": 8, "temperature": 0})
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(128)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    compared = 0
    for i, (text, toks, res) in enumerate(out):
        ref = alone[i % 4]
        assert text == res["text"] and toks == res["tokens"], f"client {i}: stream != its result"
        k = reliable_prefix(ref)
        assert res["tokens"][:k] == ref["tokens"][:k], f"client {i} ({PROMPTS[i % 4]!r}) got another output"
        if k == len(ref["tokens"]):
            assert res["text"] == ref["text"]
        compared += k
    assert compared >= 128 * 8 // 2, "too few tokens were far from a tie to compare"
    print(f"128 streams in {time.time() - t0:.1f}s; {compared} tokens compared exactly")


# ---------------------------------------------------------------------------
# Bad input, while another client keeps being served
# ---------------------------------------------------------------------------
def test_bad_input_while_serving(server):
    ref = Rpc(server.rpc).ok("generate", {"prompt": PROMPTS[3], "max_tokens": 6, "temperature": 0})
    stop, good, problems = threading.Event(), [0], []

    def steady():
        while not stop.is_set():
            text, _, res = stream(server.rpc, {"prompt": PROMPTS[3], "max_tokens": 6, "temperature": 0})
            if res["tokens"] != ref["tokens"] or text != res["text"]:
                problems.append(res)
            good[0] += 1

    t = threading.Thread(target=steady)
    t.start()
    try:
        def expect_error(params_or_frame, code, method="generate", raw=False, **kw):
            c = Rpc(server.rpc)
            if raw:
                c.sock.sendall(params_or_frame)
                m = c.read()
                assert m is not None and m[0] in (1, 2), m
                err = m[2] if m[0] == 1 else m[2]
            else:
                err, res = c.call(method, params_or_frame, **kw)
            assert err is not None and err["code"] == code, (params_or_frame, err)
            assert isinstance(err["message"], str) and err["message"]
            return c

        # wrong types and absurd values: an error reply, the connection stays usable
        for params in [{"prompt": 5}, {"prompt": "x", "max_tokens": "ten"}, {"prompt": "x", "temperature": -1},
                       {"prompt": "x", "top_p": 2}, {"prompt": "x", "n": 1000}, {"prompt": "x", "max_tokens": 10**12},
                       {"prompt": "x", "seed": -5}, {"prompt": "x", "stop": ["a"] * 100}, {"tokens": [-1]},
                       {"tokens": [10**9]}, {"prompt": ""}, {}, {"prompt": "x", "bogus": 1},
                       {"prompt": "x", "messages": [{"role": "user", "content": "y"}]},
                       {"messages": [{"role": 1, "content": "y"}]}, {"prompt": "x", "top_k": -7},
                       {"prompt": "x", "temperature": float("nan")}, {"prompt": "x", "": 1}]:
            c = expect_error(params, -32602)
            assert c.ok("health")["status"] == "ok"
            c.close()
        expect_error({}, -32601, method="no.such.method").close()
        expect_error([1, 2, 3], -32602, method="health").close()
        # invalid UTF-8 in the prompt (a str with raw bytes)
        c = Rpc(server.rpc)
        c.sock.sendall(b"\x94\x00\x01\xa8generate\x81\xa6prompt\xa2\xff\xfe")
        m = c.read()
        assert m[0] == 1 and m[2]["code"] == -32602 and "UTF-8" in m[2]["message"]
        c.close()
        # well-formed msgpack that is not a message: error notification, still open
        for frame in [msgpack.packb({"a": 1}), msgpack.packb([0, "x", "health", {}]), msgpack.packb([1, 1, None, 2]),
                      msgpack.packb([0, 1, 5, {}]), msgpack.packb([7, 1, "health", {}])]:
            c = expect_error(frame, -32600, raw=True)
            assert c.ok("health")["status"] == "ok"
            c.close()
        # framing errors: an error notification, then the server hangs up
        for frame, code in [(b"\xc1\xc1\xc1\xc1", -32700), (b"\xdb\xff\xff\xff\xff", 413), (b"\xdd\xff\xff\xff\xff", 413),
                            (b"\x91" * 100 + b"\xc0", -32700),
                            (msgpack.packb([0, 1, "generate", {"prompt": "a" * 70000}]), 413)]:
            c = expect_error(frame, code, raw=True)
            assert c.closed(), frame[:8]
        # a truncated frame, then the client hangs up: no reply, no harm
        c = Rpc(server.rpc)
        c.sock.sendall(msgpack.packb([0, 1, "generate", {"prompt": "abc" * 10}])[:12])
        c.sock.shutdown(socket.SHUT_WR)
        assert c.read() is None
        c.close()
        # garbage to the HTTP port
        host, port = server.http.rsplit(":", 1)
        s = socket.create_connection((host, int(port)))
        s.sendall(b"\x00\x01GARBAGE\r\n\r\n")
        assert b"400" in s.recv(4096).split(b"\r\n")[0]
        s.close()
        # too many in flight on one connection (--max-inflight 8)
        c = Rpc(server.rpc)
        for i in range(12):
            c.send([0, 100 + i, "generate", {"prompt": PROMPTS[0], "max_tokens": 40, "ignore_eos": True}])
        codes = []
        while len(codes) < 12:
            m = c.read()
            if m[0] == 1:
                codes.append(m[2]["code"] if m[2] else 0)
        assert codes.count(429) >= 4 and codes.count(0) >= 1
        c.close()
    finally:
        stop.set()
        t.join(120)
    assert not problems, problems[:2]
    assert good[0] >= 2
    wait_idle(Rpc(server.rpc))


def test_disconnect_mid_stream_frees_blocks(server):
    probe = Rpc(server.rpc)
    before = wait_idle(probe)
    c = Rpc(server.rpc)
    c.send([0, 1, "generate", {"prompt": PROMPTS[2] * 20, "max_tokens": 400, "ignore_eos": True, "stream": True}])
    for _ in range(3):
        assert c.read()[1] == "generate.delta"
    busy = probe.ok("stats")
    assert busy["kv"]["blocks_used"] > 0 and busy["requests"]["live"] == 1
    c.sock.close()
    after = wait_idle(probe)
    assert after["requests"]["cancelled"] == before["requests"]["cancelled"] + 1
    assert after["kv"]["blocks_free"] == after["kv"]["blocks_total"]
    probe.close()


def test_admin_methods(server, tmp_path):
    c = Rpc(server.rpc)
    assert c.call("policy.reload", {"path": "policies/default.lua"})[0]["code"] == 401
    assert c.call("shutdown", {"admin_token": "wrong"})[0]["code"] == 401
    assert c.ok("policy.reload", {"path": "policies/default.lua", "admin_token": "admintok"})["policy"]
    err, _ = c.call("policy.reload", {"source": "return {", "admin_token": "admintok"})
    assert err and err["code"] == -32602
    assert c.ok("generate", {"prompt": PROMPTS[0], "max_tokens": 2})["finish_reason"] == "length"
    assert c.ok("stats")["policy"]["reload_errors"] >= 1
    c.close()


# ---------------------------------------------------------------------------
# Separate servers: auth + limits, SIGTERM drain
# ---------------------------------------------------------------------------
def test_auth_and_connection_limit(serve_bin, tmp_path):
    s = Server(serve_bin, ["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--threads", THREADS,
                           "--kv-memory", "32M", "--auth-token", "sekrit", "--max-connections", "3"], 2, tmp_path)
    try:
        c = Rpc(s.rpc)
        err, _ = c.call("health")
        assert err["code"] == 401 and c.closed()
        c = Rpc(s.rpc)
        assert c.call("auth", {"token": "nope"})[0]["code"] == 401 and c.closed()
        c = Rpc(s.rpc)
        assert c.ok("auth", {"token": "sekrit"}) == {"ok": True}
        assert c.ok("health")["status"] == "ok"
        assert http(s, "GET", "/v1/models")[0] == 401
        assert http(s, "GET", "/v1/models", headers={"Authorization": "Bearer sekrit"})[0] == 200
        assert http(s, "GET", "/health")[0] == 200
        # max 3 connections: c is one; two more fit, the fourth is refused
        extra = [Rpc(s.rpc), Rpc(s.rpc)]
        time.sleep(0.2)
        over = Rpc(s.rpc)
        m = over.read()
        assert m is not None and m[0] == 2 and m[2]["code"] == 503 and over.closed()
        for e in extra:
            e.close()
        c.close()
    finally:
        assert s.stop() == 0


def test_max_queued_caps_samples_server_wide(serve_bin, tmp_path):
    """--max-queued N: at most N samples waiting or running, over all
    connections. One more is refused at once (RPC: 429 naming the limit;
    HTTP: 429 with an OpenAI error body) and nothing else changes; the count
    goes down when a request finishes, is cancelled or its connection closes."""
    for bad, why in (("0", "must be in [1,"), ("abc", "expects an integer")):
        r = subprocess.run([str(serve_bin), "serve", "--max-queued", bad], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "--max-queued" in r.stderr and why in r.stderr, r.stderr
    s = Server(serve_bin, ["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--threads", THREADS,
                           "--kv-memory", "64M", "--max-queued", "2"], 2, tmp_path)
    long = {"prompt": PROMPTS[2], "max_tokens": 4000, "ignore_eos": True, "stream": True}
    short = {"prompt": PROMPTS[0], "max_tokens": 2, "temperature": 0}

    def start_long(c):
        c.send([0, 1, "generate", long])
        m = c.read()
        assert m is not None and m[1] == "generate.delta", m
        return m[2]["id"]

    def refused(c, params=short):
        err, _ = c.call("generate", params)
        return err is not None and err["code"] == 429 and "--max-queued" in err["message"]

    try:
        a, b, c = Rpc(s.rpc), Rpc(s.rpc), Rpc(s.rpc)
        a_id = start_long(a)
        start_long(b)
        assert refused(c)  # the third, on another connection
        status, out = http(s, "POST", "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 1}).encode(),
                           {"Content-Type": "application/json"})
        err = json.loads(out)["error"]
        assert status == 429 and err["type"] == "rate_limit_error" and "--max-queued" in err["message"], out
        # nothing else changes: other methods answer, the two keep streaming
        assert c.ok("health")["status"] == "ok"
        st = c.ok("stats")
        assert st["requests"]["samples"] == 2 and st["requests"]["queued_refused"] == 2
        assert st["config"]["max_queued"] == 2 and st["requests"]["live"] == 2
        assert a.read()[1] == "generate.delta" and b.read()[1] == "generate.delta"
        # cancelled: its place is free once its answer is out
        a.send([0, 2, "cancel", {"id": a_id}])
        got = {}
        while len(got) < 2:
            m = a.read()
            if m[0] == 1:
                got[m[1]] = m
        assert got[2][3] == {"cancelled": True} and got[1][3]["finish_reason"] == "cancelled"
        # finished: a short request fits, and gives its place back when done
        for _ in range(3):
            assert c.ok("generate", short)["finish_reason"] == "length"
        assert refused(c, dict(short, n=2))  # samples count: 1 + 2 > 2
        # connection closed: its request stops counting once the engine let it go
        d = Rpc(s.rpc)
        start_long(d)
        assert refused(c)
        b.close()
        deadline = time.time() + 30
        while refused(c):
            assert time.time() < deadline, c.ok("stats")
            time.sleep(0.05)
        d.close()
        st = wait_idle(c)
        assert st["requests"]["samples"] == 0
        assert c.ok("generate", dict(short, n=2))["usage"]["completion_tokens"] == 4
        for x in (a, c):
            x.close()
    finally:
        assert s.stop() == 0


def test_hundreds_live_cancelled_in_any_order_then_stopped(serve_bin, tmp_path):
    """Hundreds of requests live at once: cancels in shuffled order, mixed with
    requests that finish on their own, each end exactly their request; a
    cancel after the end finds nothing; stopping with hundreds still live
    cancels every one of them, each answered once."""
    s = Server(serve_bin, ["--listen", "127.0.0.1:0", "--threads", THREADS, "--kv-memory", "32M",
                           "--max-inflight", "1024", "--drain-seconds", "0"], 1, tmp_path)
    long = {"prompt": PROMPTS[2], "max_tokens": 4000, "ignore_eos": True}
    short = {"prompt": PROMPTS[0], "max_tokens": 1}

    def replies(c, want):
        got = {}
        while len(got) < want:
            m = c.read()
            assert m is not None, f"closed after {len(got)} of {want} replies"
            if m[0] == 1:
                assert m[1] not in got, f"request {m[1]} answered twice"
                got[m[1]] = m
        return got

    try:
        c = Rpc(s.rpc)
        n = 300
        for i in range(1, n + 1):
            c.send([0, i, "generate", long if i % 3 else short])
        order = [i for i in range(1, n + 1) if i % 3]
        random.Random(7).shuffle(order)
        for i in order:
            c.send([0, 10000 + i, "cancel", {"request_id": i}])
        got = replies(c, n + len(order))
        for i in range(1, n + 1):
            assert got[i][2] is None and got[i][3]["finish_reason"] == ("cancelled" if i % 3 else "length"), got[i]
        assert all(got[10000 + i][3] == {"cancelled": True} for i in order)
        assert c.ok("cancel", {"request_id": order[0]}) == {"cancelled": False}
        assert wait_idle(c)["requests"]["samples"] == 0
        # stop with 200 in the engine: --drain-seconds 0 cancels them at once
        for i in range(1, 201):
            c.send([0, 20000 + i, "generate", long])
        deadline = time.time() + 60
        while sum(c.ok("stats")["queues"].values()) < 200:
            assert time.time() < deadline, c.ok("stats")
            time.sleep(0.05)
        s.proc.send_signal(signal.SIGTERM)
        got = replies(c, 200)
        assert all(m[2] is None and m[3]["finish_reason"] == "cancelled" for m in got.values())
        c.close()
        # let it exit on that one signal: a second one during teardown (slow
        # under ASan) would kill it, which is the documented "skip the wait"
        assert s.proc.wait(timeout=120) == 0, s.stderr()[-2000:]
    finally:
        assert s.stop() == 0, s.stderr()[-2000:]


def test_slow_client_is_cut_off(serve_bin, tmp_path):
    """A client that never reads: past --write-buffer its reads stop; past
    --slow-client-seconds its requests are cancelled and it is closed. (A Unix
    socket: its kernel buffer is fixed, where TCP's grows to megabytes.)"""
    sock = str(tmp_path / "slow.sock")
    s = Server(serve_bin, ["--listen", "127.0.0.1:0", "--listen", f"unix:{sock}", "--threads", THREADS,
                           "--kv-memory", "32M", "--write-buffer", "4096", "--slow-client-seconds", "1"], 2, tmp_path)
    try:
        slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        slow.connect(sock)
        slow.sendall(msgpack.packb([0, 1, "generate", {"prompt": PROMPTS[0], "max_tokens": 2000, "ignore_eos": True,
                                                        "stream": True, "logprobs": 20, "n": 8}]))
        probe = Rpc(s.rpc)
        deadline = time.time() + 90
        while probe.ok("stats")["connections"]["slow_closed"] == 0:
            assert time.time() < deadline, f"the slow client was never closed: {probe.ok('stats')}"
            time.sleep(0.2)
        st = wait_idle(probe)
        assert st["requests"]["cancelled"] == 8 and st["requests"]["length"] == 0
        probe.close()
        slow.close()
    finally:
        assert s.stop() == 0


def test_sigterm_drains_then_exits_zero(serve_bin, tmp_path):
    s = Server(serve_bin, ["--listen", "127.0.0.1:0", "--threads", THREADS, "--kv-memory", "32M",
                           "--drain-seconds", "60"], 1, tmp_path)
    c = Rpc(s.rpc)
    c.send([0, 1, "generate", {"prompt": PROMPTS[0], "max_tokens": 48, "ignore_eos": True, "stream": True}])
    assert c.read()[1] == "generate.delta"
    s.proc.send_signal(signal.SIGTERM)
    res = None
    while res is None:
        m = c.read()
        assert m is not None, "connection closed before the request finished"
        if m[0] == 1:
            res = m
    assert res[2] is None and res[3]["finish_reason"] == "length" and len(res[3]["tokens"]) == 48
    assert s.proc.wait(timeout=60) == 0
    assert "draining" in s.stderr()
    with pytest.raises(OSError):
        Rpc(s.rpc).ok("health")


def test_spec_tokens_serve_the_same_text(server, serve_bin, tmp_path):
    """serve --spec-tokens: greedy streams and results are the text a server
    without speculation gives; stats count the drafts."""
    prompts = ["one two three four five six seven eight nine ten one two three four five six",
               "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
               PROMPTS[0]]
    for args, why in ((["--spec-tokens", "17"], "--spec-tokens must be in [0, 16]"),
                      (["--spec-tokens", "2", "--spec-ngram-min", "5", "--spec-ngram-max", "3"], "spec_ngram_min"),
                      (["--spec-disable-batch", "-2"], "--spec-disable-batch"),
                      (["--eagle-idle-steps", "-1"], "--eagle-idle-steps must be in [0,"),
                      # -1 is a number like any other, not "not given"
                      (["--spec-disable-batch", "-1"], "--spec-disable-batch must be in [0,"),
                      (["--block-size", "-1"], "--block-size must be in [1,")):
        r = subprocess.run([str(serve_bin), "serve", "--listen", "127.0.0.1:0", *args], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode != 0 and why in r.stderr, (args, r.stderr)
    s = Server(serve_bin, ["--listen", "127.0.0.1:0", "--threads", THREADS, "--kv-memory", "32M",
                           "--spec-tokens", "4"], 1, tmp_path)
    try:
        ref = Rpc(server.rpc)
        for p in prompts:
            want = ref.ok("generate", {"prompt": p, "max_tokens": 40, "temperature": 0, "ignore_eos": True})
            text, toks, got = stream(s.rpc, {"prompt": p, "max_tokens": 40, "temperature": 0, "ignore_eos": True})
            assert got["tokens"] == want["tokens"] and got["text"] == want["text"] == text and toks == got["tokens"]
        eng = Rpc(s.rpc).ok("stats")["engine"]
        assert eng["spec_drafted"] > 0 and 0 < eng["spec_accepted"] <= eng["spec_drafted"], eng
        ref.close()
    finally:
        assert s.stop() == 0, s.stderr()[-2000:]


def test_shutdown_method(serve_bin, tmp_path):
    s = Server(serve_bin, ["--listen", "127.0.0.1:0", "--threads", THREADS, "--kv-memory", "32M",
                           "--admin-token", "tok"], 1, tmp_path)
    c = Rpc(s.rpc)
    assert c.call("shutdown", {})[0]["code"] == 401
    assert c.ok("shutdown", {"admin_token": "tok"}) == {"ok": True}
    assert s.proc.wait(timeout=60) == 0


# ---------------------------------------------------------------------------
# The Lua client, the examples, the REPL
# ---------------------------------------------------------------------------
def test_lua_client(server, serve_bin, tmp_path):
    script = tmp_path / "client_test.lua"
    script.write_text(f"""
local client = require("luainfer.client")
local c = assert(client.connect("{server.rpc}"))
local r = assert(c:generate{{ prompt = {json.dumps(PROMPTS[0])}, max_tokens = 6, temperature = 0 }})
local parts = {{}}
local s = assert(c:generate{{ prompt = {json.dumps(PROMPTS[0])}, max_tokens = 6, temperature = 0,
                             on_delta = function(d) parts[#parts + 1] = d.text end }})
assert(table.concat(parts) == s.text and s.text == r.text, "stream differs")
local toks = assert(c:tokenize("hello world"))
assert(c:detokenize(toks):find("hello world", 1, true))
local _, err = c:call("no.such.method")
assert(err and err.code == -32601, "expected an error")
assert(c:stats().kv.blocks_total > 0)
-- an on_delta that raises: the error goes on, the request is cancelled on
-- the server, and the next generate sees none of its deltas
local seen = 0
local ok, e = pcall(c.generate, c, {{ prompt = {json.dumps(PROMPTS[0])}, max_tokens = 200, temperature = 0,
                                     ignore_eos = true, on_delta = function(d) seen = seen + 1; error("stop here") end }})
assert(not ok and tostring(e):find("stop here"), "the on_delta error is raised")
local parts2 = {{}}
local t = assert(c:generate{{ prompt = {json.dumps(PROMPTS[0])}, max_tokens = 6, temperature = 0,
                             on_delta = function(d) parts2[#parts2 + 1] = d.text end }})
assert(table.concat(parts2) == t.text and t.text == r.text, "the next generate sees only its own deltas")
assert(c:stats().requests.live == 0, "the abandoned generate was cancelled")
c:close()
local u = assert(client.connect("{server.unix}"))
assert(u:health().status == "ok")
print("LUA-CLIENT-OK " .. r.text:gsub("\\n", " "))
""")
    r = subprocess.run([str(serve_bin), "run", str(script)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0 and "LUA-CLIENT-OK" in r.stdout, r.stderr


def test_python_example(server):
    r = subprocess.run([sys.executable, str(REPO / "examples" / "python_client.py"), "--addr", server.rpc,
                        "--max-tokens", "8", PROMPTS[0]], capture_output=True, text=True, timeout=120)
    ref = Rpc(server.rpc).ok("generate", {"prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(ref["text"]) and "[length]" in r.stdout


def test_c_example(server, tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc or subprocess.run(["pkg-config", "--exists", "msgpack"]).returncode != 0:
        pytest.skip("no C compiler or msgpack-c pkg-config")
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "msgpack"], capture_output=True, text=True).stdout.split()
    exe = tmp_path / "client"
    b = subprocess.run([cc, "-Wall", "-Werror", str(REPO / "examples" / "client.c"), *flags, "-o", str(exe)],
                       capture_output=True, text=True)
    assert b.returncode == 0, b.stderr
    host, port = server.rpc.rsplit(":", 1)
    r = subprocess.run([str(exe), host, port, PROMPTS[0], "8"], capture_output=True, text=True, timeout=120)
    ref = Rpc(server.rpc).ok("generate", {"prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0})
    assert r.returncode == 0 and r.stdout.startswith(ref["text"]) and "[finish: length]" in r.stdout, r.stderr


class Pty:
    """A program on a pseudo-terminal: send keys, wait for text."""

    def __init__(self, argv, env):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.chdir(REPO)
            os.execve(argv[0], argv, env)
        self.out = b""
        self.log = b""  # everything, for failure messages

    def send(self, s):
        os.write(self.fd, s.encode())

    def prompt(self, s):
        """Waits for the "> " prompt, then types s. (A pause first: libedit
        reads type-ahead that is already pending in cooked mode, where a
        Ctrl-D is the terminal's EOF, not a key.)"""
        self.expect("> ")
        time.sleep(0.15)
        self.send(s)

    def expect(self, needle, timeout=120):
        deadline = time.time() + timeout
        while needle.encode() not in self.out:
            r, _, _ = select.select([self.fd], [], [], max(0, deadline - time.time()))
            if not r:
                raise AssertionError(f"timed out waiting for {needle!r}; got:\n{self.out.decode(errors='replace')[-2000:]}")
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                raise AssertionError(f"EOF waiting for {needle!r}; got:\n{self.out.decode(errors='replace')[-2000:]}")
            self.out += data
            self.log += data
        i = self.out.index(needle.encode()) + len(needle)
        seen, self.out = self.out[:i], self.out[i:]
        return seen.decode(errors="replace")

    def wait(self, timeout=60, resend_eof=True):
        deadline = time.time() + timeout
        resend_at = time.time() + 10
        while time.time() < deadline:
            if resend_eof and time.time() > resend_at:
                # a key typed while the tty switches modes can be dropped: Ctrl-D once more
                resend_at = deadline
                try:
                    self.send("\x04")
                except OSError:
                    pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            try:
                r, _, _ = select.select([self.fd], [], [], 0.1)
                if r:
                    data = os.read(self.fd, 65536)
                    self.out += data
                    self.log += data
            except OSError:
                pass
        stacks = ""
        if shutil.which("gdb"):
            stacks = subprocess.run(["gdb", "-p", str(self.pid), "-batch", "-ex", "thread apply all bt"],
                                    capture_output=True, text=True, timeout=60).stdout[-4000:]
        os.kill(self.pid, signal.SIGKILL)
        raise AssertionError(f"the REPL did not exit; session:\n{self.log.decode(errors='replace')[-3000:]!r}\n{stacks}")


def test_repl_through_a_pty(serve_bin, tmp_path, server):
    env = dict(os.environ, TERM="xterm", LUAINFER_HISTORY=str(tmp_path / "hist"), HOME=str(tmp_path))
    p = Pty([str(serve_bin), "repl", "--threads", THREADS, "--kv-memory", "32M"], env)
    p.expect("help() lists")
    # each line is typed at a prompt: keys sent before libedit enters raw mode may be flushed
    p.prompt("engine:info()\r")
    info = p.expect("threads")
    assert "n_vocab = " in info and "architecture = \"llama\"" in info
    p.prompt(f'generate("{PROMPTS[0]}", {{max_tokens = 4}})\r')
    p.expect("Paris")
    p.prompt("engine:inf\t")  # Tab completes the method name: "engine:inf()" would fail
    time.sleep(0.3)
    p.send("()\r")
    assert "attempt to call" not in p.expect("architecture")
    p.prompt("x = {1, 2, {a = 'b'}}\r")
    p.prompt("x\r")
    p.expect('a = "b"')
    p.prompt("for i = 1, 2 do\r")
    p.expect(">> ")
    p.send("print('loop', i) end\r")
    p.expect("loop\t2")
    p.prompt("help()\r")
    p.expect("engine:add")
    p.prompt("\x04")  # Ctrl-D
    assert p.wait() == 0
    assert "engine:info()" in (tmp_path / "hist").read_text()

    # --connect: the same prompt bound to a server
    p = Pty([str(serve_bin), "repl", "--connect", server.rpc], env)
    p.expect("connected to")
    p.prompt("server:health().status\r")
    p.expect('"ok"')
    p.prompt(f'generate("{PROMPTS[0]}", {{max_tokens = 4}}).finish_reason\r')
    p.expect('"length"')
    p.prompt("\x04")
    assert p.wait() == 0
