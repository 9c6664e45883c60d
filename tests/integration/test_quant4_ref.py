"""The 4-bit quantizers (core/quant/) against plain float64 NumPy
transcriptions of the published algorithms, written from the papers:

  GPTQ: Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for
        Generative Pre-trained Transformers", Algorithm 1 (lazy batches of
        B = 128 columns, Cholesky of the inverse Hessian), with the paper's
        grouping: a group's scale and zero point are fixed from the current
        (error-updated) weights when its first column is reached; act-order
        sorts the columns by decreasing diag(H) and groups the permuted order.
  AWQ:  Lin et al. 2023, "AWQ: Activation-aware Weight Quantization for LLM
        Compression and Acceleration", section 3.2-3.3: s = s_X^a, a on a
        grid in [0, 1], the exponent with the lowest output error
        ||Q(W diag(s)) (diag(s)^-1 X^T) - W X^T||; then the clipping search
        (the range of each group shrunk where that lowers its output error).
  RTN:  min / max per group (0 always in range), 15 steps, zero points.

The C side runs through the quant4_driver binary (built beside luainfer).
Both sides round codes half to even and quantize with the f32 scale that is
stored; NumPy sums in other orders (BLAS), so codes may differ where a value
lies within rounding of a code boundary: every difference is counted and
bounded below, and the tests print the counts.

Layers are random with odd shapes (n_out 37; n_in 256 and 384; groups 128
and 64), calibration rows with a few large activation channels (as the real
model has), and some dead input channels for GPTQ.
"""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def driver():
    env = os.environ.get("QUANT4_DRIVER")
    if env:
        path = Path(env)
    else:
        bin_ = Path(os.environ.get("LUAINFER_BIN", REPO_ROOT / "build" / "luainfer"))
        path = bin_.parent / "quant4_driver"
    if not path.is_file():
        pytest.skip(f"quant4_driver not found at {path} (build it, or set QUANT4_DRIVER)")
    return path


# ---------------------------------------------------------------------------
# layers
# ---------------------------------------------------------------------------
def make_layer(seed, n_out, n_in, n_rows, n_big=4, n_dead=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n_out, n_in)) * 0.05).astype(np.float32)
    x = rng.standard_normal((n_rows, n_in))
    big = rng.choice(n_in, n_big, replace=False)
    x[:, big] *= rng.uniform(10, 40, n_big)  # a few channels with large activations
    x += 0.3 * rng.standard_normal((n_rows, 1)) * rng.standard_normal(n_in)  # correlated inputs
    if n_dead:
        x[:, rng.choice(n_in, n_dead, replace=False)] = 0.0
    return w, x.astype(np.float32)


