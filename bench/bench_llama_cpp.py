#!/usr/bin/env python3
"""bench_llama_cpp.py — luainfer against llama.cpp on this machine, side by side.

Both load the same GGUF with the same thread count and are measured in one
run, alternating round by round (luainfer, then llama.cpp, R times; the
table shows medians over rounds, and the median of the per-round ratios):

  prefill   tokens/s of one 512-token prompt (one forward pass)
  decode    tokens/s of one sequence decoding 128 tokens (greedy)
  batchedN  tokens/s of N sequences decoding 128 tokens each in lockstep,
            one token of every sequence per forward pass

luainfer runs `luainfer run bench/bench_cpu.lua` (the engine with
max_num_seqs = N, prefix caching off); its peak RSS comes from wait4().
llama.cpp runs in this process through llama-cpp-python's low-level API
(llama_batch / llama_decode, one seq_id per sequence), greedy argmax over
the logits in numpy. Prompts are the same synthetic token ids on both sides.

llama.cpp build: llama-cpp-python from PyPI, compiled for this CPU:
    CMAKE_ARGS="-DGGML_NATIVE=ON" .venv/bin/pip install --no-binary :all: \
        --force-reinstall llama-cpp-python
(GGML_NATIVE=ON is -march=native: AVX-512 F/BW/VL/VBMI/VNNI/BF16 here; the
script prints llama_print_system_info() so the flags are on record.)

Also printed: the machine's limits, measured by bench/bench_kernels --peak
(DRAM read bandwidth with all threads, the int8 peak: VNNI, or AVX2's
vpmaddubsw, and the f32 FMA peak), the bytes a decoded token reads (all
weight tensors once, as packed) against that bandwidth, and multiply-adds
per second against the int8 peak.

Usage (from the repository root):
    .venv/bin/python bench/bench_llama_cpp.py [--luainfer build/luainfer]
        [--threads 2] [--rounds 3] [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]
"""

import argparse
import ctypes
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np

import results  # bench/results.py: --json, --plot, progress

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def prompt(s, n):
    """Token ids of synthetic prompt s (bench_cpu.lua has the same formula)."""
    return [100 + (i * 7919 + s * 104729) % 40000 for i in range(1, n + 1)]


# --------------------------------------------------------------------------
# llama.cpp through llama-cpp-python's C API
# --------------------------------------------------------------------------

