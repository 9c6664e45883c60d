"""Structured OBS (`prune --rank obs`, `--refit`; core/prune/prune_obs.c)
against a plain float64 NumPy transcription of the algorithm, written from
the papers: Hassibi & Stork 1993 ("Optimal Brain Surgeon") for the
elimination, Kurtic et al. 2023 ("ZipLM") for removing whole structures
greedily. For a linear y = W x with calibration inputs X and H = X^T X
(damped), removing a unit's columns S costs tr(W_S (Hinv_SS)^-1 W_S^T), moves
W by -W_S (Hinv_SS)^-1 Hinv[S, :], and eliminates S from Hinv.

Two further checks that do not share the transcription's steps:
  * the weights the greedy elimination ends with are the least-squares
    refit for the final set, W H[:, K] H[K, K]^-1 (a direct solve);
  * the removed units' costs at their turns sum to the final output error
    tr((W' - W) H (W' - W)^T).

The C side runs through the obs_driver binary (built beside luainfer), on
random layers of odd shapes with a few large and some correlated input
channels, a dead channel, and fewer calibration rows than inputs (where
only the damping keeps H invertible).
"""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def driver():
    bin_ = Path(os.environ.get("LUAINFER_BIN", REPO_ROOT / "build" / "luainfer"))
    path = bin_.parent / "obs_driver"
    if not path.is_file():
        pytest.skip(f"obs_driver not found at {path} (build it)")
    return path


def make_layer(seed, d_out, n, rows, dead=()):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((d_out, n)) * 0.05).astype(np.float32)
    x = rng.standard_normal((rows, n))
    big = rng.choice(n, 3, replace=False)
    x[:, big] *= rng.uniform(5, 30, 3)
    x += 0.4 * rng.standard_normal((rows, 1)) * rng.standard_normal(n)  # correlated inputs
    x[:, list(dead)] = 0
    return w, x.astype(np.float32)


def run_driver(driver, tmp_path, w, x, width, k, damp, drop=None):
    d, n = w.shape
    units = n // width
    inp, out = tmp_path / "in.bin", tmp_path / "out.bin"
    given = np.zeros(units, np.uint8) if drop is None else np.asarray(drop, np.uint8)
    with open(inp, "wb") as f:
        f.write(np.array([d, n, x.shape[0], width, k, int(drop is None)], "<i8").tobytes())
        f.write(np.array([damp], "<f8").tobytes())
        f.write(w.astype("<f4").tobytes() + x.astype("<f4").tobytes() + given.tobytes())
    p = subprocess.run([str(driver), str(inp), str(out)], capture_output=True, text=True, timeout=60)
    if p.returncode:
        return None, p.stderr.strip()
    b = out.read_bytes()
    wo = np.frombuffer(b[: 8 * d * n], "<f8").reshape(d, n)
    dr = np.frombuffer(b[8 * d * n : 8 * d * n + units], np.uint8).astype(bool)
    sc = np.frombuffer(b[8 * d * n + units :], "<f8")
    return (wo, dr, sc), ""


def damped_hessian(x, damp):
    """X^T X with a dead input's diagonal set to the mean diagonal, then
    damp x the mean added to the whole diagonal."""
    x = x.astype(np.float64)
    h = x.T @ x
    mean = np.mean(np.diag(h))
    dg = np.diag(h).copy()
    dg[dg == 0] = mean if mean > 0 else 1.0
    h[np.diag_indices_from(h)] = dg + damp * mean
    return h


def obs_numpy(w, x, width, k, damp, given=None):
    """The transcription: greedy removal of the cheapest unit (ties: the
    lower index), or the given units in index order."""
    w = w.astype(np.float64).copy()
    hinv = np.linalg.inv(damped_hessian(x, damp))
    units = w.shape[1] // width
    removed, scores = [], np.zeros(units)
    order = None if given is None else [u for u in range(units) if given[u]]

    def cols(u):
        return slice(u * width, (u + 1) * width)

    def cost(u):
        s = cols(u)
        return float(np.trace(w[:, s] @ np.linalg.inv(hinv[s, s]) @ w[:, s].T))

    for step in range(k):
        if order is None:
            cand = [(cost(u), u) for u in range(units) if u not in removed]
            u = min(cand)[1]
        else:
            u = order[step]
        s = cols(u)
        m = np.linalg.inv(hinv[s, s])
        scores[u] = cost(u)
        w -= w[:, s] @ m @ hinv[s, :]
        hinv -= hinv[:, s] @ m @ hinv[s, :]
        w[:, s] = 0
        removed.append(u)
    for u in range(units):
        if u not in removed:
            scores[u] = cost(u)
    drop = np.zeros(units, bool)
    drop[removed] = True
    return w, drop, scores


