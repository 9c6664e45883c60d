#!/usr/bin/env python3
"""bench_replay_live.py — replays an arrival trace against a live
`luainfer serve` over HTTP with the OpenAI client, or over msgpack-RPC with
aio-msgpack-rpc (real clients, real time), and prints the same columns as
the in-process `luainfer bench replay`; with --compare, the goodput
difference against its --json file.

    .venv/bin/python bench/bench_replay_live.py TRACE [--protocol http|rpc] [--policy P.lua]
        [--rate-scale X] [--duration S] [--max-num-seqs N] [--kv-memory MIB] [--bin build/luainfer]
        [--compare REPLAY.json] [--json OUT] [--server-cpus LIST] [--client-cpus LIST] [--step-log FILE]

--protocol rpc (default http) serves `--listen 127.0.0.1:PORT --no-http`
and sends each request as a streamed msgpack-RPC `generate` on a
connection of its own (one aio-msgpack-rpc client per request, opened at
its arrival time); TTFT is send to the first `generate.delta` notification
carrying text, the end the response. The HTTP path follows.

It starts `luainfer serve POLICY --http 127.0.0.1:PORT --no-rpc` on a free
loopback port (the same --max-num-seqs and --kv-memory defaults as the
in-process replay: 16 and 256 MiB), waits for /health, then sends each
request of the trace at its arrival time divided by the rate scale, one
thread per request in flight: a streamed /v1/completions with the trace's
prompt (text, or the in-process replay's synthetic token ids for
prompt_len), max_tokens with ignore_eos (so exactly that many tokens),
temperature 0 and the trace's slo_ttft_ms / slo_tpot_ms. TTFT is send to
the first streamed token; TPOT the time after it over max_tokens - 1;
goodput the share meeting both objectives (2000 / 200 ms without them).
Queueing delay is not seen from a client and is not printed. Every call has
a timeout (--request-timeout, default 600 s), and the server is stopped at
the end whatever happens."""
import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import results  # bench/results.py: --json, --plot, progress

REPO = Path(__file__).resolve().parents[1]


def synthetic(i, n):  # bench_replay.lua's synthetic prompt of request i (1-based)
    return [1000 + (i * 7919 + k * 104729) % 30000 for k in range(1, n + 1)]


def pct(xs, p):
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))]


def read_trace(path):
    reqs = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                r = json.loads(line)
                if not isinstance(r, dict) or "t" not in r or "max_tokens" not in r:
                    sys.exit(f"{path}:{n}: a line needs 't' and 'max_tokens'")
                reqs.append(r)
    if not reqs:
        sys.exit(f"trace {path} has no requests")
    return reqs


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_health(url, proc, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            sys.exit(f"luainfer serve exited ({proc.returncode}) before it was healthy")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit(f"luainfer serve was not healthy within {timeout} s")


def one(client, i, r, t_send, out, timeout):
    prompt = r["prompt"] if "prompt" in r else synthetic(i, r["prompt_len"])
    extra = {"ignore_eos": True, "slo_ttft_ms": r.get("slo_ttft_ms", 2000), "slo_tpot_ms": r.get("slo_tpot_ms", 200)}
    first = None
    text = []
    try:
        stream = client.completions.create(model="luainfer", prompt=prompt, max_tokens=r["max_tokens"], temperature=0,
                                           stream=True, extra_body=extra, timeout=timeout)
        for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                if first is None:
                    first = time.monotonic()
                text.append(chunk.choices[0].text)
        end = time.monotonic()
    except Exception as e:  # noqa: BLE001 - counted as a failed request, reported
        out[i] = {"error": f"{type(e).__name__}: {e}"}
        return
    ttft = ((first or end) - t_send) * 1e3
    n = r["max_tokens"]
    tpot = (end - first) * 1e3 / (n - 1) if first is not None and n > 1 else 0.0
    out[i] = {"ttft": ttft, "tpot": tpot, "text": "".join(text), "tokens": n}


# ---- msgpack-RPC: aio-msgpack-rpc, one client per request ------------------------
def rpc_client_class():
    import aio_msgpack_rpc as aio  # tools/requirements-test.txt

    class StreamingClient(aio.Client):
        """aio-msgpack-rpc's client answers responses only (it logs and drops
        notifications); this one hands the generate.delta notifications to
        on_delta, so the first token's arrival is seen."""

        def __init__(self, *a, on_delta=None, **kw):
            super().__init__(*a, **kw)
            self.on_delta = on_delta

        def _on_recv(self, obj):
            if obj and obj[0] == 2:  # [2, method, params]
                if obj[1] == "generate.delta" and self.on_delta:
                    self.on_delta(obj[2])
                return
            super()._on_recv(obj)

    return StreamingClient


async def one_rpc(cls, port, i, r, out, timeout):
    import asyncio

    params = {"prompt": r["prompt"]} if "prompt" in r else {"tokens": synthetic(i, r["prompt_len"])}
    params.update({"max_tokens": r["max_tokens"], "temperature": 0, "ignore_eos": True, "stream": True,
              "slo_ttft_ms": r.get("slo_ttft_ms", 2000), "slo_tpot_ms": r.get("slo_tpot_ms", 200)})
    t_send, first, client = time.monotonic(), [None], None

    def on_delta(d):
        if first[0] is None and d.get("text"):
            first[0] = time.monotonic()

    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
        client = cls(reader, writer, response_timeout=timeout, on_delta=on_delta)
        res = await client.call("generate", params)
        end = time.monotonic()
    except Exception as e:  # noqa: BLE001 - counted as a failed request, reported
        out[i] = {"error": f"{type(e).__name__}: {e}"}
        return
    finally:
        if client is not None:
            client.close()
    n = len(res.get("tokens", []))
    if n != r["max_tokens"]:
        out[i] = {"error": f"request {i}: {n} tokens, want {r['max_tokens']} ({res.get('finish_reason')})"}
        return
    ttft = ((first[0] or end) - t_send) * 1e3
    tpot = (end - first[0]) * 1e3 / (n - 1) if first[0] is not None and n > 1 else 0.0
    out[i] = {"ttft": ttft, "tpot": tpot, "text": res.get("text", ""), "tokens": n}


def rpc_health(port, proc, timeout):
    import asyncio

    cls = rpc_client_class()

    async def ask():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        c = cls(reader, writer, response_timeout=5)
        try:
            return await c.call("health")
        finally:
            c.close()

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            sys.exit(f"luainfer serve exited ({proc.returncode}) before it was healthy")
        try:
            if asyncio.run(ask()).get("status") == "ok":
                return
        except (OSError, asyncio.TimeoutError):
            pass
        time.sleep(0.2)
    sys.exit(f"luainfer serve was not healthy within {timeout} s")


def send_rpc(args, port, reqs, out):
    """Every request at its arrival time on its own connection; returns the makespan."""
    import asyncio

    cls = rpc_client_class()

    async def main():
        t0 = time.monotonic()
        tasks = []
        for i, r in enumerate(reqs, 1):
            delay = t0 + r["t"] / args.rate_scale - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one_rpc(cls, port, i, r, out, args.request_timeout)))
        await asyncio.gather(*tasks)
        return time.monotonic() - t0

    return asyncio.run(main())


