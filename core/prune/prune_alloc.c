/* prune_alloc.c — `prune --what ffn --refit --ffn-alloc error|kl`: how many
 * FFN channels each block keeps, instead of the same count everywhere.
 *
 * Blocks differ in how much of their output their strongest channels carry
 * once down_proj's kept columns are refit (bench/prune_refit_targets.py
 * alloc, a float32 NumPy probe: held-out KLD 1.050 with a uniform 21% cut,
 * 0.840 with this allocation of the same channel count).
 *
 * The error curve of block l: down_proj W (d x n), its inputs' Gram
 * H = X^T X damped as the refit damps it (li_prune_obs), and the channels in
 * the ranking's order (score descending). Keeping the first k and refitting
 * their columns by least squares leaves
 *     E(k) = min_V tr((W - [V 0]) H (W - [V 0])^T).
 * With H (in that order) = L L^T, the optimum is V = W H[:, :k] H_kk^-1 and,
 * since H[:, :k] = L[:, :k] L_kk^T, E(k) = ||L^T W^T||^2 - ||(L^T W^T)[:k]||^2:
 * with Y = L^T W^T (row i = sum_{j >= i} L[j][i] W[:, j]),
 *     E(k) = sum_{i >= k} ||Y_i||^2,
 * every k's error from one Cholesky factor and one triangular product.
 *
 * The allocation: channels go `unit` at a time from the block whose error,
 * over the squared norm of its residual stream after the block on the
 * same tokens (so blocks weigh by what their error is relative to), grows
 * least, each block keeping at least `floor` (prune.c: --ffn-floor times
 * the uniform count; the curves alone cut the middle blocks too deep),
 * until the uniform cut's count is gone.
 *
 * --ffn-alloc kl measures instead of modelling: prune.c cuts one block at a
 * time to a few widths (its refit included) and takes the KL of the whole
 * model's distributions on calibration windows; li_prune_ffn_curve_interp
 * joins the points into the curve the same greedy reads (no sig, no
 * floor: the last measured width is the limit). */
#include "prune/prune.h"
#include "quant/quant4.h"
#include "util/common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* y (n, d) += L^T wt: row i of y adds L[j][i] wt[j] for j >= i, j
 * increasing. CURVE_ROWS rows of wt a pass over y (y's row i takes their
 * terms four at a time while it is in L1), not one: y is 7 MB for a
 * 1536-wide layer. */
#define CURVE_ROWS 16
LI_HOT_CLONES static void curve_product(const double *l, const double *wt, int64_t n, int64_t d, double *y) {
    for (int64_t j0 = 0; j0 < n; j0 += CURVE_ROWS) {
        const int64_t j1 = LI_MIN(j0 + CURVE_ROWS, n);
        for (int64_t i = 0; i < j1; i++) {
            double *yi = y + i * d;
            int64_t j = LI_MAX(j0, i);
            for (; j + 4 <= j1; j += 4) {
                const double c0 = l[j * n + i], c1 = l[(j + 1) * n + i], c2 = l[(j + 2) * n + i],
                             c3 = l[(j + 3) * n + i];
                const double *w0 = wt + j * d, *w1 = w0 + d, *w2 = w1 + d, *w3 = w2 + d;
                li_axpy4_f64(yi, d, w0, w1, w2, w3, c0, c1, c2, c3);
            }
            for (; j < j1; j++) {
                const double c = l[j * n + i], *wj = wt + j * d;
                for (int64_t r = 0; r < d; r++) yi[r] += c * wj[r];
            }
        }
    }
}

int li_prune_ffn_curve(const double *xtx, const double *w, int64_t d, int64_t n, const double *score, double damp,
                       double *curve, li_error *err) {
    int64_t *order = li_xmalloc((size_t)n * sizeof *order);
    for (int64_t i = 0; i < n; i++) order[i] = i;
    /* score descending, ties: the higher index first; the kept prefix is then what
     * li_prune_lowest keeps (it drops the lowest, ties the lower index first) */
    for (int64_t i = 1; i < n; i++) {
        const int64_t v = order[i];
        int64_t j = i;
        while (j > 0 && score[order[j - 1]] <= score[v]) order[j] = order[j - 1], j--;
        order[j] = v;
    }
    double mean = 0;
    for (int64_t i = 0; i < n; i++) mean += xtx[i * n + i];
    mean /= (double)n;
    double *h = li_aligned_alloc((size_t)(n * n) * sizeof *h); /* 64-byte rows for the factor's vector loads */
    for (int64_t i = 0; i < n; i++) {
        for (int64_t j = 0; j < n; j++) h[i * n + j] = xtx[order[i] * n + order[j]];
        /* li_prune_obs's damping: a dead input gets the mean diagonal first */
        if (h[i * n + i] == 0.0) h[i * n + i] = mean > 0 ? mean : 1.0;
        h[i * n + i] += damp * mean;
    }
    if (li_q4_cholesky(h, n)) {
        li_aligned_free(h), free(order);
        return li_error_set(err, LI_ERANGE, "prune: --ffn-alloc: the calibration Hessian is not positive definite "
                                            "(raise --damp)");
    }
    /* Y = L^T W^T, n x d: row j of L adds L[j][i] W[:, order[j]] to row i <= j */
    double *wt = li_aligned_alloc((size_t)(n * d) * sizeof *wt), *y = li_aligned_alloc((size_t)(n * d) * sizeof *y);
    memset(y, 0, (size_t)(n * d) * sizeof *y);
    for (int64_t j = 0; j < n; j++)
        for (int64_t r = 0; r < d; r++) wt[j * d + r] = w[r * n + order[j]];
    curve_product(h, wt, n, d, y);
    curve[n] = 0.0;
    for (int64_t i = n - 1; i >= 0; i--) {
        double s = 0;
        for (int64_t r = 0; r < d; r++) s += y[i * d + r] * y[i * d + r];
        curve[i] = curve[i + 1] + s;
    }
    li_aligned_free(y), li_aligned_free(wt), li_aligned_free(h), free(order);
    return 0;
}

void li_prune_ffn_curve_interp(const int64_t *removed, const double *kl, int n_pts, int64_t n, double *curve) {
    int64_t r0 = 0;
    double c0 = 0.0;
    for (int64_t r = 0; r <= n; r++) curve[n - r] = INFINITY;
    curve[n] = 0.0;
    for (int j = 0; j < n_pts; j++) {
        const int64_t r1 = removed[j];
        for (int64_t r = r0 + 1; r <= r1 && r <= n; r++)
            curve[n - r] = c0 + (kl[j] - c0) * (double)(r - r0) / (double)(r1 - r0);
        r0 = r1, c0 = kl[j];
    }
}

int li_prune_ffn_allocate(const double *const *curve, const double *sig, int n_layer, int64_t n, int64_t unit,
                          int64_t floor, int64_t remove, int64_t *keep, li_error *err) {
    for (int l = 0; l < n_layer; l++) keep[l] = n;
    while (remove > 0) {
        const int64_t step = LI_MIN(unit, remove);
        int best = -1;
        double best_c = INFINITY;
        for (int l = 0; l < n_layer; l++) {
            if (keep[l] - step < floor) continue;
            const double c = (curve[l][keep[l] - step] - curve[l][keep[l]]) / (sig && sig[l] > 0 ? sig[l] : 1.0);
            if (c < best_c) best_c = c, best = l;
        }
        if (best < 0)
            return li_error_set(err, LI_ERANGE, "prune: --ffn-alloc: %lld more channels cannot go with every block "
                                                "keeping at least %lld", (long long)remove, (long long)floor);
        keep[best] -= step;
        remove -= step;
    }
    return 0;
}
