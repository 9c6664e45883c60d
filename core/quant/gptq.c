/* gptq.c — calibration statistics (X^T X, mean |x|) and GPTQ.
 *
 * GPTQ (Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for
 * Generative Pre-trained Transformers", Algorithm 1) quantizes a layer's
 * columns one at a time and spreads each one's rounding error over the
 * columns not yet quantized, weighted by the inverse Hessian of the
 * layer's squared output error, H = 2 X^T X. The inverse enters only
 * through its upper Cholesky factor U (H^-1 = U^T U), whose row j holds
 * what column j's error does to the columns after it once the earlier
 * columns are fixed. Everything is double: the error feedback runs over
 * thousands of columns and the Cholesky factors of a badly conditioned
 * Hessian lose digits fast in f32. */
#include "quant/quant4_internal.h"
#include "cpu/threadpool.h"
#include "types.h"
#include "util/common.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WHY(...) (snprintf(why, cap, __VA_ARGS__), -1)

/* ------------------------------------------------------------------------
 * calibration statistics
 * ---------------------------------------------------------------------- */

/* The n x n double buffers are 64-byte aligned (li_aligned_alloc): a large
 * malloc is an mmap 16 bytes into a page, so every other 32-byte load of a
 * row would straddle two cache lines (at n = 1536 the SPD inverse ran 17%
 * slower on such a buffer). */

int li_q4_calib_init(li_q4_calib *c, int64_t n_in, char *why, size_t cap) {
    memset(c, 0, sizeof *c);
    if (n_in <= 0) return WHY("calib: bad input width %lld", (long long)n_in);
    c->n_in = n_in;
    c->xtx = li_aligned_try_alloc((size_t)(n_in * n_in) * sizeof(double));
    if (c->xtx) memset(c->xtx, 0, (size_t)(n_in * n_in) * sizeof(double));
    c->abs_sum = calloc((size_t)n_in, sizeof(double));
    if (!c->xtx || !c->abs_sum) {
        li_q4_calib_free(c);
        return WHY("calib: out of memory for a %lld x %lld Hessian", (long long)n_in, (long long)n_in);
    }
    return 0;
}

void li_q4_calib_free(li_q4_calib *c) {
    if (!c) return;
    li_aligned_free(c->xtx);
    free(c->abs_sum);
    memset(c, 0, sizeof *c);
}

/* The upper triangle only (mirrored by finish), as a blocked rank-8
 * update: rows go in runs of LI_CALIB_RUN converted to double (products of
 * two f32 values are exact in double), and each (64 x 512) tile of the
 * triangle takes every row of the run while it sits in L2, eight rows per
 * pass. Each element sums its rows in order, in eights (a short last eight
 * padded with zeros, which adds nothing): the result depends on how rows
 * are chunked only through where those eights start. */
#define LI_CALIB_RUN 256
#define LI_CALIB_TI 64
#define LI_CALIB_TJ 512

/* Rows i0 .. i0 + LI_CALIB_TI of the triangle take the run's nr8 rows a */
LI_HOT_CLONES static void calib_tile(double *xtx, const double *a, int64_t n, int64_t nr8, int64_t i0) {
    const int64_t i1 = i0 + LI_CALIB_TI < n ? i0 + LI_CALIB_TI : n;
    for (int64_t j0 = i0; j0 < n; j0 += LI_CALIB_TJ) {
        const int64_t j1 = j0 + LI_CALIB_TJ < n ? j0 + LI_CALIB_TJ : n;
        for (int64_t t = 0; t < nr8; t += 8) {
            const double *a0 = a + t * n, *a1 = a0 + n, *a2 = a1 + n, *a3 = a2 + n, *a4 = a3 + n,
                         *a5 = a4 + n, *a6 = a5 + n, *a7 = a6 + n;
            for (int64_t i = i0; i < i1; i++) {
                const double b0 = a0[i], b1 = a1[i], b2 = a2[i], b3 = a3[i], b4 = a4[i], b5 = a5[i],
                             b6 = a6[i], b7 = a7[i];
                double *h = xtx + i * n;
                for (int64_t j = i > j0 ? i : j0; j < j1; j++)
                    h[j] += ((b0 * a0[j] + b1 * a1[j]) + (b2 * a2[j] + b3 * a3[j])) +
                            ((b4 * a4[j] + b5 * a5[j]) + (b6 * a6[j] + b7 * a7[j]));
            }
        }
    }
}

