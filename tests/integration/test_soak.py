"""The soak benchmark, briefly (issue 18, "how it is checked").

bench/bench_soak.py runs for ~8 s instead of minutes: one server with a
6 MiB KV budget, a witness whose greedy outputs must equal the solo run,
load, hostile policies hot-reloaded in turn with good ones between, bad
clients, disconnect bursts and cancels. It must end with no witness
mismatch, no request lost, no crash and a clean SIGTERM, and every kind of
trouble must have been tried at least once (the numbers depend on the
machine's speed; their being there does not).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_soak_briefly(luainfer_bin, model_path):
    r = subprocess.run([sys.executable, str(REPO / "bench" / "bench_soak.py"), "--bin", str(luainfer_bin),
                        "--duration", "8", "--load-clients", "1", "--reload-period", "0.5"],
                       capture_output=True, text=True, timeout=600, cwd=REPO)
    out = r.stdout
    assert r.returncode == 0 and "SOAK OK" in out, out[-4000:] + r.stderr[-2000:]
    m = re.search(r"witness: (\d+) answered, mismatches (\d+)", out)
    assert m and int(m.group(1)) > 0 and m.group(2) == "0", out[-3000:]
    assert re.search(r"requests lost: 0 .*server crashes: 0 .*SIGTERM exit status: 0 ", out), out[-3000:]
    counts = dict(re.findall(r"^  (\S[^\n]*?)\s{2,}(\d+)$", out, re.M))
    for kind in ["reload.hostile.ok", "reload.good.ok", "disconnect.dropped", "cancel.sent", "load.ok"]:
        assert int(counts.get(kind, 0)) > 0, (kind, out[-3000:])
    assert sum(int(v) for k, v in counts.items() if k.startswith("bad.")) > 0, out[-3000:]
    for section in ["RSS: start", "stats (end, change since start):", "/metrics (end, change since start):",
                    "engine.preemptions", "luainfer_policy_errors_total"]:
        assert section in out, (section, out[-3000:])
