/* medusa_tmpl.h — the Medusa heads' forward and backward passes over
 * `real`, included by medusa_f32.c (training) and medusa_f64.c (the
 * gradient checks of tests/unit/test_train_medusa.c), as train_tmpl.h.
 * No include guard: included once per type.
 *
 * The including file defines real, TR(name), TR_EXP, TR_MM_NT, TR_MM_ACC
 * (as train_tmpl.h) and
 *   TR_LOSS(tp, logits, lab, teacher, dlogits, N, V, alpha, temp, gscale, kl)
 * the seed's loss over rows (li_trop_loss's contract). */

#include <string.h>

/* A(N, d) = H·W^T + b;  Z = H + silu(A);  logits(N, V) = Z·E^T */
void TR(li_train_medusa_head_fwd)(const real *H, const real *W, const real *b, const real *E, real *A, real *Z,
                            real *logits, int64_t N, int64_t d, int64_t V, void *tp) {
    TR_MM_NT(tp, H, W, A, N, d, d);
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < d; j++) {
            const real a = (A[i * d + j] += b[j]);
            Z[i * d + j] = H[i * d + j] + a / ((real)1 + TR_EXP(-a));
        }
    TR_MM_NT(tp, Z, E, logits, N, V, d);
}

/* dZ(N, d) = dlogits·E (written), then in place dA = dZ ⊙ silu'(A) with
 * silu'(a) = σ(a)(1 + a(1 − σ(a))); dW(d, d) += dA^T·H; db += Σ_rows dA.
 * The base is frozen: no gradient flows into H or E. */
void TR(li_train_medusa_head_bwd)(const real *H, const real *A, const real *E, const real *dlogits, real *dZ,
                            real *dW, real *db, int64_t N, int64_t d, int64_t V, void *tp) {
    memset(dZ, 0, (size_t)(N * d) * sizeof(real));
    TR_MM_ACC(tp, dlogits, V, 1, E, dZ, N, V, d);
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < d; j++) {
            const real a = A[i * d + j], s = (real)1 / ((real)1 + TR_EXP(-a));
            const real da = dZ[i * d + j] * s * ((real)1 + a * ((real)1 - s));
            dZ[i * d + j] = da;
            db[j] += da;
        }
    TR_MM_ACC(tp, dZ, 1, d, H, dW, d, N, d);
}

/* All K heads over one window (medusa.h's li_train_medusa_forward_backward):
 * head k at position t learns token t+k+2 against base row t+k+1; the
 * loss is the mean over heads of each head's mean over its positions, so
 * head k's gradients are scaled by gscale / K. Returns that loss. */
double TR(li_train_medusa_fb)(const real *P, real *G, int K, const real *E, const real *H, const float *base,
                        const int32_t *tok, int64_t N, int64_t d, int64_t V, real alpha, real temp,
                        real gscale, real *ws, int32_t *lab, void *tp, double *loss_k, double *kl_k) {
    const int64_t per = d * d + d, nd = (N * d + 15) & ~(int64_t)15, nv = (N * V + 15) & ~(int64_t)15;
    real *A = ws, *Z = ws + nd, *dZ = ws + 2 * nd, *logits = ws + 3 * nd, *dlogits = ws + 3 * nd + nv;
    double total = 0;
    for (int k = 0; k < K; k++) {
        const real *W = P + k * per, *b = W + d * d;
        for (int64_t t = 0; t < N; t++) lab[t] = t + k + 2 < N ? tok[t + k + 2] : -1;
        TR(li_train_medusa_head_fwd)(H, W, b, E, A, Z, logits, N, d, V, tp);
        double kl = 0;
        /* base row t+k+1 is read only where lab[t] >= 0, i.e. t+k+2 < N */
        const double l = TR_LOSS(tp, logits, lab, base + (k + 1) * V, dlogits, N, V, alpha, temp,
                                 gscale / (real)K, &kl);
        if (loss_k) loss_k[k] = l;
        if (kl_k) kl_k[k] = kl;
        total += l;
        if (G) TR(li_train_medusa_head_bwd)(H, A, E, dlogits, dZ, G + k * per, G + k * per + d * d, N, d, V, tp);
    }
    return total / K;
}
