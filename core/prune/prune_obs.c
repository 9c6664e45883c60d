/* prune_obs.c — structured Optimal Brain Surgeon for `luainfer prune`
 * (prune.h, docs/pruning.md).
 *
 * Removing input units of a linear y = W x (FFN channels of down_proj,
 * KV groups of o_proj) and refitting W's other columns by least squares
 * on the calibration inputs X is a quadratic problem in W with Hessian
 * H = X^T X (Hassibi & Stork 1993, "Optimal Brain Surgeon"; applied to
 * whole structures as in Kurtic et al. 2023, "ZipLM"). With Hinv = H^-1
 * and S a unit's columns, removing S at once and refitting the rest
 *     costs  E_S = tr(W_S (Hinv_SS)^-1 W_S^T)   (output error, summed over X)
 *     moves  W  -= W_S (Hinv_SS)^-1 Hinv[S, :]   (W_S becomes 0)
 * and the inverse Hessian of the remaining columns is Hinv with S
 * eliminated: Hinv -= Hinv[:, S] (Hinv_SS)^-1 Hinv[S, :]. Greedy removal
 * repeats this for the cheapest unit; because the objective is quadratic,
 * the W it ends with is the least-squares refit for the final set (what
 * test_prune checks against a direct solve). Everything is double. */
#include "prune/prune.h"
#include "quant/quant4.h"
#include "util/common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The eliminations' row updates are built for AVX2 and plain x86-64 as
 * quant/'s dense loops are (LI_HOT_CLONES; CMakeLists.txt vectorizes this file). */

/* out (wd) = x (wd) m (wd x wd), m read row by row (contiguous) */
LI_HOT_CLONES static void row_times(const double *x, const double *m, int64_t wd, double *out) {
    for (int64_t j = 0; j < wd; j++) out[j] = 0.0;
    for (int64_t i = 0; i < wd; i++) {
        const double xi = x[i], *mi = m + i * wd;
        if (xi != 0.0)
            for (int64_t j = 0; j < wd; j++) out[j] += xi * mi[j];
    }
}

/* m = (Hinv_SS)^-1 (w x w) for unit columns [c0, c0 + w) */
static int unit_inverse(const double *hinv, int64_t n, int64_t c0, int64_t w, double *m) {
    for (int64_t i = 0; i < w; i++)
        for (int64_t j = 0; j < w; j++) m[i * w + j] = hinv[(c0 + i) * n + c0 + j];
    return li_q4_spd_inverse(m, w);
}

/* E_S = sum over W's rows r of W[r,S] m W[r,S]^T */
static double unit_cost(const double *w, int64_t d_out, int64_t n, int64_t c0, int64_t wd, const double *m,
                        double *tmp) {
    double e = 0;
    for (int64_t r = 0; r < d_out; r++) {
        const double *wr = w + r * n + c0;
        row_times(wr, m, wd, tmp);
        for (int64_t j = 0; j < wd; j++) e += tmp[j] * wr[j];
    }
    return e;
}

/* Removes unit columns [c0, c0 + wd) with m = (Hinv_SS)^-1: W and Hinv
 * updated as the file comment says; scratch a (max(d_out, n), wd) and
 * hs_copy (wd, n). */