/* A run's row tiles over threads: each tile is its own rows of the
 * triangle, so the split changes no element's sum. (In a calibration pass
 * the accumulation ran on the forward pass's thread alone, between its
 * matmuls: a fifth of a GPTQ run's CPU time, with the other cores idle.
 * On a pool, not threads started per run: their stacks' unmapping cost
 * more in TLB shootdowns than the second core gave.) */
typedef struct calib_job {
    double *xtx;
    const double *a;
    int64_t n, nr8;
    atomic_long next; /* the next tile's first row */
} calib_job;

static void calib_worker(void *arg, int ith, int nth) {
    (void)ith, (void)nth;
    calib_job *j = arg;
    for (int64_t i0; (i0 = atomic_fetch_add(&j->next, LI_CALIB_TI)) < j->n;) calib_tile(j->xtx, j->a, j->n, j->nr8, i0);
}

LI_HOT_CLONES void li_q4_calib_accumulate(li_q4_calib *c, const float *x, int64_t n_rows) {
    const int64_t n = c->n_in;
    double *a = malloc((size_t)(LI_CALIB_RUN * n) * sizeof(double));
    if (!a) abort(); /* one run of rows: as li_xmalloc */
    const int64_t n_tiles = (n + LI_CALIB_TI - 1) / LI_CALIB_TI;
    for (int64_t r0 = 0; r0 < n_rows; r0 += LI_CALIB_RUN) {
        const int64_t nr = n_rows - r0 < LI_CALIB_RUN ? n_rows - r0 : LI_CALIB_RUN;
        const int64_t nr8 = (nr + 7) / 8 * 8;
        for (int64_t t = 0; t < nr8; t++)
            for (int64_t j = 0; j < n; j++) a[t * n + j] = t < nr ? (double)x[(r0 + t) * n + j] : 0.0;
        for (int64_t t = 0; t < nr; t++)
            for (int64_t j = 0; j < n; j++) c->abs_sum[j] += fabs(a[t * n + j]);
        /* the pool for runs with work to share: 8 rows of a 64-wide input
         * are a microsecond, less than handing a job to the workers */
        const int64_t nth = c->tp ? LI_MIN((int64_t)li_threadpool_size(c->tp), n_tiles) : 1;
        if (nth > 1 && nr8 * n * n >= ((int64_t)1 << 22)) {
            calib_job j = {.xtx = c->xtx, .a = a, .n = n, .nr8 = nr8};
            atomic_init(&j.next, 0);
            li_threadpool_run_sized(c->tp, calib_worker, &j, (int)nth, nr8 * n * n / 2);
        } else {
            for (int64_t i0 = 0; i0 < n; i0 += LI_CALIB_TI) calib_tile(c->xtx, a, n, nr8, i0);
        }
    }
    c->n_rows += n_rows;
    free(a);
}

int li_q4_calib_finish(li_q4_calib *c, char *why, size_t cap) {
    if (c->n_rows <= 0) return WHY("calib: no calibration rows were given");
    if (c->finished) return 0;
    const int64_t n = c->n_in;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < i; j++) c->xtx[i * n + j] = c->xtx[j * n + i];
    c->finished = true;
    return 0;
}

void li_q4_calib_hessian(const li_q4_calib *c, double *h) {
    const double f = 2.0 / (double)c->n_rows;
    for (int64_t i = 0; i < c->n_in * c->n_in; i++) h[i] = f * c->xtx[i];
}

/* ------------------------------------------------------------------------
 * dense helpers (n x n row-major, double)
 * ---------------------------------------------------------------------- */

/* Each element below gets its operations in the textbook order (the dot
 * products of the left-looking forms, k increasing, then one division), so
 * the factors are the same bits as those loops give; the loops run the
 * other way round, over contiguous rows (axpy's), so they vectorize without
 * reassociating a sum: 5-10x faster than the dot-product forms, whose
 * every step waited on the previous add. */

/* a = L L^T in place (lower triangle; the upper is zeroed). false when a
 * is not positive definite. Every element (i, m) subtracts l[i][j] l[m][j]
 * for j increasing (the order of the dot product l[i][:j] . l[m][:j]),
 * then takes its square root (i = m) or its division by l[m][m]; those
 * orders fix the bits, and the loops below keep them.
 *
 * Blocked right-looking, CHOL_PANEL columns a panel. The panel's own
 * columns first, row by row: row i takes the panel's terms for each of
 * its panel elements in turn (the rows above it in the panel are final by
 * then). Then the trailing triangle takes all the panel's terms in four
 * rows by eight columns of registers (tile4x8_sub): read and
 * written once a panel, not once every four columns as it was. c holds the
 * panel's columns contiguous (CHOL_PANEL n doubles of scratch). */
