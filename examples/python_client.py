#!/usr/bin/env python3
"""python_client.py — talk to `luainfer serve` with nothing but the `msgpack`
package and a raw socket (the msgpack-RPC wire format, spelled out).

    luainfer serve &                                  # listens on 127.0.0.1:7700
    python examples/python_client.py "The capital of France is"
    python examples/python_client.py --addr unix:/tmp/luainfer.sock --max-tokens 32 "Once upon a time"

A request is [0, msgid, method, params]; the response is
[1, msgid, error, result]. With stream=True the server first sends
notifications [2, "generate.delta", {id, request_id, index, text, tokens}],
one per generated token; this script prints their text as it arrives,
then the final result's finish reason, usage and timings.
"""
import argparse
import os
import socket
import sys

import msgpack


def connect(addr):
    if addr.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(addr[5:])
        return s
    host, _, port = addr.rpartition(":")
    return socket.create_connection((host or "127.0.0.1", int(port)))


def call(sock, unpacker, msgid, method, params, on_notification=None):
    """Sends one request and reads until its response; returns the result or
    raises RuntimeError with the server's {code, message}."""
    sock.sendall(msgpack.packb([0, msgid, method, params]))
    while True:
        for msg in unpacker:
            if msg[0] == 2 and on_notification:
                on_notification(msg[1], msg[2])
            elif msg[0] == 1 and msg[1] == msgid:
                if msg[2] is not None:
                    raise RuntimeError(f"{method}: {msg[2]['message']} (code {msg[2]['code']})")
                return msg[3]
        data = sock.recv(65536)
        if not data:
            raise RuntimeError("connection closed by the server")
        unpacker.feed(data)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prompt")
    ap.add_argument("--addr", default="127.0.0.1:7700", help="HOST:PORT or unix:PATH")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--chat", action="store_true", help="send the prompt as a user chat message")
    ap.add_argument("--api-key", default=os.environ.get("LUAINFER_API_KEY"),
                    help="the key of a server started with --api-key (default: $LUAINFER_API_KEY)")
    args = ap.parse_args()

    sock = connect(args.addr)
    unpacker = msgpack.Unpacker(raw=False)
    msgid = 1
    if args.api_key:  # the first call on a keyed server
        call(sock, unpacker, msgid, "auth", {"token": args.api_key})
        msgid += 1
    params = {"max_tokens": args.max_tokens, "temperature": args.temperature, "stream": True}
    if args.chat:
        params["messages"] = [{"role": "user", "content": args.prompt}]
    else:
        params["prompt"] = args.prompt

    def on_delta(method, p):
        if method == "generate.delta":
            sys.stdout.write(p["text"])
            sys.stdout.flush()

    result = call(sock, unpacker, msgid, "generate", params, on_delta)
    u, t = result["usage"], result["timings"]
    print(f"\n[{result['finish_reason']}] prompt {u['prompt_tokens']} tokens, generated "
          f"{u['completion_tokens']}; ttft {t['ttft_ms']:.1f} ms, tpot {t['tpot_ms']:.1f} ms")
    sock.close()


if __name__ == "__main__":
    main()