def least_squares(w, x, width, drop, damp):
    """The refit for a final set, directly: W H[:, K] H[K, K]^-1."""
    h = damped_hessian(x, damp)
    keep = np.repeat(~drop, width)
    out = np.zeros(w.shape)
    out[:, keep] = np.linalg.solve(h[np.ix_(keep, keep)], (w.astype(np.float64) @ h[:, keep]).T).T
    return out


CASES = [
    # (seed, d_out, n, rows, width, k, damp, dead)
    (1, 13, 37, 300, 1, 11, 0.01, ()),
    (2, 9, 61, 40, 1, 29, 0.01, (5, 17)),  # fewer rows than inputs; two dead inputs
    (3, 11, 35, 200, 5, 3, 0.01, ()),  # units of 5 columns (KV groups)
    (4, 7, 48, 30, 16, 1, 0.1, (3,)),  # 3 units of 16, fewer rows than inputs
]


@pytest.mark.parametrize("case", CASES, ids=[f"n{c[2]}-w{c[4]}-k{c[5]}" for c in CASES])
def test_obs_matches_numpy(driver, tmp_path, case):
    seed, d, n, rows, width, k, damp, dead = case
    w, x = make_layer(seed, d, n, rows, dead)
    got, err = run_driver(driver, tmp_path, w, x, width, k, damp)
    assert got is not None, err
    wc, dc, sc = got
    wn, dn, sn = obs_numpy(w, x, width, k, damp)
    assert dc.sum() == k
    assert (dc == dn).all(), f"removed: C {np.flatnonzero(dc)}, numpy {np.flatnonzero(dn)}"
    scale = np.abs(w).max()
    np.testing.assert_allclose(wc, wn, rtol=0, atol=1e-9 * scale * 1e3)
    np.testing.assert_allclose(sc, sn, rtol=1e-7, atol=1e-12)
    # removed columns exactly zero; the rest the direct least-squares refit
    assert (wc[:, np.repeat(dc, width)] == 0).all()
    np.testing.assert_allclose(wc, least_squares(w, x, width, dc, damp), rtol=0, atol=1e-8 * scale * 1e3)
    # the costs at each turn add up to the final output error
    dw = wc - w.astype(np.float64)
    total = float(np.trace(dw @ damped_hessian(x, damp) @ dw.T))
    assert sc[dc].sum() == pytest.approx(total, rel=1e-7)
    # greedy is not worse than removing the lowest-|W| units with the same refit
    norms = np.array([np.linalg.norm(w[:, u * width:(u + 1) * width]) for u in range(n // width)])
    naive = np.zeros(n // width, bool)
    naive[np.argsort(norms, kind="stable")[:k]] = True
    dn_w = least_squares(w, x, width, naive, damp) - w
    assert total <= float(np.trace(dn_w @ damped_hessian(x, damp) @ dn_w.T)) * (1 + 1e-9)


def test_refit_of_given_units(driver, tmp_path):
    """choose = 0 (`--refit` after another ranking): the marked units go,
    the rest is the least-squares refit."""
    w, x = make_layer(7, 10, 45, 120)
    given = np.zeros(45, bool)
    given[[0, 3, 4, 20, 44]] = True
    got, err = run_driver(driver, tmp_path, w, x, 1, 5, 0.01, given)
    assert got is not None, err
    wc, dc, _ = got
    assert (dc == given).all()
    wn, _, _ = obs_numpy(w, x, 1, 5, 0.01, given)
    np.testing.assert_allclose(wc, wn, rtol=0, atol=1e-9)
    np.testing.assert_allclose(wc, least_squares(w, x, 1, given, 0.01), rtol=0, atol=1e-9)


@pytest.mark.parametrize("width,k,msg", [(4, 0, "not whole units"), (1, 30, "cannot remove 30 of 30")])
def test_obs_errors(driver, tmp_path, width, k, msg):
    w, x = make_layer(9, 5, 30, 50)  # 30 columns: not whole units of 4
    got, err = run_driver(driver, tmp_path, w, x, width, k, 0.01)
    assert got is None and msg in err, err


def test_obs_nan_weights(driver, tmp_path):
    w, x = make_layer(11, 4, 12, 30)
    w[:] = np.nan
    got, err = run_driver(driver, tmp_path, w, x, 1, 3, 0.01)
    assert got is None and "no finite removal cost" in err, err


# ---------------------------------------------------------------------------
# --ffn-alloc (core/prune/prune_alloc.c): each block's error curve and the
# greedy allocation, against direct transcriptions
# ---------------------------------------------------------------------------

def run_curve(driver, tmp_path, w, x, score, damp):
    d, n = w.shape
    inp, out = tmp_path / "cin.bin", tmp_path / "cout.bin"
    with open(inp, "wb") as f:
        f.write(np.array([d, n, x.shape[0]], "<i8").tobytes() + np.array([damp], "<f8").tobytes())
        f.write(w.astype("<f4").tobytes() + x.astype("<f4").tobytes() + np.asarray(score, "<f8").tobytes())
    p = subprocess.run([str(driver), "curve", str(inp), str(out)], capture_output=True, text=True, timeout=60)
    if p.returncode:
        return None, p.stderr.strip()
    return np.frombuffer(out.read_bytes(), "<f8"), ""


def test_ffn_curve_is_the_refit_error(driver, tmp_path):
    """E(k) for every k: keeping the k highest-scoring channels (ties: the
    higher index, as li_prune_lowest keeps them) and refitting their columns by a direct least-squares solve
    on the damped Gram, the error tr((W - W') H (W - W')^T); no Cholesky,
    no reuse between k, as the formula's derivation would suggest."""
    w, x = make_layer(13, 9, 37, 60, dead=(5,))  # fewer rows than inputs: only the damping keeps H definite
    rng = np.random.default_rng(3)
    score = rng.uniform(0, 1, 37)
    score[[2, 9]] = score[4]  # ties
    damp = 0.01
    got, err = run_curve(driver, tmp_path, w, x, score, damp)
    assert got is not None, err
    h = damped_hessian(x, damp)
    wd = w.astype(np.float64)
    order = sorted(range(37), key=lambda j: (-score[j], -j))
    want = []
    for k in range(38):
        keep = order[:k]
        wn = np.zeros_like(wd)
        if k:
            wn[:, keep] = np.linalg.solve(h[np.ix_(keep, keep)], (wd @ h[:, keep]).T).T
        e = wd - wn
        want.append(np.trace(e @ h @ e.T))
    want = np.array(want)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * want[0])
    assert got[-1] == 0 and (np.diff(got) <= 1e-9 * want[0]).all()  # more kept never costs more


def test_ffn_allocate_greedy(driver, tmp_path):
    """The allocation against a transcription of its rule: `unit` channels
    at a time (the last step the remainder) from the block whose curve rises
    least over its sig, none below floor, ties to the lower block."""
    rng = np.random.default_rng(5)
    nl, n, unit, floor, remove = 5, 40, 8, 12, 70
    curves = np.cumsum(rng.uniform(0, 1, (nl, n + 1))[:, ::-1], axis=1)[:, ::-1].copy()
    curves[:, -1] = 0
    curves[2] *= 50  # a block whose channels all matter
    sig = rng.uniform(1, 3, nl)
    inp, out = tmp_path / "ain.bin", tmp_path / "aout.bin"
    inp.write_bytes(np.array([nl, n, unit, floor, remove], "<i8").tobytes() + sig.astype("<f8").tobytes()
                    + curves.astype("<f8").tobytes())
    p = subprocess.run([str(driver), "allocate", str(inp), str(out)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    got = np.frombuffer(out.read_bytes(), "<i8")
    keep, left = [n] * nl, remove
    while left > 0:
        step = min(unit, left)
        costs = [(curves[l][keep[l] - step] - curves[l][keep[l]]) / sig[l] if keep[l] - step >= floor else np.inf
                 for l in range(nl)]
        best = int(np.argmin(costs))
        keep[best] -= step
        left -= step
    assert list(got) == keep and sum(got) == nl * n - remove and got[2] == n, (list(got), keep)
    # more than the floors allow: one clear line
    inp.write_bytes(np.array([nl, n, unit, floor, nl * (n - floor) + 1], "<i8").tobytes()
                    + sig.astype("<f8").tobytes() + curves.astype("<f8").tobytes())
    p = subprocess.run([str(driver), "allocate", str(inp), str(out)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "cannot go with every block keeping at least 12" in p.stderr, p.stderr
