#!/usr/bin/env python3
"""bench_serve.py — a load generator for `luainfer serve`, in the manner of
`vllm bench serve`, plus the same workload through the in-process engine.

    # start a server itself, 64 requests at once, 64-token prompts, 64 new tokens:
    python bench/bench_serve.py --start --num-prompts 64 --input-len 64 --output-len 64
    # against a running server, Poisson arrivals at 4 req/s, at most 16 in flight:
    python bench/bench_serve.py --addr 127.0.0.1:7700 --request-rate 4 --max-concurrency 16
    # also run the workload in-process (luainfer run bench/bench_serve.lua), alternating 3 times,
    # and print the median server/in-process throughput ratio:
    python bench/bench_serve.py --start --in-process --repeat 3

Requests are random token ids (a fixed seed, exactly --input-len tokens),
greedy, ignore_eos, --output-len tokens, streamed over msgpack-RPC. Reports:
request and token throughput, TTFT / TPOT / ITL / E2E (mean, p50, p99) and
goodput (requests/s meeting --goodput ttft:MS tpot:MS). With --in-process
the same prompts run through one engine in one process (all added at once;
compare with --request-rate inf) and the server/in-process output-token
throughput ratio is printed (the target is >= 0.95).
"""
import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgpack

import results  # bench/results.py: --json, --plot, progress

REPO = Path(__file__).resolve().parents[1]


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def make_prompts(n, input_len, seed, vocab=(1000, 30000)):
    rng = random.Random(seed)
    return [[rng.randrange(*vocab) for _ in range(input_len)] for _ in range(n)]


async def one_request(host, port, tokens, output_len, t_start_ref):
    reader, writer = await asyncio.open_connection(host, port)
    unpacker = msgpack.Unpacker(raw=False)
    t0 = time.perf_counter()
    writer.write(msgpack.packb([0, 1, "generate", {"tokens": tokens, "max_tokens": output_len, "temperature": 0,
                                                    "ignore_eos": True, "stream": True}]))
    await writer.drain()
    arrivals, result = [], None
    while result is None:
        data = await reader.read(65536)
        if not data:
            raise ConnectionError("server closed the connection")
        unpacker.feed(data)
        now = time.perf_counter()
        for m in unpacker:
            if m[0] == 2 and m[1] == "generate.delta" and m[2]["tokens"]:
                arrivals.extend([now] * len(m[2]["tokens"]))
            elif m[0] == 1:
                if m[2] is not None:
                    raise RuntimeError(m[2])
                result = m[3]
    writer.close()
    t_end = time.perf_counter()
    n = len(result["tokens"])
    ttft = arrivals[0] - t0 if arrivals else t_end - t0
    itl = [b - a for a, b in zip(arrivals, arrivals[1:])]
    tpot = (arrivals[-1] - arrivals[0]) / (n - 1) if n > 1 and arrivals else 0.0
    return {"ttft": ttft, "tpot": tpot, "itl": itl, "e2e": t_end - t0, "out": n,
            "prompt": result["usage"]["prompt_tokens"], "start": t0 - t_start_ref, "end": t_end - t_start_ref}


async def run_load(host, port, prompts, output_len, rate, max_concurrency, seed):
    rng = random.Random(seed + 1)
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    t_start = time.perf_counter()

    async def guarded(tokens):
        if sem:
            async with sem:
                return await one_request(host, port, tokens, output_len, t_start)
        return await one_request(host, port, tokens, output_len, t_start)

    tasks = []
    for tokens in prompts:
        tasks.append(asyncio.create_task(guarded(tokens)))
        if rate != float("inf"):
            await asyncio.sleep(rng.expovariate(rate))
    results = await asyncio.gather(*tasks)
    return results, time.perf_counter() - t_start