#define CHOL_PANEL 16

/* x_s[0..8) -= sum over t in [t0, t1) of c_s[t] (v + t vs)[0..8), s = 0..3,
 * t increasing: four rows by eight columns in registers over the terms
 * (each element's subtractions in the plain loop's order, so its bits).
 * ahead > 0 prefetches the term that many ahead (rows of a large matrix:
 * a new page each). Inlined into its caller's ISA clone. */
static inline __attribute__((always_inline)) void tile4x8_sub(double *x0, double *x1, double *x2, double *x3,
                                                              const double *c0, const double *c1, const double *c2,
                                                              const double *c3, const double *v, int64_t vs,
                                                              int64_t t0, int64_t t1, int64_t ahead) {
    li_dv4 a0, b0, a1, b1, a2, b2, a3, b3;
    LI_DV4_LD(a0, x0), LI_DV4_LD(b0, x0 + 4), LI_DV4_LD(a1, x1), LI_DV4_LD(b1, x1 + 4);
    LI_DV4_LD(a2, x2), LI_DV4_LD(b2, x2 + 4), LI_DV4_LD(a3, x3), LI_DV4_LD(b3, x3 + 4);
    for (int64_t t = t0; t < t1; t++) {
        const double *vt = v + t * vs;
        if (ahead) __builtin_prefetch(vt + ahead * vs);
        li_dv4 va, vb;
        LI_DV4_LD(va, vt), LI_DV4_LD(vb, vt + 4);
        const li_dv4 f0 = {c0[t], c0[t], c0[t], c0[t]}, f1 = {c1[t], c1[t], c1[t], c1[t]};
        const li_dv4 f2 = {c2[t], c2[t], c2[t], c2[t]}, f3 = {c3[t], c3[t], c3[t], c3[t]};
        a0 -= f0 * va, b0 -= f0 * vb, a1 -= f1 * va, b1 -= f1 * vb;
        a2 -= f2 * va, b2 -= f2 * vb, a3 -= f3 * va, b3 -= f3 * vb;
    }
    LI_DV4_ST(x0, a0), LI_DV4_ST(x0 + 4, b0), LI_DV4_ST(x1, a1), LI_DV4_ST(x1 + 4, b1);
    LI_DV4_ST(x2, a2), LI_DV4_ST(x2 + 4, b2), LI_DV4_ST(x3, a3), LI_DV4_ST(x3 + 4, b3);
}
/* Row ai's elements m0..m1 take the panel's nb terms one element at a
 * time (ai's own panel elements, at j0, the coefficients) */
static inline void panel_terms(double *ai, const double *c, int64_t n, int64_t j0, int64_t nb, int64_t m0,
                               int64_t m1) {
    for (int64_t m = m0; m <= m1; m++) {
        double x = ai[m];
        for (int64_t t = 0; t < nb; t++) x -= ai[j0 + t] * c[t * n + m];
        ai[m] = x;
    }
}

LI_HOT_CLONES static bool cholesky_lower_c(double *a, int64_t n, double *c) {
    for (int64_t j0 = 0; j0 < n; j0 += CHOL_PANEL) {
        const int64_t nb = LI_MIN((int64_t)CHOL_PANEL, n - j0);
        for (int64_t i = j0; i < n; i++) {
            double *ai = a + i * n;
            const int64_t top = LI_MIN(i, j0 + nb - 1); /* the panel's last column in row i's triangle */
            for (int64_t m = j0; m <= top; m++) {
                const double *am = a + m * n; /* row m: final in the panel's columns before m */
                double x = ai[m];
                for (int64_t j = j0; j < m; j++) x -= ai[j] * am[j];
                if (m == i) {
                    if (!(x > 0.0)) return false;
                    ai[m] = sqrt(x);
                } else {
                    ai[m] = x / am[m];
                }
            }
        }
        const int64_t m0 = j0 + nb;
        for (int64_t t = 0; t < nb; t++)
            for (int64_t i = m0; i < n; i++) c[t * n + i] = a[i * n + j0 + t];
        /* four rows by eight columns in registers take all the panel's terms, t increasing; a
         * row's own panel elements (final by now) are its coefficients */
        int64_t i = m0;
        for (; i + 4 <= n; i += 4) {
            double *x0 = a + i * n, *x1 = x0 + n, *x2 = x1 + n, *x3 = x2 + n;
            int64_t m = m0;
            for (; m + 8 <= i + 1; m += 8)
                tile4x8_sub(x0 + m, x1 + m, x2 + m, x3 + m, x0 + j0, x1 + j0, x2 + j0, x3 + j0, c + m, n, 0, nb, 0);
            for (int s = 0; s < 4; s++) panel_terms(a + (i + s) * n, c, n, j0, nb, m, i + s); /* the edge */
        }
        for (; i < n; i++) panel_terms(a + i * n, c, n, j0, nb, m0, i); /* the last rows, fewer than four */
    }
    for (int64_t i = 0; i < n; i++)
        for (int64_t m = i + 1; m < n; m++) a[i * n + m] = 0.0;
    return true;
}

