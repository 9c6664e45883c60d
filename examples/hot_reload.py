#!/usr/bin/env python3
"""hot_reload.py — replace the scheduling policy of a live server while
requests are flowing, and show that nothing is lost.

    ./build/luainfer serve --admin-token secret &
    python examples/hot_reload.py [--addr 127.0.0.1:7700] [--admin-token secret] [POLICY.lua]

A background thread keeps sending greedy requests; the main thread sends
`policy.reload` with the policy's source (default: examples/scheduler.lua),
waits, then reloads policies/default.lua again. Every request must finish,
and a greedy prompt must give the same text before, during and after the
reloads (a policy decides who runs when, never what is computed). Uses only
the `msgpack` package and a socket (see python_client.py for the wire
format).
"""
import argparse
import socket
import sys
import threading
import time
from pathlib import Path

import msgpack

REPO = Path(__file__).resolve().parents[1]


class Rpc:
    def __init__(self, addr):
        host, _, port = addr.rpartition(":")
        self.s = socket.create_connection((host or "127.0.0.1", int(port)), timeout=120)
        self.unp = msgpack.Unpacker(raw=False)
        self.msgid = 0

    def call(self, method, params):
        self.msgid += 1
        self.s.sendall(msgpack.packb([0, self.msgid, method, params]))
        while True:
            for msg in self.unp:
                if msg[0] == 1 and msg[1] == self.msgid:
                    if msg[2] is not None:
                        raise RuntimeError(f"{method}: {msg[2]}")
                    return msg[3]
            data = self.s.recv(65536)
            if not data:
                raise RuntimeError("server closed the connection")
            self.unp.feed(data)


def traffic(addr, stop, results):
    rpc = Rpc(addr)
    while not stop.is_set():
        r = rpc.call("generate", {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0})
        results.append(r["text"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--addr", default="127.0.0.1:7700")
    ap.add_argument("--admin-token", default="secret")
    ap.add_argument("policy", nargs="?", default=str(REPO / "examples" / "scheduler.lua"))
    a = ap.parse_args()

    stop, results = threading.Event(), []
    t = threading.Thread(target=traffic, args=(a.addr, stop, results), daemon=True)
    t.start()
    rpc = Rpc(a.addr)
    time.sleep(1.0)
    for path in (a.policy, str(REPO / "policies" / "default.lua")):
        before = len(results)
        r = rpc.call("policy.reload", {"source": Path(path).read_text(), "admin_token": a.admin_token})
        print(f"reloaded {Path(path).name}: server now runs {r['policy']!r} "
              f"({before} requests finished before)")
        time.sleep(1.0)
    stop.set()
    t.join(timeout=120)
    texts = set(results)
    print(f"{len(results)} requests finished across both reloads; distinct greedy outputs: {len(texts)}")
    for x in texts:
        print(f"  {x!r}")
    return 0 if len(results) >= 2 and len(texts) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