LI_HOT_CLONES static void unit_remove(double *w, int64_t d_out, double *hinv, int64_t n, int64_t c0, int64_t wd,
                                const double *m, double *a, double *hs_copy) {
    /* W -= (W_S m) Hinv[S, :] */
    for (int64_t r = 0; r < d_out; r++) row_times(w + r * n + c0, m, wd, a + r * wd);
    for (int64_t r = 0; r < d_out; r++) {
        double *wr = w + r * n;
        for (int64_t j = 0; j < wd; j++) {
            const double f = a[r * wd + j], *hs = hinv + (c0 + j) * n;
            if (f != 0.0)
                for (int64_t k = 0; k < n; k++) wr[k] -= f * hs[k];
        }
        for (int64_t j = 0; j < wd; j++) wr[c0 + j] = 0.0; /* exactly, not up to rounding */
    }
    /* Hinv -= (Hinv[:, S] m) Hinv[S, :] (Hinv symmetric: Hinv[:, S] = Hinv[S, :]^T) */
    for (int64_t r = 0; r < n; r++) row_times(hinv + r * n + c0, m, wd, a + r * wd);
    memcpy(hs_copy, hinv + c0 * n, (size_t)(wd * n) * sizeof(double)); /* rows S change in the loop */
    for (int64_t r = 0; r < n; r++) {
        double *hr = hinv + r * n;
        for (int64_t j = 0; j < wd; j++) {
            const double f = a[r * wd + j], *hs = hs_copy + j * n;
            if (f != 0.0)
                for (int64_t k = 0; k < n; k++) hr[k] -= f * hs[k];
        }
    }
    for (int64_t r = 0; r < n; r++) /* the eliminated rows and columns: exactly 0 */
        for (int64_t j = 0; j < wd; j++) hinv[r * n + c0 + j] = hinv[(c0 + j) * n + r] = 0.0;
}

/* The given units removed at once: with S their columns (ks of them),
 * W -= (W_S (Hinv_SS)^-1) Hinv[S, :] is the least-squares refit of the
 * others (the greedy loop's result in exact arithmetic, where one unit at
 * a time rewrites all of Hinv for each: k n^2 work and memory traffic
 * against one ks x ks inverse and a d_out x ks x n product). Eight rows
 * of W take each row of Hinv[S, :] while it is in cache. */
LI_HOT_CLONES static int obs_refit_at_once(double *w, int64_t d_out, int64_t n, const double *hinv, int64_t width,
                                           const uint8_t *drop) {
    int64_t ks = 0;
    for (int64_t c = 0; c < n; c++) ks += drop[c / width] != 0;
    int64_t *cols = li_xmalloc((size_t)LI_MAX(ks, 1) * sizeof *cols);
    ks = 0;
    for (int64_t c = 0; c < n; c++)
        if (drop[c / width]) cols[ks++] = c;
    double *m = li_xmalloc((size_t)LI_MAX(ks * ks, 1) * sizeof *m);
    for (int64_t i = 0; i < ks; i++)
        for (int64_t j = 0; j < ks; j++) m[i * ks + j] = hinv[cols[i] * n + cols[j]];
    if (li_q4_spd_inverse(m, ks)) {
        free(cols), free(m);
        return -1;
    }
    double *a = li_xmalloc((size_t)LI_MAX(d_out * ks, 1) * sizeof *a);
    double *ws = li_xmalloc((size_t)LI_MAX(ks, 1) * sizeof *ws);
    for (int64_t r = 0; r < d_out; r++) { /* A = W_S m, row by row */
        for (int64_t i = 0; i < ks; i++) ws[i] = w[r * n + cols[i]];
        row_times(ws, m, ks, a + r * ks);
    }
    for (int64_t r0 = 0; r0 < d_out; r0 += 8) {
        const int64_t nr = LI_MIN((int64_t)8, d_out - r0);
        for (int64_t i = 0; i < ks; i++) {
            const double *hs = hinv + cols[i] * n;
            for (int64_t r = r0; r < r0 + nr; r++) {
                const double f = a[r * ks + i];
                double *wr = w + r * n;
                if (f != 0.0)
                    for (int64_t c = 0; c < n; c++) wr[c] -= f * hs[c];
            }
        }
    }
    for (int64_t r = 0; r < d_out; r++) /* exactly, not up to rounding */
        for (int64_t i = 0; i < ks; i++) w[r * n + cols[i]] = 0.0;
    free(cols), free(m), free(a), free(ws);
    return 0;
}