def summarize(results, duration, slo_ttft_ms, slo_tpot_ms):
    out = sum(r["out"] for r in results)
    prompt = sum(r["prompt"] for r in results)
    ms = lambda xs: [x * 1e3 for x in xs]  # noqa: E731
    ttft, tpot, e2e = ms([r["ttft"] for r in results]), ms([r["tpot"] for r in results]), ms([r["e2e"] for r in results])
    itl = ms([x for r in results for x in r["itl"]])
    good = sum(1 for r in results if r["ttft"] * 1e3 <= slo_ttft_ms and r["tpot"] * 1e3 <= slo_tpot_ms)
    s = {"completed": len(results), "duration_s": duration, "prompt_tokens": prompt, "output_tokens": out,
         "request_throughput": len(results) / duration, "output_throughput": out / duration,
         "total_token_throughput": (out + prompt) / duration, "goodput_req_s": good / duration,
         "slo": {"ttft_ms": slo_ttft_ms, "tpot_ms": slo_tpot_ms}}
    for name, xs in (("ttft_ms", ttft), ("tpot_ms", tpot), ("itl_ms", itl), ("e2e_ms", e2e)):
        s[name] = {"mean": statistics.fmean(xs) if xs else float("nan"), "p50": pct(xs, 50), "p99": pct(xs, 99)}
    return s


def print_summary(title, s):
    print(f"============ {title} ============")
    print(f"{'Successful requests:':<40}{s['completed']:>12}")
    print(f"{'Benchmark duration (s):':<40}{s['duration_s']:>12.2f}")
    print(f"{'Total input tokens:':<40}{s['prompt_tokens']:>12}")
    print(f"{'Total generated tokens:':<40}{s['output_tokens']:>12}")
    print(f"{'Request throughput (req/s):':<40}{s['request_throughput']:>12.2f}")
    print(f"{'Output token throughput (tok/s):':<40}{s['output_throughput']:>12.2f}")
    print(f"{'Total token throughput (tok/s):':<40}{s['total_token_throughput']:>12.2f}")
    print(f"{'Goodput (req/s, ttft<=%gms tpot<=%gms):' % (s['slo']['ttft_ms'], s['slo']['tpot_ms']):<40}"
          f"{s['goodput_req_s']:>12.2f}")
    for name, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E")):
        v = s[name]
        print(f"{label + ' mean / p50 / p99 (ms):':<40}{v['mean']:>9.2f} {v['p50']:>9.2f} {v['p99']:>9.2f}")