static bool cholesky_lower(double *a, int64_t n) {
    double *c = li_aligned_alloc(CHOL_PANEL * (size_t)n * sizeof(double));
    const bool ok = cholesky_lower_c(a, n, c);
    li_aligned_free(c);
    return ok;
}

int li_q4_cholesky(double *a, int64_t n) { return cholesky_lower(a, n) ? 0 : -1; }

/* l (lower, invertible) -> l^-1 in place (lower), row by row: row i of
 * X = L^-1 is (e_i - sum_{k<i} l[i][k] X[k][:]) / l[i][i], element j's
 * terms in k increasing from j (forward substitution's order for column
 * j). Rows go INV_ROWS at a time: the rows above the block, already final,
 * give their terms to four of the block's rows by eight columns at a time
 * in registers (tile4x8_sub; a stripe of eight columns of the rows above
 * is read from cache by the block's other row groups); then the block's
 * rows take each other's terms in order. Every element's terms keep k
 * increasing, so the bits are the row-at-a-time loop's. row: INV_ROWS n
 * doubles of scratch (rows i of l, which X's rows i replace). */
#define INV_ROWS 16
#define INV_AHEAD 12
LI_HOT_CLONES static void invert_lower(double *l, int64_t n, double *row) {
    for (int64_t i0 = 0; i0 < n; i0 += INV_ROWS) {
        const int nb = (int)LI_MIN((int64_t)INV_ROWS, n - i0);
        for (int t = 0; t < nb; t++) {
            const int64_t i = i0 + t;
            double *xi = l + i * n;
            memcpy(row + t * n, xi, (size_t)(i + 1) * sizeof(double));
            for (int64_t j = 0; j <= i; j++) xi[j] = i == j ? 1.0 : 0.0;
        }
        /* the rows above the block: eight columns of four rows in registers take every k's
         * term; element j's terms start at k = j (X[k][j] is 0 for j > k), so the first
         * seven k of a chunk go element by element */
        for (int64_t jv = 0; jv < i0; jv += 8) {
            const bool whole = jv + 8 <= i0;
            int t = 0;
            for (; whole && t + 4 <= nb; t += 4) {
                double *x0 = l + (i0 + t) * n + jv, *x1 = x0 + n, *x2 = x1 + n, *x3 = x2 + n;
                const double *r0 = row + t * n, *r1 = r0 + n, *r2 = r1 + n, *r3 = r2 + n;
                for (int64_t k = jv; k < jv + 7; k++) {
                    const double *xk = l + k * n + jv;
                    for (int64_t j = 0; j <= k - jv; j++) {
                        const double v = xk[j];
                        x0[j] -= r0[k] * v, x1[j] -= r1[k] * v, x2[j] -= r2[k] * v, x3[j] -= r3[k] * v;
                    }
                }
                tile4x8_sub(x0, x1, x2, x3, r0, r1, r2, r3, l + jv, n, jv + 7, i0, INV_AHEAD);
            }
            for (; t < nb; t++) { /* the block's last rows, or the last columns */
                double *xt = l + (i0 + t) * n;
                const double *rt = row + t * n;
                const int64_t je = LI_MIN(jv + 8, i0);
                for (int64_t k = jv; k < i0; k++) {
                    const double *xk = l + k * n;
                    for (int64_t j = jv; j < je && j <= k; j++) xt[j] -= rt[k] * xk[j];
                }
            }
        }
        /* the block's own rows, each final before the next reads it */
        for (int t = 0; t < nb; t++) {
            const int64_t i = i0 + t;
            double *xi = l + i * n;
            const double *ri = row + t * n;
            for (int64_t k = i0; k < i; k++) {
                const double lik = ri[k];
                const double *xk = l + k * n;
                for (int64_t j = 0; j <= k; j++) xi[j] -= lik * xk[j];
            }
            const double d = ri[i];
            for (int64_t j = 0; j <= i; j++) xi[j] = xi[j] / d;
        }
    }
}

