#!/usr/bin/env python3
"""bench_soak.py — several minutes of everything at once against one server
(issue 18, "how it is checked").

    .venv/bin/python bench/bench_soak.py [--bin PATH] [--duration 300] [--kv-memory 6M]

One `luainfer serve` with a small KV budget (so preemption happens), and in
parallel threads for --duration seconds:
  - witness: greedy requests (msgpack-RPC and HTTP in turn) whose tokens
    must equal the solo run taken before the load starts, token for token;
  - load: clients keeping several requests of 16..96 tokens (ignore_eos)
    in flight: KV pressure;
  - policies: every hostile policy in tests/policies/hostile hot-reloaded in
    turn (the isolated default mode), each followed by a good one from
    policies/ (some reloads are refused by design: counted);
  - bad clients: garbage and truncated msgpack, a frame declaring 4 GiB,
    10^5-deep nesting, garbage HTTP, a huge Content-Length, half-sent
    bodies and heads left hanging (slowloris), an HTTP head sent byte by
    byte;
  - disconnects: streams opened and dropped mid-stream, in bursts;
  - cancels: streamed requests cancelled after their first delta.
Prints RSS at start and end (and the peak), every counter of `stats` and
`/metrics` at the end (with the change since the start), the witness
mismatches, requests lost (sent, never answered), server crashes, and the
exit status of SIGTERM. Exits 1 when a mismatch, a lost request, a crash or
an unclean stop happened.
"""
import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time

import msgpack

import results  # bench/results.py: --json, --plot, progress

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOSTILE = os.path.join(ROOT, "tests", "policies", "hostile")
GOOD = ["default", "fair", "sjf", "priority", "edf", "hrrn", "lfu", "lof", "lpm", "slo", "static"]
WITNESS = ["The capital of France is", "Once upon a time", "def fibonacci(n):"]
LOAD = ["Write a story about a dragon.", "List the planets of the solar system and describe each.",
        "Explain how a compiler works, step by step.", "The history of Rome begins", "Dear diary, today",
        "Here is a recipe for bread:", "A poem about the sea:", "Q: What is entropy?\nA:"]
WITNESS_TOKENS = 24
ADMIN = "soak"
TIMEOUT = 120  # a well-formed request unanswered this long is lost


class Counts:
    def __init__(self):
        self.lock = threading.Lock()
        self.c = {}

    def add(self, key, n=1):
        with self.lock:
            self.c[key] = self.c.get(key, 0) + n

    def get(self, key):
        with self.lock:
            return self.c.get(key, 0)


class Rpc:
    def __init__(self, addr, timeout=TIMEOUT):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.unpacker = msgpack.Unpacker(raw=False)
        self.next_id = 1

    def send(self, obj):
        self.sock.sendall(msgpack.packb(obj))

    def read(self):
        while True:
            for m in self.unpacker:
                return m
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed by the server")
            self.unpacker.feed(data)

    def call(self, method, params=None):
        msgid = self.next_id
        self.next_id += 1
        self.send([0, msgid, method, params or {}])
        while True:
            m = self.read()
            if m[0] == 1 and m[1] == msgid:
                return m[2], m[3]

    def close(self):
        self.sock.close()


