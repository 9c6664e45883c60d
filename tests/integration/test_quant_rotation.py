"""The rotation transforms of bench/quant_error_sources.py (QuaRot-style: norm
folding, a residual rotation Q, an online Hadamard before down_proj) on a tiny
random Llama: each must leave the float forward unchanged (the claim the
rotation study's int8 numbers rest on), and the Hadamard and random
orthogonal matrices must be orthogonal. No model file, no binary: seconds.
"""

import sys
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "bench"))
qes = pytest.importorskip("quant_error_sources", reason="needs numpy and gguf (the .venv)")


def tiny(seed=0, n_layer=2, dim=48, n_head=4, n_kv=2, ff=96, vocab=64):
    """A random Llama with dims the constructions cover (48 = 12 x 4, 96 = 12 x 8), gammas far
    from 1 (so a fold that is skipped shows), and one large residual channel as the real one has."""
    rng = np.random.default_rng(seed)
    m = qes.Model()
    m.n_layer, m.n_head, m.n_head_kv, m.eps, m.rope_base = n_layer, n_head, n_kv, 1e-5, 10000.0
    m.dim, m.head_dim = dim, dim // n_head
    hd = dim // n_head

    def lin(o, i):
        return rng.standard_normal((o, i)) / np.sqrt(i)

    emb = rng.standard_normal((vocab, dim))
    emb[:, 7] *= 20.0
    w = {"token_embd.weight": emb, "output_norm.weight": 1 + 0.5 * rng.standard_normal(dim)}
    for l in range(n_layer):
        p = f"blk.{l}."
        w[p + "attn_norm.weight"] = 1 + 0.5 * rng.standard_normal(dim)
        w[p + "ffn_norm.weight"] = 1 + 0.5 * rng.standard_normal(dim)
        w[p + "attn_q.weight"], w[p + "attn_output.weight"] = lin(dim, dim), lin(dim, dim)
        w[p + "attn_k.weight"], w[p + "attn_v.weight"] = lin(n_kv * hd, dim), lin(n_kv * hd, dim)
        w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"] = lin(ff, dim), lin(ff, dim)
        w[p + "ffn_down.weight"] = lin(dim, ff)
    m.w, m.out = w, w["token_embd.weight"]     # tied, as SmolLM2's head is
    return m


TOKENS = [1, 5, 9, 33, 2, 60, 17, 17, 40, 3, 11, 50]


@pytest.mark.parametrize("n", [12, 24, 48, 96, 576, 1536])
def test_hadamard_orthogonal(n):
    fac = qes.hadamard_factors(n)
    full = fac[0]
    for f in fac[1:]:
        full = np.kron(full, f)
    assert full.shape == (n, n) and set(np.unique(full)) == {-1.0, 1.0}
    assert np.abs(full @ full.T - n * np.eye(n)).max() == 0      # integer arithmetic: exact
    apply, H = qes.signed_hadamard(n, np.random.default_rng(n))
    assert np.abs(H @ H.T - np.eye(n)).max() < 1e-12
    assert np.allclose(np.abs(H), 1 / np.sqrt(n))
    x = np.random.default_rng(1).standard_normal((5, n))
    assert np.abs(apply(x) - x @ H).max() < 1e-12                # the fast path is the matrix
    assert np.abs(kron_dense_check(x, fac) - qes.kron_rows(x, fac)).max() < 1e-9


def kron_dense_check(x, fac):
    full = fac[0]
    for f in fac[1:]:
        full = np.kron(full, f)
    return x @ full


def test_hadamard_orders_outside_the_construction():
    for n in (36, 40, 100):
        with pytest.raises(ValueError):
            qes.hadamard_factors(n)


def test_paley12():
    h = qes.paley12()
    assert np.array_equal(h @ h.T, 12 * np.eye(12))


def test_random_orthogonal():
    q = qes.random_orthogonal(576, np.random.default_rng(0))
    assert np.abs(q @ q.T - np.eye(576)).max() < 1e-12


def test_fold_norms_exact():
    m = tiny()
    ref = m.logits(TOKENS)
    tied = m.out is m.w["token_embd.weight"]
    qes.fold_norms(m)
    assert tied and m.out is not m.w["token_embd.weight"]       # the head was untied
    assert all(np.all(v == 1) for k, v in m.w.items() if k.endswith("norm.weight"))
    assert np.abs(m.logits(TOKENS) - ref).max() < 1e-10


@pytest.mark.parametrize("config", qes.ROT_CONFIGS)
def test_transform_exact(config):
    m = tiny()
    ref = m.logits(TOKENS)
    qes.transform(m, (dict(m.w), m.out), config, seed=3)
    assert np.abs(m.logits(TOKENS) - ref).max() < 1e-10
    if config != "none":   # and something did change
        t = tiny().w
        assert max(np.abs(m.w[k] - t[k]).max() for k in t if k.startswith("blk.1.ffn")) > 0.01


@pytest.mark.parametrize("config", ["none", "had+down"])
def test_smoothing_on_top_exact(config):
    """SmoothQuant's folds (down's divide after the online Hadamard when there is one)."""
    m = tiny()
    ref = m.logits(TOKENS)
    qes.transform(m, (dict(m.w), m.out), config, seed=3)
    amax = qes.calib_amax(m, [TOKENS])
    qes.smooth(m, None, {"qkv": 0.6, "gu": 0.4, "down": 0.8}, amax)
    assert (m.had is not None) == bool(m.down_s)
    assert np.abs(m.logits(TOKENS) - ref).max() < 1e-10


def test_rotation_without_fold_is_not_exact():
    """The checks above can fail: Q without folding the gammas first changes the model."""
    m = tiny()
    ref = m.logits(TOKENS)
    qes.rotate(m, qes.signed_hadamard(m.dim, np.random.default_rng(0))[1])
    assert np.abs(m.logits(TOKENS) - ref).max() > 1e-3


def test_rotation_flattens_the_outlier_channel():
    """What the study relies on: after Q the residual's big channel is spread over all of them."""
    m = tiny()
    m.record = {}
    m.logits(TOKENS)
    before = np.abs(np.concatenate(m.record[(0, "qkv")]))
    qes.transform(m, (dict(m.w), m.out), "had", seed=3)
    m.record = {}
    m.logits(TOKENS)
    after = np.abs(np.concatenate(m.record[(0, "qkv")]))
    peak = lambda a: (a.max(1) / np.median(a, 1)).mean()      # noqa: E731
    assert peak(after) < peak(before) / 2


def test_gptq_int8_on_grid_and_below_rtn():
    """The study's GPTQ: codes on q_int8's per-row grid, and less output error than rounding to
    nearest on the calibration rows (correlated, with one large channel)."""
    rng = np.random.default_rng(0)
    W = rng.standard_normal((24, 48)) * 0.02
    X = rng.standard_normal((400, 48)) @ rng.standard_normal((48, 48))
    X[:, 3] *= 30
    Q = qes.gptq_int8(W, X.T @ X)
    s = np.abs(W).max(1, keepdims=True) / 127
    codes = Q / s
    assert np.abs(codes - np.round(codes)).max() < 1e-9 and np.abs(codes).max() <= 127
    err = lambda V: ((X @ (V - W).T) ** 2).sum()      # noqa: E731
    assert err(Q) < 0.8 * err(qes.q_int8(W))