/* inv (lower triangle) += sum over rows k of X of x_k^T x_k: the product
 * X^T X for X lower, k increasing for every element. GRAM_ROWS rows of X
 * a pass over inv's triangle (each row of inv takes their terms four at a
 * time in a register), not one. */
#define GRAM_ROWS 16
LI_HOT_CLONES static void lower_gram(const double *x, int64_t n, double *inv) {
    for (int64_t k0 = 0; k0 < n; k0 += GRAM_ROWS) {
        const int64_t k1 = LI_MIN(k0 + GRAM_ROWS, n);
        for (int64_t i = 0; i < k1; i++) {
            double *ii = inv + i * n;
            int64_t k = LI_MAX(k0, i); /* x_k[i] is 0 for k < i */
            for (; k + 4 <= k1; k += 4) {
                const double *x0 = x + k * n, *x1 = x0 + n, *x2 = x1 + n, *x3 = x2 + n;
                const double v0 = x0[i], v1 = x1[i], v2 = x2[i], v3 = x3[i];
                li_axpy4_f64(ii, i + 1, x0, x1, x2, x3, v0, v1, v2, v3);
            }
            for (; k < k1; k++) {
                const double *xk = x + k * n, v = xk[i];
                for (int64_t j = 0; j <= i; j++) ii[j] += v * xk[j];
            }
        }
    }
}

/* a (n x n, symmetric positive definite) -> a^-1 in place: a = L L^T,
 * a^-1 = L^-T L^-1. 0, or -1 when a is not positive definite. */
int li_q4_spd_inverse(double *a, int64_t n) {
    double *col = li_aligned_alloc(LI_MAX(CHOL_PANEL, INV_ROWS) * (size_t)n * sizeof(double));
    double *inv = li_aligned_alloc((size_t)(n * n) * sizeof(double));
    memset(inv, 0, (size_t)(n * n) * sizeof(double));
    if (!cholesky_lower_c(a, n, col)) {
        li_aligned_free(col);
        li_aligned_free(inv);
        return -1;
    }
    invert_lower(a, n, col); /* a = L^-1 (lower) */
    lower_gram(a, n, inv);   /* the lower triangle of L^-T L^-1, then mirrored */
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j <= i; j++) a[i * n + j] = a[j * n + i] = inv[i * n + j];
    li_aligned_free(col);
    li_aligned_free(inv);
    return 0;
}

/* The upper Cholesky factor of H^-1 (H positive definite, destroyed): H^-1
 * = U^T U. With P the reversal of order, P H P = L L^T (L lower), so H =
 * R R^T for the upper R = P L P, H^-1 = R^-T R^-1, and U = R^-1 = P L^-1 P
 * (upper, positive diagonal: the factor, which is unique). One Cholesky and
 * one triangular inverse, half the work of inverting H and factoring the
 * inverse, and H^-1 is never formed. u (n, n). 0, or -1 when H is not
 * positive definite. */
static int upper_cholesky_of_inverse(double *h, int64_t n, double *u) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) u[i * n + j] = h[(n - 1 - i) * n + (n - 1 - j)];
    if (!cholesky_lower(u, n)) return -1;
    invert_lower(u, n, h); /* h: scratch (n n >= INV_ROWS n doubles, or n < INV_ROWS) */
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) h[i * n + j] = u[(n - 1 - i) * n + (n - 1 - j)];
    memcpy(u, h, (size_t)(n * n) * sizeof(double));
    return 0;
}

/* ------------------------------------------------------------------------
 * GPTQ
 * ---------------------------------------------------------------------- */

/* The lazy batch: w[r][k] -= sum_{t < nb} err[r][t] U[i1 + t][k] for k in
 * [k0, k1) (err's rows bs apart). Four rows by eight columns stay in
 * registers (GCC's generic vectors: the default clone runs them as SSE2
 * pairs) over the nb terms (a row of U read once per four rows, w read and
 * written once per batch, not once per term); each element's subtractions
 * keep their order, t increasing, so the bits are the plain loop's. */