def http(addr, method, path, body=None, timeout=TIMEOUT):
    """-> (status, body bytes); a minimal client (Content-Length or chunked)."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        data = b"" if body is None else json.dumps(body).encode()
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        buf = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            buf += d
    head, _, rest = buf.partition(b"\r\n\r\n")
    if not head:
        raise ConnectionError("no response")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        out = b""
        while rest:
            size, _, rest = rest.partition(b"\r\n")
            n = int(size, 16)
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2:]
        rest = out
    return status, rest


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def flatten(obj, prefix=""):
    out = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        out[prefix[:-1]] = obj
    return out


def metrics(addr):
    status, body = http(addr, "GET", "/metrics")
    out = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, _, val = line.rpartition(" ")
            try:
                out[name] = float(val)
            except ValueError:
                pass
    return out


# ---- the threads ---------------------------------------------------------------------------

def witness(srv, ref, stop, n):
    i = 0
    while not stop.is_set():
        k = i % len(WITNESS)
        body = {"prompt": WITNESS[k], "max_tokens": WITNESS_TOKENS, "temperature": 0, "ignore_eos": True}
        n.add("witness.sent")
        try:
            if i % 2 == 0:
                c = Rpc(srv.rpc)
                err, res = c.call("generate", body)
                c.close()
                if err:
                    n.add("witness.refused")
                    n.add(f"witness.refused: {err.get('message', '')[:60]}")
                else:
                    n.add("witness.ok")
                    if res["tokens"] != ref[k]:
                        n.add("witness.mismatches")
            else:
                status, out = http(srv.http, "POST", "/v1/completions", body)
                if status != 200:
                    n.add("witness.refused")
                    n.add(f"witness.refused: HTTP {status}")
                else:
                    n.add("witness.ok")
                    text = json.loads(out)["choices"][0]["text"]
                    if text != srv.ref_text[k]:
                        n.add("witness.mismatches")
        except (OSError, ConnectionError, ValueError, KeyError):
            n.add("witness.lost")
        i += 1


def load(srv, stop, n, seed, inflight=4):
    rng = random.Random(seed)
    while not stop.is_set():
        pending = set()
        try:
            c = Rpc(srv.rpc)
            for _ in range(20):
                while len(pending) < inflight and not stop.is_set():
                    msgid = c.next_id
                    c.next_id += 1
                    c.send([0, msgid, "generate", {"prompt": rng.choice(LOAD), "max_tokens": rng.randint(16, 96),
                                                   "temperature": 0.8, "seed": rng.randint(0, 1 << 30),
                                                   "ignore_eos": True}])
                    pending.add(msgid)
                    n.add("load.sent")
                if not pending:
                    break
                m = c.read()
                if m[0] == 1 and m[1] in pending:
                    pending.discard(m[1])
                    n.add("load.refused" if m[2] else "load.ok")
            # the rest: wait for them all (nothing may be lost)
            while pending:
                m = c.read()
                if m[0] == 1 and m[1] in pending:
                    pending.discard(m[1])
                    n.add("load.refused" if m[2] else "load.ok")
            c.close()
        except (OSError, ConnectionError):
            n.add("load.lost", len(pending))


def policies(srv, stop, n, period):
    hostile = sorted(f for f in os.listdir(HOSTILE) if f.endswith(".lua"))
    i = 0
    while not stop.wait(period):
        path = os.path.join(HOSTILE, hostile[i % len(hostile)]) if i % 2 == 0 else \
            os.path.join(ROOT, "policies", GOOD[(i // 2) % len(GOOD)] + ".lua")
        try:
            c = Rpc(srv.rpc, timeout=60)
            err, _ = c.call("policy.reload", {"path": path, "admin_token": ADMIN})
            c.close()
            kind = "hostile" if i % 2 == 0 else "good"
            n.add(f"reload.{kind}.{'refused' if err else 'ok'}")
        except (OSError, ConnectionError):
            n.add("reload.lost")
        i += 1
    try:  # end on the default policy
        c = Rpc(srv.rpc, timeout=60)
        c.call("policy.reload", {"path": os.path.join(ROOT, "policies", "default.lua"), "admin_token": ADMIN})
        c.close()
    except (OSError, ConnectionError):
        n.add("reload.lost")


def raw_send(addr, data, linger=0.0, read=True):
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(data)
        if linger:
            time.sleep(linger)
        if read:
            try:
                s.recv(4096)
            except OSError:
                pass


def bad_clients(srv, stop, n, seed):
    rng = random.Random(seed)
    deep = b"\x91" * 100000 + b"\xc0"
    attacks = [
        ("garbage msgpack", lambda: raw_send(srv.rpc, bytes(rng.randrange(256) for _ in range(200)))),
        ("truncated frame", lambda: raw_send(srv.rpc, msgpack.packb([0, 1, "generate", {"prompt": "x" * 50}])[:-20],
                                             read=False)),
        ("4 GiB str header", lambda: raw_send(srv.rpc, b"\x94\x00\x01\xdb\xff\xff\xff\xf0abc")),
        ("deep nesting", lambda: raw_send(srv.rpc, b"\x94\x00\x01\xa8generate" + deep)),
        ("wrong types", lambda: raw_send(srv.rpc, msgpack.packb([0, 1, "generate", {"prompt": 5, "max_tokens": "x"}]))),
        ("garbage HTTP", lambda: raw_send(srv.http, b"\x16\x03\x01 not http at all\r\n\r\n")),
        ("huge Content-Length", lambda: raw_send(srv.http, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                                           b"Content-Length: 99999999999\r\n\r\n{")),
        ("half-sent body", lambda: raw_send(srv.http, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                                      b"Content-Length: 500\r\n\r\n{\"prompt\": \"x", linger=0.5,
                                            read=False)),
        ("half-sent head", lambda: raw_send(srv.http, b"GET /health HTTP/1.1\r\nHost:", linger=0.5, read=False)),
        ("bad JSON", lambda: http(srv.http, "POST", "/v1/completions", None, timeout=10)),
    ]

    def slowloris():
        host, port = srv.http.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            for b in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: aaaa":
                if stop.is_set():
                    return
                s.sendall(bytes([b]))
                time.sleep(0.05)
    attacks.append(("slowloris", slowloris))
    while not stop.is_set():
        name, fn = rng.choice(attacks)
        try:
            fn()
        except (OSError, ConnectionError, ValueError):
            pass  # the server may close on us: that is its answer
        n.add("bad." + name)
        time.sleep(0.02)


def disconnects(srv, stop, n, seed):
    rng = random.Random(seed)
    while not stop.wait(0.3):
        socks = []
        for _ in range(rng.randint(4, 16)):
            try:
                c = Rpc(srv.rpc, timeout=10)
                c.send([0, 1, "generate", {"prompt": rng.choice(LOAD), "max_tokens": 200, "stream": True,
                                           "ignore_eos": True}])
                socks.append(c)
            except OSError:
                n.add("disconnect.connect_failed")
        for c in socks:
            try:
                if rng.random() < 0.5:
                    c.read()  # drop mid-stream, after the first delta
            except (OSError, ConnectionError):
                pass
            c.close()
            n.add("disconnect.dropped")


def cancels(srv, stop, n, seed):
    rng = random.Random(seed)
    while not stop.is_set():
        try:
            c = Rpc(srv.rpc)
            c.send([0, 1, "generate", {"prompt": rng.choice(LOAD), "max_tokens": 300, "stream": True,
                                       "ignore_eos": True}])
            n.add("cancel.sent")
            m = c.read()  # the first delta (or the answer, if it was quick)
            c.send([0, 2, "cancel", {"request_id": 1}])
            answered = set()
            while True:
                if m[0] == 1:
                    answered.add(m[1])
                    if m[1] == 1:
                        fr = (m[3] or {}).get("finish_reason") if not m[2] else "error"
                        n.add(f"cancel.finish_{fr}")
                if answered == {1, 2}:
                    break
                m = c.read()
            c.close()
        except (OSError, ConnectionError):
            n.add("cancel.lost")
        time.sleep(0.1)


# ---- main ----------------------------------------------------------------------------------

class Server:
    def __init__(self, binary, args):
        self.proc = subprocess.Popen([binary, "serve", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     cwd=ROOT, text=True)
        self.rpc = self.http = None
        deadline = time.time() + 180
        while (self.rpc is None or self.http is None) and time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise SystemExit(f"server did not start: {self.proc.stderr.read()[-3000:]}")
            if "listening on" in line:
                addr, proto = line.split("listening on ")[1].strip().rsplit(" ", 1)
                if proto.strip("()") == "http":
                    self.http = addr
                else:
                    self.rpc = addr
        self.stderr_tail = []
        threading.Thread(target=self._drain, args=(self.proc.stdout, None), daemon=True).start()
        threading.Thread(target=self._drain, args=(self.proc.stderr, self.stderr_tail), daemon=True).start()

    def _drain(self, f, keep):
        for line in f:
            if keep is not None:
                keep.append(line)
                del keep[:-200]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "luainfer"))
    ap.add_argument("--duration", type=float, default=300, help="seconds of load")
    ap.add_argument("--kv-memory", default="6M", help="the server's KV budget (small: preemption)")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--load-clients", type=int, default=2)
    ap.add_argument("--reload-period", type=float, default=1.0, help="seconds between policy reloads")
    ap.add_argument("--seed", type=int, default=1)
    results.add_options(ap)
    a = ap.parse_args()
    srv = Server(a.bin, ["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--threads", a.threads,
                         "--kv-memory", a.kv_memory, "--max-num-seqs", "16", "--admin-token", ADMIN,
                         "--header-timeout", "2", "--body-timeout", "2", "--drain-seconds", "30"])
    pid = srv.proc.pid
    # the solo run: each witness prompt alone on the idle server
    ref, srv.ref_text = [], []
    for p in WITNESS:
        c = Rpc(srv.rpc)
        err, res = c.call("generate", {"prompt": p, "max_tokens": WITNESS_TOKENS, "temperature": 0,
                                       "ignore_eos": True})
        c.close()
        if err:
            raise SystemExit(f"the solo run failed: {err}")
        ref.append(res["tokens"])
        srv.ref_text.append(res["text"])
    c = Rpc(srv.rpc)
    _, stats0 = c.call("stats")
    c.close()
    met0 = metrics(srv.http)
    rss0 = rss_kib(pid)
    print(f"server pid {pid}, KV {a.kv_memory}, threads {a.threads}, {a.duration:.0f} s; "
          f"load average {os.getloadavg()[0]:.1f}; RSS at start {rss0 / 1024:.1f} MiB", flush=True)
    n, stop = Counts(), threading.Event()
    threads = [threading.Thread(target=witness, args=(srv, ref, stop, n)),
               threading.Thread(target=policies, args=(srv, stop, n, a.reload_period)),
               threading.Thread(target=bad_clients, args=(srv, stop, n, a.seed + 1)),
               threading.Thread(target=disconnects, args=(srv, stop, n, a.seed + 2)),
               threading.Thread(target=cancels, args=(srv, stop, n, a.seed + 3))]
    threads += [threading.Thread(target=load, args=(srv, stop, n, a.seed + 10 + i)) for i in range(a.load_clients)]
    for t in threads:
        t.daemon = True
        t.start()
    t0, peak, crashed = time.time(), rss0, False
    next_report = t0 + 30
    progress = results.Progress(max(1, int(a.duration)), "soak seconds")
    while time.time() - t0 < a.duration:
        time.sleep(0.5)
        progress.step(min(int(time.time() - t0), progress.total) - progress.n)
        if srv.proc.poll() is not None:
            crashed = True
            break
        peak = max(peak, rss_kib(pid))
        if time.time() >= next_report:
            next_report += 30
            print(f"  {time.time() - t0:5.0f} s: RSS {rss_kib(pid) / 1024:.1f} MiB, witness ok "
                  f"{n.get('witness.ok')}, mismatches {n.get('witness.mismatches')}, load ok {n.get('load.ok')}, "
                  f"reloads {n.get('reload.hostile.ok') + n.get('reload.good.ok')}", flush=True)
    progress.done()
    stop.set()
    for t in threads:
        t.join(timeout=TIMEOUT + 10)
    stuck = sum(t.is_alive() for t in threads)
    crashed |= srv.proc.poll() is not None
    rc = None
    if not crashed:
        rss1 = rss_kib(pid)
        c = Rpc(srv.rpc)
        _, stats1 = c.call("stats")
        c.close()
        met1 = metrics(srv.http)
        srv.proc.send_signal(signal.SIGTERM)
        try:
            rc = srv.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            srv.proc.kill()
            rc = srv.proc.wait()
    else:
        rc = srv.proc.returncode
    print(f"\n{time.time() - t0:.0f} s; load average after {os.getloadavg()[0]:.1f}")
    print("client counts:")
    for k in sorted(n.c):
        print(f"  {k:48s} {n.c[k]}")
    if not crashed:
        print(f"RSS: start {rss0 / 1024:.1f} MiB, end {rss1 / 1024:.1f} MiB, peak {peak / 1024:.1f} MiB "
              f"(drift {(rss1 - rss0) / 1024:+.1f} MiB)")
        f0, f1 = flatten(stats0), flatten(stats1)
        print("stats (end, change since start):")
        for k in sorted(f1):
            print(f"  {k:48s} {f1[k]:>14g} {f1[k] - f0.get(k, 0):+g}")
        print("/metrics (end, change since start):")
        for k in sorted(met1):
            print(f"  {k:72s} {met1[k]:>14g} {met1[k] - met0.get(k, 0):+g}")
    lost = n.get("witness.lost") + n.get("load.lost") + n.get("cancel.lost") + n.get("reload.lost") + stuck
    print(f"witness: {n.get('witness.ok')} answered, mismatches {n.get('witness.mismatches')} (must be 0)")
    print(f"requests lost: {lost} (must be 0); server crashes: {int(crashed)} (must be 0); "
          f"SIGTERM exit status: {rc} (must be 0)")
    if crashed:
        print("server stderr (tail):\n" + "".join(srv.stderr_tail[-40:]))
    ok = not crashed and rc == 0 and lost == 0 and n.get("witness.mismatches") == 0 and n.get("witness.ok") > 0
    print("SOAK OK" if ok else "SOAK FAILED")
    results.finish(a, {"bench": "soak", "ok": ok, "duration_s": a.duration, "crashed": crashed, "exit_status": rc,
                       "lost": lost, "counts": dict(n.c),
                       "rss_mib": None if crashed else {"start": rss0 / 1024, "end": rss1 / 1024, "peak": peak / 1024},
                       "rows": [{"name": k, "count": v} for k, v in sorted(n.c.items())],
                       "chart": {"label": "name", "values": ["count"], "log": True, "ylabel": "count",
                                 "title": f"soak, {a.duration:.0f} s: what each client did"}})
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