def send_http(args, url, reqs, out):
    from openai import OpenAI  # tools/requirements-test.txt

    client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    threads = []
    t0 = time.monotonic()
    for i, r in enumerate(reqs, 1):
        delay = t0 + r["t"] / args.rate_scale - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        th = threading.Thread(target=one, args=(client, i, r, time.monotonic(), out, args.request_timeout))
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    return time.monotonic() - t0


def parse_cpus(text):
    """A CPU list as taskset -c takes it ("0", "0,2-3") -> a set of ints."""
    cpus = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        a, b = int(lo), int(hi or lo)
        if a < 0 or b < a:
            raise ValueError(part)
        cpus.update(range(a, b + 1))
    return cpus


def replay(args, trace):
    port = free_port()
    listen = (["--listen", f"127.0.0.1:{port}", "--no-http"] if args.protocol == "rpc"
              else ["--http", f"127.0.0.1:{port}", "--no-rpc"])
    cmd = [args.bin, "serve", args.policy, *listen, "--max-num-seqs",
           str(args.max_num_seqs), "--kv-memory", str(int(args.kv_memory * 1048576))]
    if args.policy_isolation:
        cmd += ["--policy-isolation", args.policy_isolation]
    if args.step_log:  # the server's own step timings, for bench_step_cost.lua --fit-log
        cmd += ["--step-log", args.step_log]
    if args.server_cpus:  # the server (and its threads' default count) on these CPUs only
        cmd = ["taskset", "-c", args.server_cpus] + cmd
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        reqs = [r for r in trace if r["t"] / args.rate_scale < args.duration]
        if not reqs:
            sys.exit(f"no request of the trace arrives within --duration {args.duration} s")
        out = {}
        if args.protocol == "rpc":
            rpc_health(port, proc, 120)
        else:
            wait_health(url, proc, 120)
        # progress: requests answered so far (the senders fill `out` as each ends)
        progress, stop = results.Progress(len(reqs), f"replay {args.policy}"), threading.Event()

        def watch():
            while not stop.wait(0.5):
                progress.step(len(out) - progress.n)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            makespan = send_rpc(args, port, reqs, out) if args.protocol == "rpc" else send_http(args, url, reqs, out)
        finally:
            stop.set()
            watcher.join()
        progress.step(len(out) - progress.n)
        progress.done()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    errors = [o["error"] for o in out.values() if "error" in o]
    if errors:
        sys.exit(f"{len(errors)} of {len(reqs)} requests failed, the first: {errors[0]}")
    ttft = [out[i]["ttft"] for i in range(1, len(reqs) + 1)]
    tpot = [out[i]["tpot"] for i in range(1, len(reqs) + 1)]
    good = sum(1 for i, r in enumerate(reqs, 1)
               if out[i]["ttft"] <= r.get("slo_ttft_ms", 2000) and out[i]["tpot"] <= r.get("slo_tpot_ms", 200))
    tokens = sum(r["max_tokens"] for r in reqs)
    return {"protocol": args.protocol, "policy": Path(args.policy).stem, "rate_scale": args.rate_scale, "requests": len(reqs),
            "makespan_s": makespan, "throughput": tokens / makespan, "output_tokens": tokens,
            "goodput": good / len(reqs), "ttft_p50": pct(ttft, 50), "ttft_p90": pct(ttft, 90),
            "ttft_p99": pct(ttft, 99), "tpot_p50": pct(tpot, 50), "tpot_p90": pct(tpot, 90),
            "tpot_p99": pct(tpot, 99), "texts": [out[i]["text"] for i in range(1, len(reqs) + 1)]}


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--protocol", choices=("http", "rpc"), default="http")
    ap.add_argument("--policy", default=str(REPO / "policies" / "default.lua"))
    ap.add_argument("--rate-scale", type=float, default=1.0)
    ap.add_argument("--duration", type=float, default=math.inf)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--kv-memory", type=float, default=256, help="MiB")
    ap.add_argument("--bin", default=os.environ.get("LUAINFER_BIN", str(REPO / "build" / "luainfer")))
    ap.add_argument("--request-timeout", type=float, default=600)
    ap.add_argument("--policy-isolation", choices=("process", "inprocess"),
                    help="serve's policy isolation (default: serve's, process); the in-process replay runs inprocess")
    ap.add_argument("--server-cpus", help="run the server on these CPUs (taskset -c LIST): its default thread count follows")
    ap.add_argument("--step-log", help="the server appends a JSON line per engine step to this file (serve --step-log)")
    ap.add_argument("--client-cpus", help="run this script's clients on these CPUs (e.g. the server's others)")
    ap.add_argument("--compare", help="a `luainfer bench replay --json` file of the same trace, policy and scale")
    results.add_options(ap)
    args = ap.parse_args(argv[1:])
    if args.rate_scale <= 0 or args.duration <= 0 or args.max_num_seqs < 1 or args.kv_memory <= 0:
        sys.exit("--rate-scale, --duration, --kv-memory must be > 0 and --max-num-seqs >= 1")
    for flag, cpus in (("--server-cpus", args.server_cpus), ("--client-cpus", args.client_cpus)):
        if cpus is not None:
            try:
                cpu_set = parse_cpus(cpus)
            except ValueError:
                sys.exit(f"{flag} {cpus!r}: want a CPU list such as 0 or 0,2-3")
            if not cpu_set <= os.sched_getaffinity(0):
                sys.exit(f"{flag} {cpus}: CPUs {sorted(cpu_set - os.sched_getaffinity(0))} are not available here")
    if args.server_cpus and not shutil.which("taskset"):
        sys.exit("--server-cpus needs taskset (util-linux)")
    if args.client_cpus:
        os.sched_setaffinity(0, parse_cpus(args.client_cpus))
    trace = read_trace(args.trace)
    r = replay(args, trace)
    how = "msgpack-RPC, aio-msgpack-rpc" if args.protocol == "rpc" else "HTTP, OpenAI client"
    print(f"live replay of {args.trace} through luainfer serve ({how}), policy {r['policy']}, "
          f"scale {r['rate_scale']:.2f}, {r['requests']} requests")
    print(f"  tok/s {r['throughput']:.1f}  makespan {r['makespan_s']:.1f} s  ttft p50/90/99 {r['ttft_p50']:.0f} "
          f"{r['ttft_p90']:.0f} {r['ttft_p99']:.0f} ms  tpot p50/90/99 {r['tpot_p50']:.1f} {r['tpot_p90']:.1f} "
          f"{r['tpot_p99']:.1f} ms  goodput {100 * r['goodput']:.0f}%")
    status = 0
    if args.compare:
        runs = json.loads(Path(args.compare).read_text())["runs"]
        match = [x for x in runs if x["policy"] == r["policy"] and abs(x["rate_scale"] - r["rate_scale"]) < 1e-9]
        if not match:
            sys.exit(f"{args.compare} has no run of policy {r['policy']} at scale {r['rate_scale']}")
        m = match[0]
        print(f"  in-process: goodput {100 * m['goodput']:.0f}%, ttft p99 {m['ttft_p99']:.0f} ms, "
              f"tok/s {m['throughput']:.1f}; goodput difference {100 * (r['goodput'] - m['goodput']):+.0f} points")
    out = dict(r, texts=None, bench="replay_live")
    out["rows"] = [{"name": f"p{p}", "ttft_ms": r[f"ttft_p{p}"], "tpot_ms": r[f"tpot_p{p}"]} for p in (50, 90, 99)]
    out["chart"] = {"label": "name", "values": ["ttft_ms", "tpot_ms"], "log": True, "ylabel": "ms",
                    "title": f"live replay ({args.protocol}), {r['policy']}, scale {r['rate_scale']:.2f}"}
    results.finish(args, out)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