LI_HOT_CLONES static void lazy_update(double *wd, const double *err, const double *u, int64_t n_out, int64_t n,
                                  int64_t bs, int64_t i1, int64_t nb, int64_t k0, int64_t k1) {
    int64_t r = 0;
    for (; r + 4 <= n_out; r += 4) {
        double *w0 = wd + r * n, *w1 = w0 + n, *w2 = w1 + n, *w3 = w2 + n;
        const double *e0 = err + r * bs, *e1 = e0 + bs, *e2 = e1 + bs, *e3 = e2 + bs;
        int64_t k = k0;
        for (; k + 8 <= k1; k += 8)
            tile4x8_sub(w0 + k, w1 + k, w2 + k, w3 + k, e0, e1, e2, e3, u + i1 * n + k, n, 0, nb, 0);
        for (; k < k1; k++) { /* the last columns, fewer than eight */
            for (int64_t t = 0; t < nb; t++) {
                const double ut = u[(i1 + t) * n + k];
                w0[k] -= e0[t] * ut, w1[k] -= e1[t] * ut, w2[k] -= e2[t] * ut, w3[k] -= e3[t] * ut;
            }
        }
    }
    for (; r < n_out; r++) {
        double *wr = wd + r * n;
        for (int64_t t = 0; t < nb; t++) {
            const double e = err[r * bs + t], *ut = u + (i1 + t) * n;
            for (int64_t k = k0; k < k1; k++) wr[k] -= e * ut[k];
        }
    }
}

#define GPTQ_SUB 16 /* columns a pass inside a lazy block */

typedef struct {
    const double *d;
    int64_t i;
} diag_key;