int li_prune_obs(double *w, int64_t d_out, int64_t n, double *h, int64_t width, int64_t k, double damp, bool choose,
                 uint8_t *drop, double *score, li_error *err) {
    if (width < 1 || n % width || d_out < 1)
        return li_error_set(err, LI_EINVAL, "prune: obs: %lld columns are not whole units of %ld", (long long)n,
                            (long)width);
    const int64_t units = n / width;
    if (k < 0 || k >= units)
        return li_error_set(err, LI_ERANGE, "prune: obs: cannot remove %lld of %lld units", (long long)k,
                            (long long)units);
    /* damping, as GPTQ's: a fraction of the mean diagonal, and a dead input
     * (never nonzero in the calibration text) gets the mean diagonal first
     * so H stays invertible (its column is then cheap to remove) */
    double mean = 0;
    for (int64_t i = 0; i < n; i++) mean += h[i * n + i];
    mean /= (double)n;
    for (int64_t i = 0; i < n; i++) {
        if (h[i * n + i] == 0.0) h[i * n + i] = mean > 0 ? mean : 1.0;
        h[i * n + i] += damp * mean;
    }
    if (li_q4_spd_inverse(h, n))
        return li_error_set(err, LI_ERANGE, "prune: obs: the calibration Hessian is not positive definite (raise "
                            "--damp)");
    double *m = li_xmalloc((size_t)(width * width) * sizeof(double));
    double *tmp = li_xmalloc((size_t)width * sizeof(double));
    double *a = li_xmalloc((size_t)(LI_MAX(d_out, n) * width) * sizeof(double));
    double *hs = li_xmalloc((size_t)(n * width) * sizeof(double));
    int64_t *order = li_xmalloc((size_t)units * sizeof(int64_t));
    int64_t n_given = 0;
    if (!choose)
        for (int64_t u = 0; u < units; u++)
            if (drop[u]) order[n_given++] = u;
    if (!choose && n_given != k) {
        free(m), free(tmp), free(a), free(hs), free(order);
        return li_error_set(err, LI_EINVAL, "prune: obs: %lld units marked, %lld expected", (long long)n_given,
                            (long long)k);
    }
    if (choose) memset(drop, 0, (size_t)units);
    int rc = 0;
    if (!choose && !score) { /* nothing to choose or score: every unit at once */
        free(m), free(tmp), free(a), free(hs), free(order);
        if (obs_refit_at_once(w, d_out, n, h, width, drop))
            return li_error_set(err, LI_ERANGE, "prune: obs: the inverse Hessian lost positive definiteness (raise "
                                "--damp)");
        return 0;
    }
    for (int64_t step = 0; step < k && !rc; step++) {
        int64_t best = -1;
        double best_e = INFINITY;
        if (choose) {
            for (int64_t u = 0; u < units && !rc; u++) {
                if (drop[u]) continue;
                if (unit_inverse(h, n, u * width, width, m)) {
                    rc = -1;
                    break;
                }
                const double e = unit_cost(w, d_out, n, u * width, width, m, tmp);
                if (e < best_e) best_e = e, best = u; /* ties: the lower index */
            }
        } else {
            best = order[step];
        }
        if (!rc && best < 0) { /* every cost NaN */
            free(m), free(tmp), free(a), free(hs), free(order);
            return li_error_set(err, LI_EINVAL, "prune: obs: no finite removal cost (NaN or Inf in the weights or the "
                                "calibration activations)");
        }
        if (!rc && unit_inverse(h, n, best * width, width, m)) rc = -1;
        if (rc) break;
        if (score) score[best] = unit_cost(w, d_out, n, best * width, width, m, tmp);
        unit_remove(w, d_out, h, n, best * width, width, m, a, hs);
        drop[best] = 1;
    }
    if (!rc && score) /* the kept units: what removing each would cost now */
        for (int64_t u = 0; u < units && !rc; u++) {
            if (drop[u]) continue;
            if (unit_inverse(h, n, u * width, width, m)) rc = -1;
            else score[u] = unit_cost(w, d_out, n, u * width, width, m, tmp);
        }
    free(m);
    free(tmp);
    free(a);
    free(hs);
    free(order);
    if (rc)
        return li_error_set(err, LI_ERANGE, "prune: obs: the inverse Hessian lost positive definiteness (raise "
                            "--damp)");
    return 0;
}