def run_c(driver, tmp_path, method, w, x, *opts, in_scale=None):
    inp, out = tmp_path / "in.bin", tmp_path / "out.bin"
    n_out, n_in = w.shape
    with open(inp, "wb") as f:
        f.write(np.array([n_out, n_in, x.shape[0]], dtype="<i8").tobytes())
        f.write(w.astype("<f4").tobytes())
        f.write(x.astype("<f4").tobytes())
        if in_scale is not None:
            f.write(in_scale.astype("<f4").tobytes())
            opts = (*opts, "--in-scale")
    p = subprocess.run([str(driver), method, str(inp), str(out), *map(str, opts)], capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    b = out.read_bytes()
    off = 0

    def take(dtype, count):
        nonlocal off
        a = np.frombuffer(b, dtype=dtype, count=count, offset=off)
        off += a.nbytes
        return a

    ng, has_z, has_p, has_s = take("<i8", 4)
    r = {"codes": take("u1", n_out * n_in).reshape(n_out, n_in),
         "scales": take("<f4", n_out * ng).reshape(n_out, ng)}
    r["zeros"] = take("<f4", n_out * ng).reshape(n_out, ng) if has_z else None
    r["perm"] = take("<i4", n_in) if has_p else None
    r["act_scale"] = take("<f4", n_in) if has_s else None
    r["alpha"], r["loss"], r["err"], r["err_rtn"] = take("<f8", 4)
    assert off == len(b)
    return r


# ---------------------------------------------------------------------------
# NumPy transcriptions (float64)
# ---------------------------------------------------------------------------
def f32(v):
    """The f32 value a stored scale has, back in float64."""
    return np.asarray(v, dtype=np.float32).astype(np.float64)


def group_params(v, sym):
    """Scale and zero of each row of v (rows, group)."""
    if sym:
        amax = np.abs(v).max(axis=1)
        scale = np.where(amax > 0, f32(amax / 7.0), 1.0)
        return scale, np.full_like(scale, 8.0)
    lo = np.minimum(v.min(axis=1), 0.0)
    hi = np.maximum(v.max(axis=1), 0.0)
    scale = np.where(hi > lo, f32((hi - lo) / 15.0), 1.0)
    zero = np.clip(np.round(-lo / scale), 0, 15)
    return scale, zero


def quant(v, scale, zero):
    return np.clip(np.round(v / scale) + zero, 0, 15)


def rtn_ref(w, gs, sym=False):
    n_out, n_in = w.shape
    gs = gs or n_in
    w = w.astype(np.float64)
    codes = np.zeros(w.shape)
    scales, zeros = [], []
    for g in range(n_in // gs):
        blk = w[:, g * gs:(g + 1) * gs]
        s, z = group_params(blk, sym)
        codes[:, g * gs:(g + 1) * gs] = quant(blk, s[:, None], z[:, None])
        scales.append(s)
        zeros.append(z)
    return codes, np.stack(scales, 1), np.stack(zeros, 1)


def dequant(codes, scales, zeros, gs, perm=None, act_scale=None):
    n_out, n_in = codes.shape
    gs = gs or n_in
    g = np.arange(n_in) // gs
    v = (codes - zeros[:, g]) * scales[:, g]
    out = np.zeros_like(v)
    out[:, perm if perm is not None else np.arange(n_in)] = v
    if act_scale is not None:
        out = out / act_scale
    return out


def output_error(w, wq, x):
    d = (wq - w.astype(np.float64)) @ x.astype(np.float64).T
    return float((d * d).sum() / x.shape[0])


def gptq_ref(w, x, gs, damp=0.01, act_order=False, B=128, sym=False):
    """Algorithm 1 of the GPTQ paper, with its grouping and act-order."""
    W = w.astype(np.float64).copy()
    X = x.astype(np.float64)
    n_out, d = W.shape
    H = 2.0 * X.T @ X / X.shape[0]
    dead = np.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    perm = np.arange(d)
    if act_order:
        perm = np.argsort(-np.diag(H), kind="stable")
        W, H = W[:, perm], H[perm][:, perm]
    H += damp * np.mean(np.diag(H)) * np.eye(d)
    # H^-1 = Cholesky(H^-1)^T ...: the upper factor of the inverse
    Linv = np.linalg.inv(np.linalg.cholesky(H))
    Hinv = np.linalg.cholesky(Linv.T @ Linv).T
    gs_ = gs or d
    Q = np.zeros_like(W)
    scales = np.zeros((n_out, d // gs_))
    zeros = np.zeros((n_out, d // gs_))
    s = z = None
    for i in range(0, d, B):
        E = np.zeros((n_out, B))
        for j in range(i, min(i + B, d)):
            if j % gs_ == 0:  # a group starts: its parameters from the updated weights
                s, z = group_params(W[:, j:j + gs_], sym)
                scales[:, j // gs_], zeros[:, j // gs_] = s, z
            Q[:, j] = quant(W[:, j], s, z)
            E[:, j - i] = (W[:, j] - (Q[:, j] - z) * s) / Hinv[j, j]
            W[:, j:i + B] -= np.outer(E[:, j - i], Hinv[j, j:i + B])
        W[:, i + B:] -= E[:, :min(B, d - i)] @ Hinv[i:i + B, i + B:]  # (a last, short block leaves nothing after it)
    return Q, scales, zeros, (perm if act_order else None)


def e4m3(v):
    """v (already divided by its scale) rounded to E4M3 (3 mantissa bits,
    exponents down to -6, subnormal steps of 2^-9, ties to even), saturated
    at 448 as luainfer's encoder does."""
    a = np.abs(v)
    e = np.maximum(np.floor(np.log2(np.maximum(a, 2.0 ** -9))), -6)
    step = 2.0 ** (e - 3)
    return np.sign(v) * np.minimum(np.round(a / step) * step, 448.0)


def gptq8_ref(w, x, fp8, s=None, damp=0.01, B=128):
    """GPTQ (Algorithm 1) onto one scale per row: int8 (s = amax/127,
    round half even, clamp +-127) or e4m3 (s = amax/448). s: the weight is
    already W diag(s), its input X diag(s)^-1."""
    W = w.astype(np.float64).copy()
    X = x.astype(np.float64) if s is None else x.astype(np.float64) / s.astype(np.float32).astype(np.float64)
    n_out, d = W.shape
    H = 2.0 * X.T @ X / X.shape[0]
    dead = np.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    H += damp * np.mean(np.diag(H)) * np.eye(d)
    Linv = np.linalg.inv(np.linalg.cholesky(H))
    Hinv = np.linalg.cholesky(Linv.T @ Linv).T
    qmax = np.float32(448.0 if fp8 else 127.0)
    sc = (np.abs(w).max(axis=1) / qmax).astype(np.float32)  # f32, from the weights before feedback
    inv = np.where(sc > 0, np.float32(1.0) / np.where(sc > 0, sc, 1), 0).astype(np.float32)
    Q = np.zeros_like(W)
    for i in range(0, d, B):
        E = np.zeros((n_out, min(i + B, d) - i))  # the last block may be short (odd n_in)
        for j in range(i, min(i + B, d)):
            y = (W[:, j].astype(np.float32) * inv).astype(np.float64)
            Q[:, j] = e4m3(y) if fp8 else np.round(np.clip(y, -127, 127))
            E[:, j - i] = (W[:, j] - Q[:, j] * sc) / Hinv[j, j]
            W[:, j:i + B] -= np.outer(E[:, j - i], Hinv[j, j:i + B])
        W[:, i + B:] -= E @ Hinv[i:i + B, i + B:]
    return Q, sc


def awq_ref(w, x, gs, n_grid=20, clip=True, n_clip=10):
    """AWQ's scale search (s = s_X^a) and clipping search, one layer."""
    W = w.astype(np.float64)
    X = x.astype(np.float64)
    n_out, d = W.shape
    gs = gs or d
    sx = np.maximum(np.abs(X).mean(axis=0), 1e-4)
    ref_out = X @ W.T
    best, best_a, best_s = np.inf, 0.0, None
    for i in range(n_grid):
        a = i / (n_grid - 1)
        s = f32(sx ** a)
        c, sc, zp = rtn_ref(W * s, gs)
        wq = dequant(c, sc, zp, gs) / s
        loss = (((X @ wq.T) - ref_out) ** 2).sum() / X.shape[0]
        if loss < best:
            best, best_a, best_s = loss, a, s
    s = best_s
    Ws = W * s
    Xs = X / s
    codes = np.zeros(W.shape)
    scales = np.zeros((n_out, d // gs))
    zeros = np.zeros((n_out, d // gs))
    for g in range(d // gs):
        cols = slice(g * gs, (g + 1) * gs)
        v, xg = Ws[:, cols], Xs[:, cols]
        amax = np.abs(v).max(axis=1, keepdims=True)
        best_e = np.full(n_out, np.inf)
        best_m = amax.copy()
        for i in range(n_clip if clip else 1):
            m = amax * (1 - i / 20)
            vc = np.clip(v, -m, m)
            sc, zp = group_params(vc, False)
            q = (quant(vc, sc[:, None], zp[:, None]) - zp[:, None]) * sc[:, None]
            e = (((q - v) @ xg.T) ** 2).sum(axis=1)
            better = e < best_e
            best_e[better] = e[better]
            best_m[better] = m[better]
        vc = np.clip(v, -best_m, best_m)
        sc, zp = group_params(vc, False)
        codes[:, cols] = quant(vc, sc[:, None], zp[:, None])
        scales[:, g], zeros[:, g] = sc, zp
    return codes, scales, zeros, s, best_a


# ---------------------------------------------------------------------------
# comparisons
# ---------------------------------------------------------------------------
def compare(name, c, codes, scales, zeros):
    diff = int((c["codes"] != codes).sum())
    sdiff = int((~np.isclose(c["scales"].astype(np.float64), scales, rtol=2e-7, atol=0)).sum())
    zdiff = int((c["zeros"] != zeros).sum()) if zeros is not None else 0
    print(f"{name}: {diff} of {codes.size} codes differ, {sdiff} scales, {zdiff} zero points")
    return diff, sdiff, zdiff


LAYERS = [  # (seed, n_out, n_in, group)
    (1, 37, 256, 128),
    (2, 37, 384, 128),
    (3, 37, 256, 64),
    (4, 37, 384, 64),
]


@pytest.mark.parametrize("seed,n_out,n_in,gs", LAYERS)
def test_rtn_matches_numpy(driver, tmp_path, seed, n_out, n_in, gs):
    w, x = make_layer(seed, n_out, n_in, 64)
    for sym in (False, True):
        c = run_c(driver, tmp_path, "rtn", w, x, "--group", gs, *(["--sym"] if sym else []))
        codes, scales, zeros = rtn_ref(w, gs, sym)
        d = compare(f"rtn sym={sym}", c, codes, scales, None if sym else zeros)
        assert d == (0, 0, 0)  # the same operations in the same order: no rounding can differ
        if sym:
            assert c["zeros"] is None


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("seed,n_out,n_in,gs", LAYERS)
def test_gptq_matches_numpy(driver, tmp_path, seed, n_out, n_in, gs, act_order):
    w, x = make_layer(seed, n_out, n_in, 3 * n_in // 2, n_dead=3)
    opts = ["--group", gs] + (["--act-order"] if act_order else [])
    c = run_c(driver, tmp_path, "gptq", w, x, *opts)
    codes, scales, zeros, perm = gptq_ref(w, x, gs, act_order=act_order)
    if act_order:
        assert (c["perm"] == perm).all()
    else:
        assert c["perm"] is None
    diff, sdiff, zdiff = compare(f"gptq act_order={act_order}", c, codes, scales, zeros)
    # the error feedback sums in another order than BLAS (a few ulps); a
    # code flips only at a boundary, and a flip feeds a slightly different
    # error forward: bounded at 0.1% of the codes, scales within 2e-7
    assert diff <= codes.size // 1000
    assert sdiff <= scales.size // 100 and zdiff <= zeros.size // 100
    # dead inputs have weight 0 exactly: code == zero point
    dead = np.where((x == 0).all(axis=0))[0]
    col = np.arange(n_in) if perm is None else np.argsort(perm)  # stored column of each input
    g = col[dead] // gs
    assert (c["codes"][:, col[dead]] == c["zeros"][:, g]).all()
    wq_c = dequant(c["codes"], c["scales"].astype(np.float64), c["zeros"].astype(np.float64), gs, c["perm"])
    wq_r = dequant(codes, scales, zeros, gs, perm)
    e_c, e_r = output_error(w, wq_c, x), output_error(w, wq_r, x)
    rtn = rtn_ref(w, gs)
    e_rtn = output_error(w, dequant(*rtn, gs), x)
    print(f"output error: gptq C {e_c:.6g}, NumPy {e_r:.6g}, rtn {e_rtn:.6g} (C says {c['err']:.6g}, "
          f"{c['err_rtn']:.6g})")
    assert e_c == pytest.approx(e_r, rel=1e-3)
    assert c["err"] == pytest.approx(e_c, rel=1e-4) and c["err_rtn"] == pytest.approx(e_rtn, rel=1e-4)
    assert e_c < 0.8 * e_rtn  # GPTQ must beat round-to-nearest clearly


@pytest.mark.parametrize("seed,n_out,n_in", [(7, 37, 256), (8, 29, 200)])
def test_gptq_per_channel_symmetric_matches_numpy(driver, tmp_path, seed, n_out, n_in):
    """li_q4_w4a4 with calibration (`quantize --method w4a4 --gptq`): one symmetric scale per row (amax / 7,
    zero 8) fixed before the feedback, as gptq_ref's group of the whole row."""
    w, x = make_layer(seed, n_out, n_in, 3 * n_in // 2, n_dead=2)
    c = run_c(driver, tmp_path, "w4a4-gptq", w, x, "--group", 0, "--sym")  # (the options: the RTN it is compared with)
    codes, scales, _, _ = gptq_ref(w, x, 0, sym=True)
    assert c["zeros"] is None and c["perm"] is None and c["scales"].shape == (n_out, 1)
    diff, sdiff, _ = compare("gptq per channel, symmetric", c, codes, scales, None)
    assert diff <= codes.size // 1000 and sdiff == 0  # the scale is fixed from the row before any feedback
    wq = dequant(c["codes"], c["scales"].astype(np.float64), np.full((n_out, 1), 8.0), 0)
    rtn = rtn_ref(w, 0, sym=True)
    e_c, e_rtn = output_error(w, wq, x), output_error(w, dequant(*rtn, 0), x)
    assert e_c < 0.8 * e_rtn, (e_c, e_rtn)


def e4m3_decode(codes):
    """e4m3 bytes -> values (sign, 4 exponent bits, 3 mantissa bits; bias 7)."""
    c = codes.astype(np.int64)
    e, m = (c >> 3) & 15, c & 7
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7))
    return np.where(c & 0x80, -v, v)


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("smooth", [False, True])
@pytest.mark.parametrize("seed,n_out,n_in", [(5, 37, 256), (6, 29, 200)])
def test_gptq8_matches_numpy(driver, tmp_path, seed, n_out, n_in, fp8, smooth):
    """GPTQ onto the W8A8 (int8) and FP8 (e4m3) grids, one scale per row,
    with and without a SmoothQuant rescaling of the Hessian."""
    w, x = make_layer(seed, n_out, n_in, 3 * n_in // 2, n_dead=2)
    s = None
    if smooth:
        s = np.random.default_rng(seed + 100).uniform(0.2, 5.0, n_in).astype(np.float32)
        w = (w * s).astype(np.float32)  # the smoothed weight W diag(s); its input is X / s
    c = run_c(driver, tmp_path, "gptq-fp8" if fp8 else "gptq-int8", w, x, in_scale=s)
    q, sc = gptq8_ref(w, x, fp8, s)
    assert np.array_equal(c["scales"][:, 0], sc), "the row scales are the RTN scheme's, from the weights before feedback"
    if fp8:
        cq = e4m3_decode(c["codes"])
    else:
        cq = c["codes"].view(np.int8).astype(np.float64)
    diff = int((cq != q).sum())
    print(f"gptq8 fp8={fp8} smooth={smooth}: {diff} of {q.size} codes differ")
    assert diff <= q.size // 1000  # the error feedback's sums run in another order than BLAS
    xs = x if s is None else x / s
    wq_c = cq * sc[:, None].astype(np.float64)
    rq = np.clip(np.round((w / sc[:, None])), -127, 127) if not fp8 else e4m3(w / sc[:, None])
    e_c, e_rtn = output_error(w, wq_c, xs), output_error(w, rq * sc[:, None], xs)
    print(f"  output error: gptq {e_c:.6g}, round to nearest {e_rtn:.6g}")
    assert e_c < 0.9 * e_rtn  # 8-bit grids leave less to gain than 4-bit (0.71-0.84 on these layers)


def test_gptq_fewer_rows_than_inputs(driver, tmp_path):
    """A rank-deficient Hessian (100 rows, 256 inputs): only the damping
    makes it invertible."""
    w, x = make_layer(8, 37, 256, 100)
    c = run_c(driver, tmp_path, "gptq", w, x, "--group", 128, "--act-order")
    codes, scales, zeros, perm = gptq_ref(w, x, 128, act_order=True)
    diff, sdiff, zdiff = compare("gptq rank-deficient", c, codes, scales, zeros)
    assert diff <= codes.size // 1000 and sdiff <= scales.size // 100 and zdiff <= zeros.size // 100
    assert c["err"] < 0.8 * c["err_rtn"]


@pytest.mark.parametrize("seed,n_out,n_in,gs", LAYERS)
def test_awq_matches_numpy(driver, tmp_path, seed, n_out, n_in, gs):
    w, x = make_layer(seed + 10, n_out, n_in, 200)
    c = run_c(driver, tmp_path, "awq", w, x, "--group", gs)
    codes, scales, zeros, s, alpha = awq_ref(w, x, gs)
    print(f"awq: alpha C {c['alpha']:.4f}, NumPy {alpha:.4f}")
    assert c["alpha"] == alpha
    assert (c["act_scale"].astype(np.float64) == s).all()
    diff, sdiff, zdiff = compare("awq", c, codes, scales, zeros)
    # the same roundings; only the clip choice compares two errors that
    # NumPy sums another way: a near-tie may pick another shrink of a group
    assert diff <= codes.size // 1000 and sdiff <= scales.size // 100 and zdiff <= zeros.size // 100
    wq = dequant(c["codes"], c["scales"].astype(np.float64), c["zeros"].astype(np.float64), gs, None,
                 c["act_scale"].astype(np.float64))
    e_c = output_error(w, wq, x)
    e_rtn = output_error(w, dequant(*rtn_ref(w, gs), gs), x)
    print(f"output error: awq {e_c:.6g}, rtn {e_rtn:.6g}")
    assert c["err"] == pytest.approx(e_c, rel=1e-4)
    assert e_c < e_rtn


def test_awq_without_clip_and_w4a4(driver, tmp_path):
    w, x = make_layer(7, 37, 256, 100)
    c = run_c(driver, tmp_path, "awq", w, x, "--group", 128, "--no-clip")
    codes, scales, zeros, s, alpha = awq_ref(w, x, 128, clip=False)
    assert c["alpha"] == alpha
    assert compare("awq no clip", c, codes, scales, zeros) == (0, 0, 0)
    c = run_c(driver, tmp_path, "w4a4", w, x)
    codes, scales, _ = rtn_ref(w, 0, sym=True)
    assert c["scales"].shape == (37, 1) and c["zeros"] is None
    assert compare("w4a4 weights", c, codes, scales, None) == (0, 0, 0)


def test_gptq_block_size_changes_nothing(driver, tmp_path):
    """Lazy batches are only a schedule: B = 128 and B = 64 (groups of 64;
    the C side rounds B to whole groups) give the same codes, as do other
    calibration chunks."""
    w, x = make_layer(5, 37, 384, 500)
    a = run_c(driver, tmp_path, "gptq", w, x, "--group", 64, "--block", 128)
    b = run_c(driver, tmp_path, "gptq", w, x, "--group", 64, "--block", 64, "--chunk", 64)
    diff = int((a["codes"] != b["codes"]).sum())
    print(f"gptq block 128 vs 64: {diff} codes differ")
    assert diff <= a["codes"].size // 1000


@pytest.mark.parametrize("args,needle", [
    (["rtn", "--group", 100], "does not divide"),
    (["gptq", "--damp", -1], "negative"),
])
def test_driver_errors(driver, tmp_path, args, needle):
    w, x = make_layer(6, 5, 256, 8)
    inp = tmp_path / "in.bin"
    with open(inp, "wb") as f:
        f.write(np.array([5, 256, 8], dtype="<i8").tobytes() + w.tobytes() + x.tobytes())
    p = subprocess.run([str(driver), args[0], str(inp), str(tmp_path / "o.bin"), *map(str, args[1:])],
                       capture_output=True, timeout=60)
    assert p.returncode == 1 and needle in p.stderr.decode(), p.stderr.decode()