/* decreasing diag(H), then increasing column: a stable order */
static int diag_key_cmp(const void *pa, const void *pb) {
    const diag_key *a = pa, *b = pb;
    const double da = a->d[a->i], db = b->d[b->i];
    if (da != db) return da > db ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

/* What GPTQ rounds to: `start` is called for each row when column j opens
 * a group (w: the row's error-updated values from column j on, n of
 * them), `round` stores the code of x at (r, j) and returns its value. */
typedef struct gptq_grid {
    void *ctx;
    int64_t group;                                                           /* columns per group (n: one) */
    void (*start)(void *ctx, int64_t r, int64_t j, const double *w, int64_t n);
    double (*round)(void *ctx, int64_t r, int64_t j, double x);
} gptq_grid;

/* GPTQ onto any grid: w (n_out, n) in, columns in order (act_order: by
 * decreasing diag(H), *perm set), codes through g. in_scale (n) or NULL:
 * the weight is W diag(s) and its input X diag(s)^-1 (SmoothQuant), so
 * H becomes diag(s)^-1 H diag(s)^-1. */
LI_HOT_CLONES static int gptq_core(const float *w, int64_t n_out, int64_t n, const li_q4_calib *c, double damp,
                                   bool act_order, int64_t block_size, const double *in_scale, const gptq_grid *g,
                                   double *loss_out, int32_t **perm, char *why, size_t cap) {
    if (!c || !c->finished || c->n_in != n)
        return WHY("gptq: calibration statistics of width %lld (%s) for a layer of %lld inputs",
                   c ? (long long)c->n_in : 0LL, c && c->finished ? "finished" : "not finished", (long long)n);
    if (!(damp >= 0.0)) return WHY("gptq: damping %g is negative", damp);
    const int64_t gs = g->group;
    /* lazy blocks hold whole groups, so a group's weights are up to date
     * when its first column is reached */
    int64_t bs = block_size > 0 ? block_size : 128;
    if (gs < n) bs = bs < gs ? gs : bs / gs * gs;
    double *h = li_aligned_try_alloc((size_t)(n * n) * sizeof(double));
    double *u = li_aligned_try_alloc((size_t)(n * n) * sizeof(double));
    double *wd = li_aligned_try_alloc((size_t)(n_out * n) * sizeof(double));
    double *err = malloc((size_t)(n_out * bs) * sizeof(double));
    double *tmp = malloc((size_t)n * sizeof(double));
    int32_t *order = malloc((size_t)n * sizeof(int32_t));
    diag_key *keys = act_order ? malloc((size_t)n * sizeof(diag_key)) : NULL;
    int rc = -1;
    if (!h || !u || !wd || !err || !tmp || !order || (act_order && !keys)) {
        (void)WHY("gptq: out of memory for a %lld x %lld layer", (long long)n_out, (long long)n);
        goto done;
    }
    li_q4_calib_hessian(c, h);
    if (in_scale)
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < n; j++) h[i * n + j] /= in_scale[i] * in_scale[j];
    /* dead inputs (never nonzero in calibration): the weight cannot matter,
     * so it is 0 and the column gets H = 1 to keep H invertible */
    for (int64_t i = 0; i < n_out; i++)
        for (int64_t j = 0; j < n; j++) wd[i * n + j] = w[i * n + j];
    for (int64_t j = 0; j < n; j++) {
        order[j] = (int32_t)j;
        if (h[j * n + j] == 0.0) {
            h[j * n + j] = 1.0;
            for (int64_t i = 0; i < n_out; i++) wd[i * n + j] = 0.0;
        }
    }
    if (act_order) { /* columns (and H's rows and columns) by decreasing diag(H) */
        for (int64_t j = 0; j < n; j++) {
            tmp[j] = h[j * n + j];
            keys[j] = (diag_key){tmp, j};
        }
        qsort(keys, (size_t)n, sizeof *keys, diag_key_cmp);
        for (int64_t j = 0; j < n; j++) order[j] = (int32_t)keys[j].i;
        for (int64_t i = 0; i < n; i++) /* u as scratch: u[i][j] = h[order[i]][order[j]] */
            for (int64_t j = 0; j < n; j++) u[i * n + j] = h[(int64_t)order[i] * n + order[j]];
        memcpy(h, u, (size_t)(n * n) * sizeof(double));
        for (int64_t i = 0; i < n_out; i++) {
            for (int64_t j = 0; j < n; j++) tmp[j] = wd[i * n + order[j]];
            memcpy(wd + i * n, tmp, (size_t)n * sizeof(double));
        }
    }
    double mean = 0.0;
    for (int64_t j = 0; j < n; j++) mean += h[j * n + j];
    mean /= (double)n;
    for (int64_t j = 0; j < n; j++) h[j * n + j] += damp * mean;
    if (upper_cholesky_of_inverse(h, n, u)) {
        (void)WHY("gptq: the Hessian is not positive definite after damping %g (raise the damping)", damp);
        goto done;
    }

    /* Inside a lazy block, columns go GPTQ_SUB at a time: a column's error
     * reaches the rest of its sub-block at once, the rest of the block when
     * the sub-block is done (the same batch, in registers), so every weight
     * still takes its terms in column order: the same bits as one column at
     * a time. A group's first column must open a sub-block (its start reads
     * the group's values up to date), so sub-blocks are whole blocks where
     * groups are not a multiple of them. */
    const int64_t sub = gs >= n || gs % GPTQ_SUB == 0 ? GPTQ_SUB : bs;
    double loss = 0.0;
    for (int64_t i1 = 0; i1 < n; i1 += bs) {
        const int64_t i2 = i1 + bs < n ? i1 + bs : n, nb = i2 - i1;
        for (int64_t s1 = i1; s1 < i2; s1 += sub) {
            const int64_t s2 = LI_MIN(s1 + sub, i2);
            for (int64_t j = s1; j < s2; j++) {
                const double *uj = u + j * n, d = uj[j];
                const bool start = j % gs == 0;
                for (int64_t r = 0; r < n_out; r++) {
                    double *wr = wd + r * n;
                    if (start) g->start(g->ctx, r, j, wr + j, n - j);
                    const double e = (wr[j] - g->round(g->ctx, r, j, wr[j])) / d;
                    err[r * bs + (j - i1)] = e;
                    for (int64_t t = j + 1; t < s2; t++) wr[t] -= e * uj[t]; /* inside the sub-block: now */
                }
            }
            if (s2 < i2) lazy_update(wd, err + (s1 - i1), u, n_out, n, bs, s1, s2 - s1, s2, i2);
        }
        /* the loss in the order the columns ran (a column's rows in turn) */
        for (int64_t j = i1; j < i2; j++)
            for (int64_t r = 0; r < n_out; r++) {
                const double e = err[r * bs + (j - i1)];
                loss += 0.5 * e * e;
            }
        if (i2 < n) /* the block's errors into every later column at once (the lazy batch) */
            lazy_update(wd, err, u, n_out, n, bs, i1, nb, i2, n);
    }
    *loss_out = loss;
    if (act_order && perm) {
        *perm = order;
        order = NULL;
    }
    rc = 0;
done:
    li_aligned_free(h);
    li_aligned_free(u);
    li_aligned_free(wd);
    free(err);
    free(tmp);
    free(order);
    free(keys);
    return rc;
}

