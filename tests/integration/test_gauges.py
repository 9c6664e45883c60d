"""The Gateway API Inference Extension's gauges in /metrics (issue 16,
"Beyond one machine"), scraped under load: with more requests than
--max-num-seqs the queue gauge goes above 0, the running gauge never
exceeds --max-num-seqs and reaches it, KV usage rises above 0 and falls
back to 0 when the work is done; vLLM's names carry the same values as
luainfer's in every scrape; the picker's cache_config_info has the block
size."""

import re
import threading
import time
import urllib.request

import pytest

from test_server import PROMPTS, THREADS, Rpc, Server, serve_bin  # noqa: F401 (fixture)

MAX_SEQS = 2
N_REQ = 6


def scrape(addr):
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=30) as r:
        text = r.read().decode()
    vals = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$", line)
        if m:
            vals[m.group(1)] = (float(m.group(3)), m.group(2) or "")
    return vals


def test_gauges_move_as_documented(serve_bin, tmp_path):
    s = Server(serve_bin, ["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--threads", THREADS,
                           "--kv-memory", "16M", "--max-num-seqs", str(MAX_SEQS)], 2, tmp_path)
    try:
        idle = scrape(s.http)
        assert idle["vllm:num_requests_waiting"][0] == 0 and idle["vllm:num_requests_running"][0] == 0
        assert idle["vllm:kv_cache_usage_perc"][0] == 0
        assert 'block_size="16"' in idle["vllm:cache_config_info"][1]
        assert 'model_name="' in idle["vllm:num_requests_running"][1]

        results, errors = [], []

        def client(i):
            try:
                results.append(Rpc(s.rpc, timeout=300).ok("generate", {
                    "prompt": PROMPTS[i % len(PROMPTS)] + " " * i, "max_tokens": 60, "ignore_eos": True,
                    "temperature": 0}))
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(repr(e))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(N_REQ)]
        for t in threads:
            t.start()
        seen = []
        deadline = time.time() + 300
        while any(t.is_alive() for t in threads):
            assert time.time() < deadline, "the load never finished"
            m = scrape(s.http)
            w, r, kv = (m[k][0] for k in ("vllm:num_requests_waiting", "vllm:num_requests_running",
                                          "vllm:kv_cache_usage_perc"))
            # vLLM's names carry luainfer's values, in the same scrape
            assert (w, r, kv) == (m["luainfer_requests_queued"][0], m["luainfer_requests_running"][0],
                                  m["luainfer_kv_usage_ratio"][0])
            assert m["vllm:gpu_cache_usage_perc"][0] == kv
            assert 0 <= kv <= 1 and 0 <= r <= MAX_SEQS and w >= 0, (w, r, kv)
            seen.append((w, r, kv))
            time.sleep(0.02)
        for t in threads:
            t.join()
        assert not errors and len(results) == N_REQ, errors
        assert max(w for w, _, _ in seen) > 0, f"the queue never showed: {seen[:20]}"
        assert max(r for _, r, _ in seen) == MAX_SEQS, seen[:20]
        assert max(kv for _, _, kv in seen) > 0, seen[:20]
        # and back to idle once everything finished
        deadline = time.time() + 30
        while True:
            m = scrape(s.http)
            if (m["vllm:num_requests_waiting"][0], m["vllm:num_requests_running"][0],
                    m["vllm:kv_cache_usage_perc"][0]) == (0, 0, 0):
                break
            assert time.time() < deadline, m
            time.sleep(0.1)
    finally:
        assert s.stop() == 0, s.stderr()[-2000:]
