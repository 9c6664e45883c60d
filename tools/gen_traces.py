#!/usr/bin/env python3
"""gen_traces.py — writes the arrival traces of bench/traces/ (the policy
lab's workloads, replayed by `luainfer bench replay`). Deterministic: a fixed
seed per trace, so running it again gives the same files byte for byte.

    .venv/bin/python tools/gen_traces.py [OUT_DIR]     (default bench/traces)

One JSON object per line, in arrival order:
    {"t": 1.234,              arrival, seconds from the trace's start
     "prompt": "...",         the prompt text (or "prompt_len": N: N synthetic tokens)
     "max_tokens": 87,        output length (replayed with ignore_eos, so exact)
     "tenant": "a",           optional
     "priority": 0,           optional, larger = more important
     "slo_ttft_ms": 2000,     optional SLOs: time to first token, time per output token
     "slo_tpot_ms": 200}

The traces, sized for a 135M model on 2 CPU cores (a few hundred tokens/s
batched) so that --rate-scale 1 is a moderate load and 2-4 saturates:
  poisson      Poisson arrivals, 1.5 req/s, 96 requests; prompts 24..256
               tokens and outputs 16..256 tokens, both log-uniform (chat
               shaped: most short, a few long), as ShareGPT-like traces are.
  bursty       on/off: bursts of 2 s at 8 req/s, then 6 s of silence
               (a two-state modulated Poisson process, the shape production
               traces such as Azure's LLM inference traces show), 96 requests.
  multitenant  Poisson 1.5 req/s, 96 requests, three tenants: "heavy" sends
               60% of the requests with outputs 128..256, "b" and "c" 20%
               each with outputs 16..64.
  rag          Poisson 1 req/s, 64 requests, each one of 4 documents of
               ~400 tokens (paragraphs of tests/data/alice_ch1.txt, public
               domain) followed by a short question: long shared prefixes.
Prompts other than rag's are words drawn from a fixed list; their token
counts are what matters. SLOs: TTFT 2 s and TPOT 200 ms for every request.
"""
import json
import math
import os
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORDS = ("data engine river policy cache block stream token lua kernel batch queue model vector prefix server "
         "market town grew slowly while merchants traded grain salt under bright lanterns every evening").split()
SLO = {"slo_ttft_ms": 2000, "slo_tpot_ms": 200}


def loguniform(rng, lo, hi):
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def words(rng, n_tokens):
    # these words are one token each (with their leading space) for the
    # SmolLM2 tokenizer, within a few: a prompt of n words is ~n tokens
    return " ".join(rng.choice(WORDS) for _ in range(n_tokens))


def poisson_times(rng, rate, n):
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def poisson(rng):
    reqs = []
    for t in poisson_times(rng, 1.5, 96):
        reqs.append({"t": t, "prompt": words(rng, loguniform(rng, 24, 256)),
                     "max_tokens": loguniform(rng, 16, 256), **SLO})
    return reqs


def bursty(rng):
    reqs, t, burst_end = [], 0.0, 2.0
    while len(reqs) < 96:
        t += rng.expovariate(8.0)
        if t >= burst_end:  # the burst is over: 6 s of silence, then the next one
            t = burst_end + 6.0
            burst_end = t + 2.0
            continue
        reqs.append({"t": t, "prompt": words(rng, loguniform(rng, 24, 256)),
                     "max_tokens": loguniform(rng, 16, 256), **SLO})
    return reqs


def multitenant(rng):
    reqs = []
    for t in poisson_times(rng, 1.5, 96):
        u = rng.random()
        tenant = "heavy" if u < 0.6 else ("b" if u < 0.8 else "c")
        out = loguniform(rng, 128, 256) if tenant == "heavy" else loguniform(rng, 16, 64)
        reqs.append({"t": t, "prompt": words(rng, loguniform(rng, 24, 128)), "max_tokens": out,
                     "tenant": tenant, **SLO})
    return reqs


def rag(rng):
    text = (REPO / "tests" / "data" / "alice_ch1.txt").read_text()
    paras = [p.strip().replace("\n", " ") for p in text.split("\n\n") if len(p.split()) > 40]
    docs = []
    i = 0
    for _ in range(4):  # ~300 words (~400 tokens) of consecutive paragraphs each
        d = []
        while sum(len(p.split()) for p in d) < 300:
            d.append(paras[i % len(paras)])
            i += 1
        docs.append("Document:\n" + "\n".join(d) + "\n\nQuestion: ")
    questions = ["What happens next?", "Who is mentioned first?", "Summarise it in one line.",
                 "Where does this take place?", "What is the mood?", "List three objects named."]
    reqs = []
    for t in poisson_times(rng, 1.0, 64):
        reqs.append({"t": t, "prompt": rng.choice(docs) + rng.choice(questions) + "\nAnswer:",
                     "max_tokens": rng.randint(32, 64), **SLO})
    return reqs


TRACES = {"poisson": (poisson, 1), "bursty": (bursty, 2), "multitenant": (multitenant, 3), "rag": (rag, 4)}


def main(argv):
    out = Path(argv[1]) if len(argv) > 1 else REPO / "bench" / "traces"
    out.mkdir(parents=True, exist_ok=True)
    for name, (fn, seed) in TRACES.items():
        reqs = fn(random.Random(seed))
        lines = []
        for r in reqs:
            r = dict(r, t=round(r["t"], 3))
            lines.append(json.dumps(r, sort_keys=True, ensure_ascii=False))
        tmp = out / f".{name}.jsonl.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, out / f"{name}.jsonl")
        print(f"{name}: {len(reqs)} requests over {reqs[-1]['t']:.1f} s -> {out / (name + '.jsonl')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