/* ---- the 4-bit grid: a group's scale and zero from its updated weights */
typedef struct q4_grid {
    li_q4_result *out;
    li_q4_group *par; /* (n_out) each row's current group */
    bool symmetric;
} q4_grid;

static void q4_start(void *ctx, int64_t r, int64_t j, const double *w, int64_t n) {
    q4_grid *q = ctx;
    li_q4_result *out = q->out;
    const int64_t gs = out->group_size ? out->group_size : out->n_in, g = j / gs;
    (void)n;
    q->par[r] = li_q4_group_params(w, gs, 1, q->symmetric);
    out->scales[r * out->n_groups + g] = q->par[r].scale;
    if (out->zeros) out->zeros[r * out->n_groups + g] = (float)q->par[r].zero;
}

static double q4_round(void *ctx, int64_t r, int64_t j, double x) {
    q4_grid *q = ctx;
    const int c = li_q4_code(x, q->par[r]);
    q->out->codes[r * q->out->n_in + j] = (uint8_t)c;
    return li_q4_value(c, q->par[r]);
}

int li_q4_gptq(const float *w, int64_t n_out, int64_t n_in, const li_q4_calib *c, const li_q4_opts *o,
               li_q4_result *out, char *why, size_t cap) {
    if (!c || !c->finished || c->n_in != n_in)
        return WHY("gptq: calibration statistics of width %lld (%s) for a layer of %lld inputs",
                   c ? (long long)c->n_in : 0LL, c && c->finished ? "finished" : "not finished", (long long)n_in);
    if (!(o->damp >= 0.0)) return WHY("gptq: damping %g is negative", o->damp);
    if (li_q4_result_alloc(out, n_out, n_in, o->group_size, o->symmetric, "gptq", why, cap)) return -1;
    q4_grid q = {.out = out, .par = malloc((size_t)n_out * sizeof(li_q4_group)), .symmetric = o->symmetric};
    if (!q.par) {
        li_q4_result_free(out);
        return WHY("gptq: out of memory for a %lld x %lld layer", (long long)n_out, (long long)n_in);
    }
    const gptq_grid g = {.ctx = &q, .group = out->group_size ? out->group_size : n_in, .start = q4_start,
                         .round = q4_round};
    const int rc = gptq_core(w, n_out, n_in, c, o->damp, o->act_order, o->block_size, NULL, &g, &out->loss,
                             &out->perm, why, cap);
    free(q.par);
    if (rc) li_q4_result_free(out);
    return rc;
}

/* ---- the 8-bit grids: one scale per row, from its values before any
 * feedback (as an RTN weight of the scheme: amax / 127 or amax / 448) */
typedef struct q8_grid {
    bool fp8;
    int64_t n_in;
    float *scales; /* (n_out) */
    uint8_t *codes;
} q8_grid;

static void q8_start(void *ctx, int64_t r, int64_t j, const double *w, int64_t n) {
    (void)ctx, (void)r, (void)j, (void)w, (void)n; /* the scales are set before the columns run */
}

static double q8_round(void *ctx, int64_t r, int64_t j, double x) {
    q8_grid *q = ctx;
    const float sc = q->scales[r], inv = sc > 0 ? 1.0f / sc : 0.0f;
    if (q->fp8) {
        const uint8_t c = li_fp32_to_fp8_e4m3((float)x * inv);
        q->codes[r * q->n_in + j] = c;
        return (double)li_fp8_e4m3_to_fp32(c) * sc;
    }
    const float c = li_code_round((float)x * inv, -127.0f, 127.0f);
    q->codes[r * q->n_in + j] = (uint8_t)(int8_t)c;
    return (double)c * sc;
}

int li_q8_gptq(const float *w, int64_t n_out, int64_t n_in, const li_q4_calib *c, double damp, bool fp8,
               const double *in_scale, uint8_t *codes, float *scales, char *why, size_t cap) {
    const float qmax = fp8 ? 448.0f : 127.0f;
    for (int64_t r = 0; r < n_out; r++) {
        float amax = 0.0f;
        for (int64_t j = 0; j < n_in; j++) amax = fmaxf(amax, fabsf(w[r * n_in + j]));
        scales[r] = amax / qmax;
    }
    q8_grid q = {.fp8 = fp8, .n_in = n_in, .scales = scales, .codes = codes};
    const gptq_grid g = {.ctx = &q, .group = n_in, .start = q8_start, .round = q8_round};
    double loss;
    return gptq_core(w, n_out, n_in, c, damp, false, 128, in_scale, &g, &loss, NULL, why, cap);
}