def start_server(binary, args):
    proc = subprocess.Popen([binary, "serve", "--listen", "127.0.0.1:0", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    addr = None
    for line in proc.stdout:
        if "listening on" in line:
            addr = line.split("listening on ")[1].split()[0]
            break
    if not addr:
        raise SystemExit("server did not start: " + proc.stderr.read()[-2000:])
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    return proc, addr


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--addr", default="127.0.0.1:7700", help="msgpack-RPC HOST:PORT of a running server")
    ap.add_argument("--start", action="store_true", help="start `luainfer serve` for the run (port 0)")
    ap.add_argument("--bin", default=os.environ.get("LUAINFER_BIN", str(REPO / "build" / "luainfer")))
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (Poisson); inf = all at once")
    ap.add_argument("--max-concurrency", type=int, default=0, help="cap on requests in flight (0 = none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--goodput", nargs="*", default=["ttft:2000", "tpot:200"], help="SLOs, e.g. ttft:500 tpot:50 (ms)")
    ap.add_argument("--threads", default=os.environ.get("LUAINFER_THREADS", "2"))
    ap.add_argument("--max-num-seqs", default="64")
    ap.add_argument("--max-batched-tokens", default="512")
    ap.add_argument("--kv-memory", default=str(256 << 20))
    ap.add_argument("--policy", default="", help="policy file for both runs (default: the server's default)")
    ap.add_argument("--in-process", action="store_true", help="also run the workload in-process and print the ratio")
    ap.add_argument("--repeat", type=int, default=1, help="alternate server / in-process runs this many times")
    results.add_options(ap)
    args = ap.parse_args()
    slo = dict(x.split(":") for x in args.goodput)
    slo_ttft, slo_tpot = float(slo.get("ttft", "inf")), float(slo.get("tpot", "inf"))

    prompts = make_prompts(args.num_prompts, args.input_len, args.seed)
    engine_args = ["--threads", args.threads, "--max-num-seqs", args.max_num_seqs, "--max-batched-tokens",
                   args.max_batched_tokens, "--kv-memory", args.kv_memory, "--max-inflight", "100000",
                   "--max-connections", str(max(256, args.num_prompts + 16))]
    if args.policy:
        engine_args.insert(0, args.policy)
    proc = None
    addr = args.addr
    if args.start:
        proc, addr = start_server(args.bin, engine_args)
    host, port = addr.rsplit(":", 1)
    report = {"bench": "serve", "args": vars(args), "runs": [], "rows": []}
    progress = results.Progress(args.repeat, "serve runs")
    try:
        # warm-up (weights paged in), not counted
        asyncio.run(run_load(host, int(port), prompts[:1], 2, float("inf"), 0, args.seed))
        for rep in range(args.repeat):
            # server and in-process runs alternate, so that load from other
            # processes on the machine hits both about equally
            got, duration = asyncio.run(run_load(host, int(port), prompts, args.output_len, args.request_rate,
                                                 args.max_concurrency, args.seed))
            summary = summarize(got, duration, slo_ttft, slo_tpot)
            print_summary(f"luainfer serve (msgpack-RPC, streamed), run {rep + 1}/{args.repeat}", summary)
            run = {"server": summary}
            if args.in_process:
                inproc = run_in_process(args, prompts)
                run["in_process"] = inproc
                run["ratio"] = summary["output_throughput"] / inproc["output_throughput"]
                print(f"============ in-process engine (luainfer run bench/bench_serve.lua), run {rep + 1} ============")
                print(f"{'Benchmark duration (s):':<40}{inproc['duration_s']:>12.2f}")
                print(f"{'Output token throughput (tok/s):':<40}{inproc['output_throughput']:>12.2f}")
                print(f"{'TTFT p50 / p99 (ms):':<40}{inproc['ttft_p50_ms']:>9.2f} {inproc['ttft_p99_ms']:>9.2f}")
                print(f"{'Server / in-process throughput:':<40}{run['ratio']:>12.3f}")
            report["runs"].append(run)
            report["rows"].append({"name": f"run {rep + 1} server", "output_throughput": summary["output_throughput"]})
            if args.in_process:
                report["rows"].append({"name": f"run {rep + 1} in-process",
                                       "output_throughput": run["in_process"]["output_throughput"]})
            progress.step()
        progress.done()
    finally:
        if proc:
            proc.terminate()
            proc.wait(60)
    if args.in_process:
        ratios = [r["ratio"] for r in report["runs"]]
        report["ratio_median"] = statistics.median(ratios)
        print(f"\nServer / in-process output throughput: median {report['ratio_median']:.3f} over {len(ratios)} "
              f"runs ({', '.join(f'{r:.3f}' for r in ratios)}); target >= 0.95")
    report["chart"] = {"label": "name", "values": ["output_throughput"], "ylabel": "output tokens/s",
                       "title": f"luainfer serve (msgpack-RPC), {args.num_prompts} requests"
                                + (" vs in-process" if args.in_process else "")}
    results.finish(args, report)


def run_in_process(args, prompts):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        for p in prompts:
            f.write(" ".join(map(str, p)) + "\n")
    r = subprocess.run([args.bin, "run", str(REPO / "bench" / "bench_serve.lua"), f.name, str(args.output_len),
                        args.threads, args.max_num_seqs, args.max_batched_tokens, args.kv_memory, args.policy],
                       capture_output=True, text=True, cwd=REPO)
    os.unlink(f.name)
    if r.returncode != 0:
        raise SystemExit("in-process run failed: " + r.stderr[-2000:])
    inproc = json.loads(r.stdout.strip().splitlines()[-1])
    inproc["output_throughput"] = inproc["output_tokens"] / inproc["duration_s"]
    return inproc


if __name__ == "__main__":
    sys.exit(main())
