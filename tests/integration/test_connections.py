"""Connection hardening of `luainfer serve` (issue 18, "Connections"), with
real sockets against the real model.

- slowloris: a request head trickled in is answered 408 and closed after
  --header-timeout (counted from its first byte, so trickling does not
  extend it); a body left half-sent after --body-timeout; a msgpack frame
  left half-sent the same; an idle keep-alive after --idle-timeout, and a
  request that takes longer than all of them is not cut (a request being
  served has no read timeout);
- a flood of idle connections past --max-connections: a new client closes
  the longest idle one and is served (without that it was refused);
- --max-connections-per-ip: the next connection from that address is
  refused with a clear 429, another address is still served;
- a client that streams and never reads: other clients are served in full
  meanwhile, its unsent bytes stop its reads, and it is cut off after
  --slow-client-seconds.

Timeouts are set short by flags so the tests are fast; the waits below are
upper bounds for something to happen, never measurements.
"""

import json
import socket
import threading
import time

import msgpack
import pytest

from test_server import PROMPTS, THREADS, Rpc, Server, http, serve_bin, wait_idle  # noqa: F401 (fixture)


def hostport(addr):
    host, port = addr.rsplit(":", 1)
    return host, int(port)


def recv_until_closed(sock, timeout):
    """Everything the server sends until it closes -> (bytes, closed)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while True:
            d = sock.recv(65536)
            if not d:
                return data, True
            data += d
    except (ConnectionResetError, BrokenPipeError):
        return data, True
    except socket.timeout:
        return data, False


def trickle(sock, payload, every, limit):
    """Sends payload one byte per `every` seconds until the server closes the
    connection or `limit` seconds pass -> (bytes received, closed, bytes sent)."""
    sock.settimeout(every)
    got, sent, deadline = b"", 0, time.time() + limit
    while time.time() < deadline and sent < len(payload):
        try:
            sock.send(payload[sent:sent + 1])
            sent += 1
        except (BrokenPipeError, ConnectionResetError):
            return got, True, sent
        try:
            d = sock.recv(65536)
            if not d:
                return got, True, sent
            got += d
        except socket.timeout:
            pass
        except ConnectionResetError:
            return got, True, sent
    more, closed = recv_until_closed(sock, 5)
    return got + more, closed, sent


@pytest.fixture(scope="module")
def tserver(serve_bin, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("conn")
    s = Server(serve_bin, ["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--threads", THREADS,
                           "--kv-memory", "32M", "--header-timeout", "1", "--body-timeout", "1.5",
                           "--idle-timeout", "1", "--rpc-idle-timeout", "2"], 2, tmp)
    yield s
    assert s.stop() == 0, s.stderr()[-2000:]


def test_slowloris_head_closed_after_header_timeout(tserver):
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"X-Padding: " + b"a" * 200 + b"\r\nContent-Length: 2\r\n\r\n{}")
    sock = socket.create_connection(hostport(tserver.http))
    got, closed, sent = trickle(sock, head, 0.05, 20)
    sock.close()
    # the head needs ~13 s at this pace; the server gave up after --header-timeout 1
    assert closed and sent < len(head), (closed, sent)
    assert got.startswith(b"HTTP/1.1 408 "), got[:200]
    body = json.loads(got.split(b"\r\n\r\n", 1)[1])
    assert "--header-timeout" in body["error"]["message"]


def test_half_sent_body_and_frame_closed_after_body_timeout(tserver):
    sock = socket.create_connection(hostport(tserver.http))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\": ")
    got, closed = recv_until_closed(sock, 20)
    sock.close()
    assert closed and got.startswith(b"HTTP/1.1 408 "), got[:200]
    assert b"--body-timeout" in got
    # msgpack-RPC: a frame that never completes
    c = Rpc(tserver.rpc, timeout=20)
    frame = msgpack.packb([0, 1, "generate", {"prompt": "x" * 50}])
    c.sock.sendall(frame[:20])
    m = c.read()
    assert m is not None and m[0] == 2 and m[2]["code"] == 408 and "--body-timeout" in m[2]["message"], m
    assert c.closed()


def test_idle_connections_closed_but_busy_ones_kept(tserver):
    # HTTP keep-alive: one request served, then idle past --idle-timeout: closed, silently
    sock = socket.create_connection(hostport(tserver.http))
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    got, closed = recv_until_closed(sock, 20)
    sock.close()
    assert got.startswith(b"HTTP/1.1 200 ") and got.count(b"HTTP/1.1") == 1 and closed, got[:300]
    # a fresh HTTP connection that sends nothing: closed after --header-timeout, nothing sent
    sock = socket.create_connection(hostport(tserver.http))
    got, closed = recv_until_closed(sock, 20)
    sock.close()
    assert closed and got == b""
    # msgpack-RPC between calls: --rpc-idle-timeout, with a notification saying so
    c = Rpc(tserver.rpc, timeout=20)
    assert c.ok("health")["status"] == "ok"
    m = c.read()
    assert m is not None and m[0] == 2 and m[2]["code"] == 408 and "--rpc-idle-timeout" in m[2]["message"], m
    assert c.closed()
    # a request served for longer than every timeout is not cut: no read timeout while busy
    # (300 tokens take seconds here, past the 1-2 s timeouts)
    c = Rpc(tserver.rpc, timeout=120)
    err, res = c.call("generate", {"prompt": PROMPTS[1], "max_tokens": 300, "ignore_eos": True,
                                   "temperature": 0, "stream": True})
    assert err is None and res["finish_reason"] == "length" and len(res["tokens"]) == 300, err
    # and an HTTP stream likewise
    sock = socket.create_connection(hostport(tserver.http))
    body = json.dumps({"prompt": PROMPTS[1], "max_tokens": 300, "ignore_eos": True, "stream": True,
                       "temperature": 0}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    got, closed = recv_until_closed(sock, 120)
    sock.close()
    assert b"data: [DONE]" in got and b'"finish_reason":"length"' in got, got[-300:]
    st = Rpc(tserver.rpc).ok("stats")["connections"]
    assert st["timed_out"] >= 5, st


def test_flood_of_idle_connections_leaves_room(serve_bin, tmp_path):
    """300 connections that never send a byte (plus some with half a head)
    against --max-connections 256: a new client is still served. Eviction
    is what makes room here (the timeouts are long), so this fails when a
    full server refuses new clients. The two newcomers close the two
    longest idle connections, each told why, before an older one with half
    a request sent: the connections are opened in that order (the
    msgpack-RPC ones before the HTTP ones, so that the two listeners'
    accept order does not matter). Until session 37 the server compared
    ages offset by 1e12, to a quarter of a millisecond, and a flood accepted
    within that lost an arbitrary one of its oldest."""
    s = Server(serve_bin, ["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--threads", THREADS,
                           "--kv-memory", "32M", "--header-timeout", "600", "--body-timeout", "600",
                           "--idle-evict-seconds", "0.5"], 2, tmp_path)
    flood = []
    try:
        half = socket.create_connection(hostport(s.http))  # the oldest, but with half a head sent
        half.sendall(b"GET /health HTTP/1.1\r\nHo")
        flood.append(half)
        time.sleep(0.05)
        rpc = [socket.create_connection(hostport(s.rpc)) for _ in range(150)]
        flood += rpc
        time.sleep(0.3)
        for i in range(149):
            f = socket.create_connection(hostport(s.http))
            if i % 5 == 0:
                f.sendall(b"GET /health HTTP/1.1\r\nHo")  # half a head
            flood.append(f)
        time.sleep(1.0)  # older than --idle-evict-seconds: now they may be closed for newcomers
        openai = pytest.importorskip("openai")
        client = openai.OpenAI(base_url=f"http://{s.http}/v1", api_key="unused", max_retries=0, timeout=60)
        c = client.completions.create(model="m", prompt=PROMPTS[0], max_tokens=4, temperature=0)
        assert c.choices[0].finish_reason == "length"
        r = Rpc(s.rpc)
        res = r.ok("generate", {"prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0})
        assert res["text"] == c.choices[0].text
        st = r.ok("stats")["connections"]
        assert st["evicted"] == 2 and st["open"] <= 256, st
        # the two longest idle msgpack-RPC clients were closed and told why
        for j in (0, 1):
            got, closed = recv_until_closed(rpc[j], 2)
            assert closed and got, (j, got, closed)
            n = msgpack.unpackb(got)
            assert n[0] == 2 and n[2]["code"] == 503 and "make room" in n[2]["message"], (j, n)
        # and no other: the next one, and the older half-sent request, are still open
        for f in (rpc[2], half):
            got, closed = recv_until_closed(f, 0.05)
            assert not closed and not got, (got, closed)
    finally:
        for f in flood:
            f.close()
        assert s.stop() == 0, s.stderr()[-2000:]


def test_per_ip_connection_limit(serve_bin, tmp_path):
    s = Server(serve_bin, ["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--threads", THREADS,
                           "--kv-memory", "32M", "--max-connections-per-ip", "3"], 2, tmp_path)
    try:
        held = [Rpc(s.rpc) for _ in range(3)]
        over = Rpc(s.rpc)
        m = over.read()
        assert m is not None and m[0] == 2 and m[2]["code"] == 429, m
        assert "127.0.0.1" in m[2]["message"] and "--max-connections-per-ip" in m[2]["message"]
        assert over.closed()
        h = socket.create_connection(hostport(s.http))  # HTTP says so too (read before sending: no reset)
        got, closed = recv_until_closed(h, 20)
        h.close()
        assert closed and got.startswith(b"HTTP/1.1 429 ") and b"per address" in got, got[:300]
        # another address is not limited by this one's connections
        try:
            other = socket.create_connection(hostport(s.rpc), source_address=("127.0.0.2", 0))
        except OSError as e:
            pytest.skip(f"cannot connect from 127.0.0.2 ({e})")
        other.sendall(msgpack.packb([0, 1, "health", {}]))
        reply = msgpack.unpackb(recv_one(other))
        assert reply[0] == 1 and reply[2] is None and reply[3]["status"] == "ok", reply
        other.close()
        # a slot freed is usable again
        held.pop().close()
        time.sleep(0.3)
        assert Rpc(s.rpc).ok("health")["status"] == "ok"
        assert held[0].ok("stats")["connections"]["refused_per_ip"] == 2
    finally:
        assert s.stop() == 0, s.stderr()[-2000:]


def recv_one(sock, timeout=30):
    sock.settimeout(timeout)
    u = msgpack.Unpacker(raw=False)
    while True:
        d = sock.recv(65536)
        assert d, "closed"
        u.feed(d)
        for m in u:
            return msgpack.packb(m)


def test_slow_reader_does_not_starve_others(serve_bin, tmp_path):
    """An HTTP client streams many tokens with a small receive buffer and
    never reads. While it is stalled (over --write-buffer: the server stops
    reading it and queues its output), other clients get complete, correct
    answers; when it goes away its request is cancelled. (Being cut off
    after --slow-client-seconds is test_server.py's test_slow_client_is_cut_off.)"""
    sock = str(tmp_path / "http.sock")  # a Unix socket: fixed kernel buffers, where TCP's grow to megabytes
    s = Server(serve_bin, ["--listen", "127.0.0.1:0", "--http", f"unix:{sock}", "--threads", THREADS,
                           "--kv-memory", "32M", "--write-buffer", "4096", "--slow-client-seconds", "600"], 2, tmp_path)
    try:
        probe = Rpc(s.rpc)
        ref = probe.ok("generate", {"prompt": PROMPTS[2], "max_tokens": 12, "temperature": 0})
        slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
        slow.connect(sock)
        body = json.dumps({"prompt": PROMPTS[0], "max_tokens": 4000, "ignore_eos": True, "stream": True,
                           "logprobs": 5, "n": 4}).encode()
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        deadline = time.time() + 60
        stalled = False
        while time.time() < deadline:  # wait until the server has stopped reading it (over --write-buffer)
            st = probe.ok("stats")
            if st["connections"]["slow_closed"]:
                break
            if st["connections"]["paused"] >= 1:
                stalled = True
                break
            time.sleep(0.05)
        assert stalled, f"the slow reader never went over --write-buffer: {st['connections']}"
        served = []
        for _ in range(3):
            c = Rpc(s.rpc)
            served.append(c.ok("generate", {"prompt": PROMPTS[2], "max_tokens": 12, "temperature": 0}))
            c.close()
        st = probe.ok("stats")
        assert all(r["tokens"] == ref["tokens"] for r in served)
        assert st["connections"]["paused"] >= 1 and st["requests"]["live"] >= 1, "the slow reader is still stalled"
        slow.close()
        st = wait_idle(probe)
        assert st["requests"]["cancelled"] == 4 and st["connections"]["slow_closed"] == 0, st["requests"]
    finally:
        assert s.stop() == 0, s.stderr()[-2000:]
