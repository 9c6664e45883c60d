"""Losslessness of speculative verification (core/spec/verify.c), tested statistically.

The C driver build/test_spec_verify (tests/unit/test_spec_verify.c) runs the
experiment and prints its counts as JSON; this file does the statistics with
scipy and a float64 NumPy transcription of the rules.

The experiment: a vocabulary of 8, a known Markov target p(y | x) and a
deliberately different Markov draft q(y | x), each with zeros of its own (q
proposes ids p never emits, p emits ids q never proposes). Each step drafts
from the last emitted token (a chain of k drafts, or a tree of width 3 and
depth 4), the verifier decides, and the emitted tokens are appended. If the
rule is lossless the emitted sequence is the Markov chain p itself: given
everything before it, each emitted y after x is distributed as p(. | x), at
every position of a step (first token, later drafts, the bonus token). So the
transition counts, split by the position in the step, are tested with a
chi-square goodness-of-fit test against p (Anderson and Goodman's test for
Markov chains; rows with an expected cell under 5 are pooled per x):
10^6 tokens per case, a fixed seed, so the outcome is deterministic.

- correct rules (chains k = 1..4 sampled and deterministic, a sampled tree, a
  deterministic tree, one with duplicate children) pass at ALPHA;
- the deliberately wrong rules of the driver (a residual taken from p, the
  bonus from the wrong row, siblings tried against p instead of the residual,
  deterministic siblings not renormalised) and Medusa's typical acceptance
  (not lossless by design) fail by a huge margin (p < WRONG_P or an
  impossible transition);
- the same seed gives the same tokens;
- a float64 NumPy transcription of the chain and tree rules, fed the same
  uniforms, accepts the same drafts and emits the same token.

Environment: LUAINFER_BIN (default build/luainfer): the driver is looked up
next to it, or at LUAINFER_TEST_SPEC_VERIFY.
"""

import functools
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

stats = pytest.importorskip("scipy.stats", reason="scipy is needed for chi-square p-values "
                            "(tools/requirements-test.txt)")

REPO_ROOT = Path(__file__).resolve().parents[2]
TOKENS = 1_000_000
SEED = 20260101
ALPHA = 1e-4     # a correct rule must not be rejected at this level
WRONG_P = 1e-30  # a wrong rule must be rejected at least this strongly


def driver_path():
    env = os.environ.get("LUAINFER_TEST_SPEC_VERIFY")
    if env:
        return Path(env)
    return Path(os.environ.get("LUAINFER_BIN", REPO_ROOT / "build" / "luainfer")).parent / "test_spec_verify"


@pytest.fixture(scope="module")
def driver():
    path = driver_path()
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.skip(f"test driver not found: {path} (build the test_spec_verify target, "
                    "or set LUAINFER_TEST_SPEC_VERIFY)")
    return path


@functools.lru_cache(maxsize=None)
def experiment(driver, case):
    """The counts of one case at TOKENS and SEED (run once per session)."""
    return run_driver(driver, "--stats", case, "--tokens", TOKENS, "--seed", SEED)