class LlamaCpp:
    def __init__(self, path, threads):
        import llama_cpp as L

        self.L = L
        # llama.cpp logs every context it creates: keep the table readable
        self._quiet = L.llama_log_callback(lambda level, text, user_data: None)
        L.llama_log_set(self._quiet, ctypes.c_void_p(0))
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(path.encode(), mp)
        if not self.model:
            sys.exit(f"llama.cpp could not load {path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.threads = threads
        self.system_info = L.llama_print_system_info().decode()

    def context(self, n_ctx, n_seq):
        L = self.L
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = 512
        cp.n_ubatch = 512
        cp.n_seq_max = n_seq
        cp.n_threads = self.threads
        cp.n_threads_batch = self.threads
        ctx = L.llama_init_from_model(self.model, cp)
        if not ctx:
            sys.exit("llama.cpp could not create a context")
        return ctx

    def decode(self, ctx, entries):
        """entries: (token, pos, seq, want_logits); returns the batch rows with logits."""
        L = self.L
        b = L.llama_batch_init(len(entries), 0, 1)
        rows = []
        for i, (tok, pos, seq, lg) in enumerate(entries):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = 1 if lg else 0
            if lg:
                rows.append(i)
        b.n_tokens = len(entries)
        rc = L.llama_decode(ctx, b)
        L.llama_batch_free(b)
        if rc != 0:
            sys.exit(f"llama_decode failed ({rc})")
        return rows

    def argmax(self, ctx, row):
        p = self.L.llama_get_logits_ith(ctx, row)
        return int(np.argmax(np.ctypeslib.as_array(p, shape=(self.n_vocab,))))

    def prefill(self, n):
        ctx = self.context(n + 64, 1)
        mem = self.L.llama_get_memory(ctx)
        rates = []
        for rep in range(1, 5):
            toks = prompt(rep, n)
            ents = [(t, i, 0, i == n - 1) for i, t in enumerate(toks)]
            t0 = time.perf_counter()
            self.decode(ctx, ents)
            dt = time.perf_counter() - t0
            self.L.llama_memory_clear(mem, True)
            if rep > 1:
                rates.append(n / dt)
        self.L.llama_free(ctx)
        return statistics.median(rates)

    def batched(self, S, steps):
        """S sequences, 16-token prompts, then `steps` lockstep decode steps."""
        ctx = self.context(S * 256 if S > 1 else 512, S)
        mem = self.L.llama_get_memory(ctx)
        best = 0.0
        for rep in range(1, 3):
            ents = []
            for s in range(S):
                toks = prompt(1000 * rep + s + 1, 16)
                ents += [(t, i, s, i == 15) for i, t in enumerate(toks)]
            rows = self.decode(ctx, ents)
            nxt = [self.argmax(ctx, r) for r in rows]
            t0 = time.perf_counter()
            for step in range(steps):
                rows = self.decode(ctx, [(nxt[s], 16 + step, s, True) for s in range(S)])
                nxt = [self.argmax(ctx, r) for r in rows]
            dt = time.perf_counter() - t0
            self.L.llama_memory_clear(mem, True)
            best = max(best, S * steps / dt)
        self.L.llama_free(ctx)
        return best


# --------------------------------------------------------------------------
# luainfer (a child process) and the machine limits
# --------------------------------------------------------------------------

def run_luainfer_rss(binary, threads, prefill, steps, seqs, isa="auto"):
    """The same run, returning (results, peak RSS in MiB) from wait4()."""
    env = dict(os.environ, LUAINFER_THREADS=str(threads), LUAINFER_ISA=isa)
    cmd = [binary, "run", os.path.join(ROOT, "bench", "bench_cpu.lua"), str(prefill), str(steps)] + [str(s) for s in seqs]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.dup2(w, 1)
        os.chdir(ROOT)
        os.execve(binary, cmd, env)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    _, status, ru = os.wait4(pid, 0)
    if status != 0:
        sys.exit(f"luainfer failed (status {status})")
    res = {m.group(1): float(m.group(2)) for m in re.finditer(r"^RESULT (\S+) (\S+)$", out, re.M)}
    return res, ru.ru_maxrss / 1024.0


def machine_limits(build_dir, threads):
    """DRAM bandwidth and compute peaks from bench_kernels --peak (built if missing)."""
    exe = os.path.join(build_dir, "bench_kernels")
    lib = os.path.join(build_dir, "libluainfer_core.a")
    src = os.path.join(ROOT, "bench", "bench_kernels.c")
    if not os.path.exists(exe) or os.path.getmtime(exe) < max(os.path.getmtime(src), os.path.getmtime(lib)):
        # the build line in bench_kernels.c's header
        libs = subprocess.run(["pkg-config", "--libs", "luajit", "libuv", "msgpack", "libutf8proc", "libcjson",
                               "libxxhash", "libedit", "zlib"], capture_output=True, text=True, check=True).stdout.split()
        subprocess.run(["gcc", "-std=c11", "-O2", "-I" + os.path.join(ROOT, "core"), "-I" + os.path.join(ROOT, "kernels"),
                        "-I" + ROOT, src, lib] + libs + ["-lhttp_parser", "-lpthread", "-lm", "-ldl", "-o", exe],
                       check=True)
    out = subprocess.run([exe, "--peak", str(threads)], capture_output=True, text=True, check=True).stdout
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^RESULT (\S+) (\S+)$", out, re.M)}


def weight_bytes(path):
    """Bytes of the tensors a decode step reads: every matmul weight once
    (the tied embedding is the output matrix)."""
    import gguf

    r = gguf.GGUFReader(path)
    total = 0
    for t in r.tensors:
        if t.name.endswith("norm.weight"):
            continue
        total += int(t.n_bytes)
    return total


def kv_bytes_per_position(path):
    """F16 K and V bytes of one position, all layers."""
    import gguf

    r = gguf.GGUFReader(path)
    kv_dims = [int(t.shape[1]) for t in r.tensors if t.name.endswith("attn_k.weight")]
    return sum(kv_dims) * 2 * 2


def macs_per_token(path):
    import gguf

    r = gguf.GGUFReader(path)
    macs = 0
    for t in r.tensors:
        if len(t.shape) == 2 and not t.name.endswith("norm.weight"):
            macs += int(t.shape[0]) * int(t.shape[1])
    return macs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--luainfer", default=os.path.join(ROOT, "build", "luainfer"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--seqs", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--isa", default="auto",
                    help="luainfer's CPU kernels (ggml: llama.cpp's arithmetic, bit for bit)")
    results.add_options(ap)
    args = ap.parse_args()
    binary = os.path.abspath(args.luainfer)
    build_dir = os.path.dirname(binary)

    lc = LlamaCpp(args.model, args.threads)
    print(f"model: {os.path.relpath(args.model, ROOT)} ({os.path.getsize(args.model) / 1e6:.1f} MB), "
          f"{args.threads} threads, {args.rounds} rounds alternating")
    print(f"llama.cpp system info: {lc.system_info.strip()}")

    # the machine's limits, before and after (the best of the two: another
    # process on the machine only ever lowers them)
    lim = machine_limits(build_dir, args.threads)

    names = ["prefill", "decode"] + [f"batched{s}" for s in args.seqs]
    ours = {n: [] for n in names}
    theirs = {n: [] for n in names}
    rss = []
    progress = results.Progress(args.rounds, "llama_cpp rounds")
    for rnd in range(args.rounds):
        res, peak = run_luainfer_rss(binary, args.threads, args.prefill, args.decode, args.seqs, args.isa)
        rss.append(peak)
        for n in names:
            ours[n].append(res[n])
        theirs["prefill"].append(lc.prefill(args.prefill))
        theirs["decode"].append(lc.batched(1, args.decode))
        for s in args.seqs:
            theirs[f"batched{s}"].append(lc.batched(s, args.decode))
        print(f"round {rnd + 1}: " + ", ".join(f"{n} {ours[n][-1]:.0f} vs {theirs[n][-1]:.0f}" for n in names),
              flush=True)
        progress.step()
    progress.done()

    labels = {"prefill": f"prefill, {args.prefill}-token prompt", "decode": f"decode, 1 sequence x {args.decode} tokens"}
    for s in args.seqs:
        labels[f"batched{s}"] = f"batched decode, {s} sequences"
    print()
    # the rounds alternate, so a round's two numbers share the machine's
    # state: the median of per-round ratios resists drift better
    print("| measurement (tokens/s, median) | luainfer | llama.cpp | ratio of medians | median of round ratios |")
    print("| --- | ---: | ---: | ---: | ---: |")
    med = {}
    for n in names:
        a, b = statistics.median(ours[n]), statistics.median(theirs[n])
        rr = statistics.median(x / y for x, y in zip(ours[n], theirs[n]))
        med[n] = a
        print(f"| {labels[n]} | {a:.1f} | {b:.1f} | {a / b:.2f}x | {rr:.2f}x |")
    results.finish(args, {"bench": "llama_cpp", "threads": args.threads, "rounds": args.rounds,
                          "isa": args.isa, "luainfer": ours, "llama_cpp": theirs, "peak_rss": rss,
                          "median_luainfer": med,
                          "median_llama_cpp": {n: statistics.median(theirs[n]) for n in names},
                          "rows": [{"name": labels[n], "luainfer": med[n], "llama.cpp": statistics.median(theirs[n])}
                                   for n in names],
                          "chart": {"label": "name", "values": ["luainfer", "llama.cpp"], "log": True,
                                    "ylabel": "tokens/s (median over rounds)",
                                    "title": f"luainfer vs llama.cpp, {args.threads} threads, isa {args.isa}"}})

    lim = {k: max(v, lim.get(k, 0.0)) for k, v in machine_limits(build_dir, args.threads).items()}
    wb = weight_bytes(args.model)
    macs = macs_per_token(args.model)
    bw = lim.get("bw_gbs", float("nan"))
    print()
    # int8 peak: vpdpbusd zmm with AVX-512 VNNI, vpmaddubsw ymm (the AVX2 kernels' product) otherwise
    i8 = lim.get("int8_gmacs", float("nan"))
    i8name = "VNNI" if lim.get("int8_vnni") else "AVX2 vpmaddubsw"
    print(f"machine: DRAM read {bw:.1f} GB/s ({args.threads} threads), "
          f"{i8name} {i8:.0f} GMAC/s int8, FMA {lim.get('fma_gflops', float('nan')):.0f} GFLOP/s f32")
    dec = med["decode"]
    kvb = kv_bytes_per_position(args.model) * (16 + args.decode / 2)  # the mean context of the decode run
    tb = wb + kvb
    print(f"decode: {wb / 1e6:.1f} MB of weights + {kvb / 1e6:.1f} MB of F16 KV (mean context) per token x "
          f"{dec:.1f} tok/s = {tb * dec / 1e9:.1f} GB/s ({100 * tb * dec / 1e9 / bw:.0f}% of the measured DRAM bandwidth)")
    print(f"decode: {macs / 1e6:.1f} M multiply-adds per token = {macs * dec / 1e9:.1f} GMAC/s "
          f"({100 * macs * dec / 1e9 / i8:.1f}% of the {i8name} peak)")
    pf = med["prefill"]
    print(f"prefill: {macs * pf / 1e9:.0f} GMAC/s in the matmuls "
          f"({100 * macs * pf / 1e9 / i8:.0f}% of the {i8name} peak)")
    for s in args.seqs:
        t = med[f"batched{s}"]
        print(f"batched {s}: {macs * t / 1e9:.0f} GMAC/s ({100 * macs * t / 1e9 / i8:.0f}% of the {i8name} peak)")
    budget = os.path.getsize(args.model) / 2**20 + 256 + 100
    print(f"luainfer peak RSS: {max(rss):.0f} MiB (limit: model file + 256 MiB KV budget + 100 MiB = {budget:.0f} MiB)")


if __name__ == "__main__":
    main()