def run_driver(driver, *args):
    r = subprocess.run([str(driver), *map(str, args)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{driver} {args}: exit {r.returncode}\n{r.stderr[-2000:]}"
    return json.loads(r.stdout)


def list_cases():
    path = driver_path()
    if not path.is_file():
        return [], []
    out = subprocess.run([str(path), "--list"], capture_output=True, text=True, timeout=30).stdout.split("\n")
    rows = [line.split() for line in out if line.strip()]
    return [r[0] for r in rows if len(r) == 1], [r[0] for r in rows if len(r) == 2]


LOSSLESS, WRONG = list_cases()


# ---------------------------------------------------------------------------
# The chi-square test of the transitions
# ---------------------------------------------------------------------------
def transition_test(res):
    """(chi2, df, p-value, impossible) of the counts[slot][x][y] against the target."""
    target = np.array(res["target"], dtype=np.float32).astype(np.float64)
    target /= target.sum(axis=1, keepdims=True)
    counts = np.array(res["counts"], dtype=np.int64)  # (slots, V, V)
    chi, df, impossible = 0.0, 0, 0
    for x in range(target.shape[0]):
        support = target[x] > 0
        pmin = target[x][support].min()
        pool = np.zeros(target.shape[1], dtype=np.int64)
        rows = []
        for s in range(counts.shape[0]):
            row = counts[s, x]
            if row.sum() * pmin < 5:
                pool += row
            else:
                rows.append(row)
        if pool.sum() * pmin >= 5:
            rows.append(pool)
        for row in rows:
            impossible += int(row[~support].sum())
            expected = row.sum() * target[x][support]
            chi += float((((row[support] - expected) ** 2) / expected).sum())
            df += int(support.sum()) - 1
    return chi, df, float(stats.chi2.sf(chi, df)), impossible


def describe(res, chi, df, p, impossible):
    per_step = res["accepted"] / res["steps"]
    return (f"{res['case']:28s} tokens {res['tokens']} steps {res['steps']} accepted/step {per_step:.3f} "
            f"chi2 {chi:10.1f} df {df:3d} p {p:.3g} impossible {impossible}")


@pytest.mark.skipif(not LOSSLESS, reason="test driver not built")
@pytest.mark.parametrize("case", LOSSLESS)
def test_lossless(driver, case):
    res = experiment(driver, case)
    counts = np.array(res["counts"])
    assert res["tokens"] >= TOKENS and counts.sum() == res["tokens"]
    chi, df, p, impossible = transition_test(res)
    print(describe(res, chi, df, p, impossible))
    assert impossible == 0, f"{case}: emitted {impossible} transitions of target probability 0"
    assert p > ALPHA, f"{case}: the emitted tokens do not follow the target (chi2 {chi:.1f}, df {df}, p {p:.3g})"
    # drafts must actually be accepted, or the test would only see the residual
    assert res["accepted"] / res["steps"] > 0.3, f"{case}: too few accepted drafts to test them"


@pytest.mark.skipif(not WRONG, reason="test driver not built")
@pytest.mark.parametrize("case", WRONG)
def test_wrong_rule_rejected(driver, case):
    res = experiment(driver, case)
    chi, df, p, impossible = transition_test(res)
    print(describe(res, chi, df, p, impossible))
    assert impossible > 0 or p < WRONG_P, f"{case}: a wrong rule passed (chi2 {chi:.1f}, df {df}, p {p:.3g})"


def test_first_token_alone_misses_the_bonus_error(driver):
    """Why the joint test: the wrong-bonus rule leaves the first token of each
    step right; only transitions at later positions show it."""
    res = experiment(driver, "wrong-chain-bonus")
    first = dict(res, counts=res["counts"][:1])
    chi, df, p, impossible = transition_test(first)
    print(describe(first, chi, df, p, impossible))
    assert impossible == 0 and p > ALPHA
    chi, df, p, impossible = transition_test(res)
    assert impossible > 0 or p < WRONG_P


def test_same_seed_same_tokens(driver):
    for case in ("chain-sampled-k3", "tree-sampled", "tree-det"):
        a = run_driver(driver, "--stats", case, "--tokens", 100_000, "--seed", 7)
        b = run_driver(driver, "--stats", case, "--tokens", 100_000, "--seed", 7)
        c = run_driver(driver, "--stats", case, "--tokens", 100_000, "--seed", 8)
        assert a["hash"] == b["hash"] and a["counts"] == b["counts"] and a["uniforms"] == b["uniforms"], case
        assert a["hash"] != c["hash"], case


# ---------------------------------------------------------------------------
# A float64 NumPy transcription of the rules, the same uniforms in
# ---------------------------------------------------------------------------
def draw(row, u):
    """Inverse CDF in id order: the first id whose cumulative mass exceeds u."""
    row = np.asarray(row, dtype=np.float64)
    cum = np.cumsum(row / row.sum())
    i = int(np.searchsorted(cum, u, side="right"))
    nz = np.nonzero(row > 0)[0]
    return int(i) if i < len(row) and row[i] > 0 else int(nz[-1])


def chain_ref(p, q, d, uniforms):
    """Leviathan et al. 2023, Algorithm 1; q None: a point mass on each draft."""
    u = iter(uniforms)
    for j, x in enumerate(d):
        px = p[j][x]
        qx = q[j][x] if q is not None else 1.0
        ratio = px / qx if qx > 0 else (np.inf if px > 0 else 0.0)
        if next(u) < min(1.0, ratio):
            continue
        if q is not None:
            r = np.maximum(p[j] - q[j], 0.0)
        else:
            r = p[j].copy()
            r[x] = 0.0
        if r.sum() <= 0:
            r = p[j]
        return j, [], draw(r, next(u)), len(uniforms) - sum(1 for _ in u)
    return len(d), [], draw(p[len(d)], next(u)), len(uniforms) - sum(1 for _ in u)


def tree_ref(p, q, token, parent, uniforms):
    """SpecInfer's multi-step speculative sampling, normalising the residual each time."""
    u = iter(uniforms)
    path, c = [], -1
    while True:
        base = p[c + 1] / p[c + 1].sum()
        r = base.copy()
        accepted = None
        for i in [i for i in range(c + 1, len(token)) if parent[i] == c]:
            x = token[i]
            ui = next(u)
            if q is not None:
                qx = q[c + 1][x]
                ratio = r[x] / qx if qx > 0 else (np.inf if r[x] > 0 else 0.0)
                if ui < min(1.0, ratio):
                    accepted = i
                    break
                r = np.maximum(r - q[c + 1], 0.0)
            else:
                if ui < r[x]:
                    accepted = i
                    break
                r[x] = 0.0
            r = r / r.sum() if r.sum() > 0 else base.copy()
        if accepted is None:
            return len(path), path, draw(r, next(u)), len(uniforms) - sum(1 for _ in u)
        path.append(accepted)
        c = accepted


def test_numpy_transcription(driver):
    draws = run_driver(driver, "--draws", 400, "--seed", 5)
    kinds = set()
    for t, rec in enumerate(draws):
        p = np.array(rec["p"], dtype=np.float32).astype(np.float64)
        q = np.array(rec["q"], dtype=np.float32).astype(np.float64) if rec["sampled"] else None
        if rec["tree"]:
            want = tree_ref(p, q, rec["token"], rec["parent"], rec["uniforms"])
        else:
            want = chain_ref(p, q, rec["token"], rec["uniforms"])
        got = (rec["accepted"], rec["path"], rec["next"], len(rec["uniforms"]))
        assert got == want, f"draw {t}: C (accepted, path, next, uniforms) {got} != NumPy {want}\n{rec}"
        kinds.add((rec["tree"], rec["sampled"], want[0] == rec["n"]))
    # every kind of call, with and without a rejection, was compared
    assert len(kinds) == 8, kinds
