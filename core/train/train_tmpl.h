/* train_tmpl.h — the ops of training and the model's forward and backward
 * passes, written once over `real` and included by train_f32.c (real =
 * float: what training runs) and train_f64.c (real = double: what the
 * gradient checks difference). No include guard: included once per type.
 *
 * The including file defines:
 *   real                       float or double
 *   TR(name)                   name with the type's suffix (name_f32)
 *   TR_SQRT TR_EXP TR_LOG TR_POW TR_COS TR_SIN   the type's libm calls
 *   TR_MM_NT(tp, x, W, y, n, m, k)               y = x · W^T
 *   TR_MM_ACC(tp, A, sa_r, sa_l, B, C, R, L, K)  C += A · B
 *
 * Conventions: N = B·T rows; an op's backward ADDS into parameter
 * gradients (dw) and into dx where it says "+=", so residual branches and
 * the tied head accumulate without copies. */

#include <stdlib.h>
#include <string.h>

/* ==== embedding ========================================================== */

/* x(N, d) = E[tok[i]] */
void TR(li_trop_embed_fwd)(const real *E, const int32_t *tok, real *x, int64_t N, int64_t d) {
    for (int64_t i = 0; i < N; i++) memcpy(x + i * d, E + (int64_t)tok[i] * d, (size_t)d * sizeof(real));
}

/* dE[tok[i]] += dx(i): a scatter-add (a token seen twice gets both) */
void TR(li_trop_embed_bwd)(real *dE, const int32_t *tok, const real *dx, int64_t N, int64_t d) {
    for (int64_t i = 0; i < N; i++) {
        real *row = dE + (int64_t)tok[i] * d;
        for (int64_t j = 0; j < d; j++) row[j] += dx[i * d + j];
    }
}

/* ==== RMSNorm ============================================================= */

/* y(N, d) = x · rstd · w, rstd(N) = 1 / sqrt(mean(x²) + eps) (sums in
 * double, as the engine's kernels) */
void TR(li_trop_rmsnorm_fwd)(const real *x, const real *w, real *y, real *rstd, int64_t N, int64_t d, real eps) {
    for (int64_t i = 0; i < N; i++) {
        const real *xr = x + i * d;
        double ss = 0;
        for (int64_t j = 0; j < d; j++) ss += (double)xr[j] * xr[j];
        const real r = (real)1 / TR_SQRT((real)(ss / (double)d) + eps);
        rstd[i] = r;
        for (int64_t j = 0; j < d; j++) y[i * d + j] = xr[j] * r * w[j];
    }
}

/* dx += rstd·w·dy − x · rstd³/d · Σ(dy·w·x);  dw += Σ_rows dy·x·rstd (dw may be NULL) */
void TR(li_trop_rmsnorm_bwd)(const real *x, const real *w, const real *rstd, const real *dy, real *dx, real *dw,
                             int64_t N, int64_t d) {
    for (int64_t i = 0; i < N; i++) {
        const real *xr = x + i * d, *dyr = dy + i * d;
        const real r = rstd[i];
        double dot = 0;
        for (int64_t j = 0; j < d; j++) dot += (double)dyr[j] * w[j] * xr[j];
        const real c = (real)(dot * (double)r * r * r / (double)d);
        for (int64_t j = 0; j < d; j++) dx[i * d + j] += r * w[j] * dyr[j] - xr[j] * c;
        if (dw)
            for (int64_t j = 0; j < d; j++) dw[j] += dyr[j] * xr[j] * r;
    }
}

/* ==== RoPE ================================================================ */

/* cs(T, half, 2): cos and sin of pos · theta^(-2j/n_rot) for pos 0..T-1,
 * the angle stepped by one multiply per pair as the engine's rope does */
void TR(li_trop_rope_table)(real *cs, int T, int n_rot, real theta) {
    const int half = n_rot / 2;
    const real scale = TR_POW(theta, (real)-2 / (real)n_rot);
    for (int p = 0; p < T; p++) {
        real angle = (real)p;
        for (int j = 0; j < half; j++, angle *= scale) {
            cs[((int64_t)p * half + j) * 2] = TR_COS(angle);
            cs[((int64_t)p * half + j) * 2 + 1] = TR_SIN(angle);
        }
    }
}

/* In place on x(N, H, hd), row i at position i % T: the first n_rot dims
 * of each head rotated; neox pairs (j, j + n_rot/2), else (2j, 2j+1).
 * dir = +1 forward; -1 rotates back, which is the backward pass (a
 * rotation's transpose is its inverse). */
static void TR(rope_rows)(real *x, const real *cs, int64_t i0, int64_t i1, int T, int H, int hd, int n_rot, int neox,
                          int dir) {
    const int half = n_rot / 2;
    for (int64_t i = i0; i < i1; i++) {
        const real *c = cs + (int64_t)(i % T) * half * 2;
        for (int h = 0; h < H; h++) {
            real *v = x + (i * H + h) * hd;
            for (int j = 0; j < half; j++) {
                const real co = c[2 * j], si = dir > 0 ? c[2 * j + 1] : -c[2 * j + 1];
                const int i0 = neox ? j : 2 * j, i1 = neox ? j + half : 2 * j + 1;
                const real x0 = v[i0], x1 = v[i1];
                v[i0] = x0 * co - x1 * si;
                v[i1] = x0 * si + x1 * co;
            }
        }
    }
}

void TR(li_trop_rope)(real *x, const real *cs, int64_t N, int T, int H, int hd, int n_rot, int neox, int dir) {
    TR(rope_rows)(x, cs, 0, N, T, H, hd, n_rot, neox, dir);
}

/* ==== causal attention with GQA ========================================== */

/* Jobs on the thread pool (li_train_par): forward and the backward's dq
 * over (b, h, block of query rows), the backward's dk and dv over (b, kv
 * head, block of key rows). Every output element is written by one job
 * with its sums in a fixed order, so the bits do not depend on the
 * thread count. The jobs have AVX2 clones (LI_HOT_CLONES; CMakeLists.txt
 * vectorizes train_f32.c and train_f64.c): their head_dim-long axpys and
 * the dots' eight lanes become vectors, each element's operations the
 * same, so the bits do not depend on the CPU either. */
#define TR_ATT_ROWS 16

/* Σ a·b over n with eight partial sums added in a fixed tree: one running
 * sum waits an add's latency per element, which made these head_dim-long
 * dots a tenth of a step */
static inline real TR(dot)(const real *a, const real *b, int n) {
    real s[8] = {0};
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int u = 0; u < 8; u++) s[u] += a[j + u] * b[j + u];
    for (int u = 0; j < n; j++, u++) s[u] += a[j] * b[j];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

typedef struct TR(att_ctx) {
    const real *q, *k, *v, *P, *dout;
    real *Pw, *out, *dq, *dk, *dv, *dS;
    int B, T, H, Hkv, hd, nblk;
} TR(att_ctx);

LI_HOT_CLONES static void TR(att_fwd_job)(void *ctx, int64_t job) {
    const TR(att_ctx) *c = ctx;
    const int T = c->T, H = c->H, Hkv = c->Hkv, hd = c->hd, grp = H / Hkv;
    const int bh = (int)(job / c->nblk), b = bh / H, h = bh % H, hk = h / grp;
    const int t0 = (int)(job % c->nblk) * TR_ATT_ROWS, t1 = LI_MIN(T, t0 + TR_ATT_ROWS);
    const real scale = (real)1 / TR_SQRT((real)hd);
    for (int t = t0; t < t1; t++) {
        const real *qt = c->q + (((int64_t)b * T + t) * H + h) * hd;
        real *p = c->Pw + (((int64_t)b * H + h) * T + t) * T;
        real mx = -INFINITY;
        for (int s = 0; s <= t; s++) {
            const real *ks = c->k + (((int64_t)b * T + s) * Hkv + hk) * hd;
            p[s] = TR(dot)(qt, ks, hd) * scale;
            if (p[s] > mx) mx = p[s];
        }
        real sum = 0;
        for (int s = 0; s <= t; s++) sum += (p[s] = TR_EXP(p[s] - mx));
        const real inv = (real)1 / sum;
        for (int s = 0; s <= t; s++) p[s] *= inv;
        for (int s = t + 1; s < T; s++) p[s] = 0;
        real *o = c->out + (((int64_t)b * T + t) * H + h) * hd;
        for (int j = 0; j < hd; j++) o[j] = 0;
        for (int s = 0; s <= t; s++) {
            const real *vs = c->v + (((int64_t)b * T + s) * Hkv + hk) * hd;
            for (int j = 0; j < hd; j++) o[j] += p[s] * vs[j];
        }
    }
}

/* q(B, T, H, hd), k and v (B, T, Hkv, hd); query head h reads kv head
 * h / (H / Hkv). P(B, H, T, T) keeps the softmax rows (zero above the
 * diagonal); out(B, T, H, hd) = P · V. */
void TR(li_trop_attn_fwd)(const real *q, const real *k, const real *v, real *P, real *out, int B, int T, int H,
                          int Hkv, int hd, void *tp) {
    TR(att_ctx) c = {.q = q, .k = k, .v = v, .Pw = P, .out = out, .B = B, .T = T, .H = H, .Hkv = Hkv, .hd = hd,
                     .nblk = (T + TR_ATT_ROWS - 1) / TR_ATT_ROWS};
    li_train_par(tp, TR(att_fwd_job), &c, (int64_t)B * H * c.nblk, 0);
}

/* rows t of (b, h): dP = dout·V^T, dS = P ⊙ (dP − Σ dP⊙P)·scale kept, dq = dS·K */
LI_HOT_CLONES static void TR(att_dq_job)(void *ctx, int64_t job) {
    const TR(att_ctx) *c = ctx;
    const int T = c->T, H = c->H, Hkv = c->Hkv, hd = c->hd, grp = H / Hkv;
    const int bh = (int)(job / c->nblk), b = bh / H, h = bh % H, hk = h / grp;
    const int t0 = (int)(job % c->nblk) * TR_ATT_ROWS, t1 = LI_MIN(T, t0 + TR_ATT_ROWS);
    const real scale = (real)1 / TR_SQRT((real)hd);
    for (int t = t0; t < t1; t++) {
        const real *p = c->P + (((int64_t)b * H + h) * T + t) * T;
        real *ds = c->dS + (((int64_t)b * H + h) * T + t) * T;
        const real *dot_ = c->dout + (((int64_t)b * T + t) * H + h) * hd;
        real *dqt = c->dq + (((int64_t)b * T + t) * H + h) * hd;
        real rsum = 0;
        for (int s = 0; s <= t; s++) {
            const real *vs = c->v + (((int64_t)b * T + s) * Hkv + hk) * hd;
            const real dp = TR(dot)(dot_, vs, hd);
            ds[s] = dp;
            rsum += dp * p[s];
        }
        for (int j = 0; j < hd; j++) dqt[j] = 0;
        for (int s = 0; s <= t; s++) {
            ds[s] = p[s] * (ds[s] - rsum) * scale;
            const real *ks = c->k + (((int64_t)b * T + s) * Hkv + hk) * hd;
            for (int j = 0; j < hd; j++) dqt[j] += ds[s] * ks[j];
        }
    }
}

/* key rows s of (b, kv head): dk += Σ_h Σ_t≥s dS·q, dv += Σ_h Σ_t≥s P·dout */
LI_HOT_CLONES static void TR(att_dkv_job)(void *ctx, int64_t job) {
    const TR(att_ctx) *c = ctx;
    const int T = c->T, H = c->H, Hkv = c->Hkv, hd = c->hd, grp = H / Hkv;
    const int bk = (int)(job / c->nblk), b = bk / Hkv, hk = bk % Hkv;
    const int s0 = (int)(job % c->nblk) * TR_ATT_ROWS, s1 = LI_MIN(T, s0 + TR_ATT_ROWS);
    for (int s = s0; s < s1; s++) {
        real *dks = c->dk + (((int64_t)b * T + s) * Hkv + hk) * hd;
        real *dvs = c->dv + (((int64_t)b * T + s) * Hkv + hk) * hd;
        for (int h = hk * grp; h < (hk + 1) * grp; h++)
            for (int t = s; t < T; t++) {
                const int64_t pi = (((int64_t)b * H + h) * T + t) * T + s;
                const real ds = c->dS[pi], pp = c->P[pi];
                const real *qt = c->q + (((int64_t)b * T + t) * H + h) * hd;
                const real *dot_ = c->dout + (((int64_t)b * T + t) * H + h) * hd;
                for (int j = 0; j < hd; j++) {
                    dks[j] += ds * qt[j];
                    dvs[j] += pp * dot_[j];
                }
            }
    }
}

/* dq = (written) dS·K·scale; dk += dS^T·Q·scale; dv += P^T·dout, with
 * dP = dout·V^T and dS = P ⊙ (dP − Σ dP⊙P). dk and dv are added to (the
 * caller zeroes them). dS: B·H·T·T reals of scratch. */
void TR(li_trop_attn_bwd)(const real *q, const real *k, const real *v, const real *P, const real *dout, real *dq,
                          real *dk, real *dv, real *dS, int B, int T, int H, int Hkv, int hd, void *tp) {
    TR(att_ctx) c = {.q = q, .k = k, .v = v, .P = P, .dout = dout, .dq = dq, .dk = dk, .dv = dv, .dS = dS,
                     .B = B, .T = T, .H = H, .Hkv = Hkv, .hd = hd, .nblk = (T + TR_ATT_ROWS - 1) / TR_ATT_ROWS};
    li_train_par(tp, TR(att_dq_job), &c, (int64_t)B * H * c.nblk, 0);
    li_train_par(tp, TR(att_dkv_job), &c, (int64_t)B * Hkv * c.nblk, 0);
}

/* ==== SwiGLU ============================================================== */

/* h = silu(g) · u */
void TR(li_trop_swiglu_fwd)(const real *g, const real *u, real *h, int64_t n) {
    for (int64_t i = 0; i < n; i++) h[i] = g[i] / ((real)1 + TR_EXP(-g[i])) * u[i];
}

/* dg = dh · u · σ(g)(1 + g(1 − σ(g))), du = dh · silu(g) (written) */
void TR(li_trop_swiglu_bwd)(const real *g, const real *u, const real *dh, real *dg, real *du, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const real s = (real)1 / ((real)1 + TR_EXP(-g[i]));
        dg[i] = dh[i] * u[i] * s * ((real)1 + g[i] * ((real)1 - s));
        du[i] = dh[i] * g[i] * s;
    }
}

/* ==== the rotated model's online Hadamard ================================== */

/* Each row of x(N, dim) through y = H·diag(s)·x (dir 1: what the engine's
 * hadamard op does before a rotated model's down_proj: the signs s, then
 * the orthonormal Sylvester-Hadamard transform in blocks of `block`), or
 * its transpose diag(s)·H·dy (dir -1: H is symmetric), the backward pass. */
void TR(li_trop_hadamard)(real *x, const float *s, int64_t N, int64_t dim, int64_t block, int dir) {
    const real scale = (real)1 / TR_SQRT((real)block);
    for (int64_t i = 0; i < N; i++) {
        real *xr = x + i * dim;
        if (dir > 0)
            for (int64_t j = 0; j < dim; j++) xr[j] *= (real)s[j];
        for (int64_t b0 = 0; b0 < dim; b0 += block) {
            real *v = xr + b0;
            for (int64_t h = 1; h < block; h *= 2)
                for (int64_t a = 0; a < block; a += 2 * h)
                    for (int64_t j = a; j < a + h; j++) {
                        const real p = v[j], q = v[j + h];
                        v[j] = p + q;
                        v[j + h] = p - q;
                    }
            for (int64_t j = 0; j < block; j++) v[j] *= scale;
        }
        if (dir < 0)
            for (int64_t j = 0; j < dim; j++) xr[j] *= (real)s[j];
    }
}

/* ==== a scheme's activation rounding ====================================== */

/* Each row of x(N, d) rounded in place as the engine rounds a scheme
 * weight's input (li_act_quant_row_ref: per row, int8 / int4 codes or e4m3
 * of x / s). The backward pass treats it as the identity (straight through). */
void TR(li_trop_act_quant)(real *x, int64_t N, int64_t d, int act) {
    if (act == LI_ACT_F32) return;
    float *f = sizeof(real) == sizeof(float) ? NULL : li_xmalloc((size_t)d * sizeof(float));
    for (int64_t i = 0; i < N; i++) {
        real *xr = x + i * d;
        if (!f) {
            li_act_quant_row_ref((li_act_quant)act, (float *)xr, (float *)xr, d);
            continue;
        }
        for (int64_t j = 0; j < d; j++) f[j] = (float)xr[j];
        li_act_quant_row_ref((li_act_quant)act, f, f, d);
        for (int64_t j = 0; j < d; j++) xr[j] = (real)f[j];
    }
    free(f);
}

/* ==== the O(N·d) ops on the pool ============================================ */

/* RMSNorm, RoPE and SwiGLU over ranges of TR_PAR_ROWS rows (RMSNorm's dw
 * over ranges of columns, each summed over all rows in order): every
 * element is computed by the serial op's code in its order, so the bits
 * are the serial op's whatever the thread count. Exported (li_trop_*_par)
 * for the EAGLE draft's passes (eagle_tmpl.h). */
#define TR_PAR_ROWS 16
#define TR_PAR_COLS 64
enum { TR_PAR_NORM, TR_PAR_NORM_DX, TR_PAR_NORM_DW, TR_PAR_ROPE, TR_PAR_GLU, TR_PAR_GLU_BWD, TR_PAR_HAD, TR_PAR_ACTQ };

typedef struct TR(par_ctx) {
    int op;
    const real *x, *w, *rstd, *dy, *cs, *g, *u;
    real *y, *rstd_out, *dx, *dw, *v, *dg, *du;
    const float *sgn; /* TR_PAR_HAD's signs */
    int64_t N, d; /* rows, and the elements per row */
    int64_t block;
    real eps;
    int T, H, hd, n_rot, neox, dir;
} TR(par_ctx);

static void TR(par_job)(void *ctx, int64_t job) {
    const TR(par_ctx) *c = ctx;
    const int64_t d = c->d, i0 = job * TR_PAR_ROWS, n = LI_MIN((int64_t)TR_PAR_ROWS, c->N - i0);
    switch (c->op) {
    case TR_PAR_NORM:
        TR(li_trop_rmsnorm_fwd)(c->x + i0 * d, c->w, c->y + i0 * d, c->rstd_out + i0, n, d, c->eps);
        break;
    case TR_PAR_NORM_DX:
        TR(li_trop_rmsnorm_bwd)(c->x + i0 * d, c->w, c->rstd + i0, c->dy + i0 * d, c->dx + i0 * d, NULL, n, d);
        break;
    case TR_PAR_NORM_DW: {
        const int64_t j0 = job * TR_PAR_COLS, j1 = LI_MIN(j0 + TR_PAR_COLS, d);
        for (int64_t i = 0; i < c->N; i++) {
            const real *dyr = c->dy + i * d, *xr = c->x + i * d;
            const real r = c->rstd[i];
            for (int64_t j = j0; j < j1; j++) c->dw[j] += dyr[j] * xr[j] * r;
        }
        break;
    }
    case TR_PAR_ROPE: TR(rope_rows)(c->v, c->cs, i0, i0 + n, c->T, c->H, c->hd, c->n_rot, c->neox, c->dir); break;
    case TR_PAR_GLU: TR(li_trop_swiglu_fwd)(c->g + i0 * d, c->u + i0 * d, c->v + i0 * d, n * d); break;
    case TR_PAR_GLU_BWD:
        TR(li_trop_swiglu_bwd)(c->g + i0 * d, c->u + i0 * d, c->dy + i0 * d, c->dg + i0 * d, c->du + i0 * d, n * d);
        break;
    case TR_PAR_HAD: TR(li_trop_hadamard)(c->v + i0 * d, c->sgn, n, d, c->block, c->dir); break;
    case TR_PAR_ACTQ: TR(li_trop_act_quant)(c->v + i0 * d, n, d, c->dir); break;
    }
}

static int64_t TR(par_row_jobs)(int64_t N) { return (N + TR_PAR_ROWS - 1) / TR_PAR_ROWS; }

void TR(li_trop_rmsnorm_fwd_par)(void *tp, const real *x, const real *w, real *y, real *rstd, int64_t N,
                                 int64_t d, real eps) {
    TR(par_ctx) c = {.op = TR_PAR_NORM, .x = x, .w = w, .y = y, .rstd_out = rstd, .N = N, .d = d, .eps = eps};
    li_train_par(tp, TR(par_job), &c, TR(par_row_jobs)(N), c.op);
}

/* li_trop_rmsnorm_bwd's dx, then its dw (when not NULL) */
void TR(li_trop_rmsnorm_bwd_par)(void *tp, const real *x, const real *w, const real *rstd, const real *dy,
                                 real *dx, real *dw, int64_t N, int64_t d) {
    TR(par_ctx) c = {.op = TR_PAR_NORM_DX, .x = x, .w = w, .rstd = rstd, .dy = dy, .dx = dx, .dw = dw, .N = N, .d = d};
    li_train_par(tp, TR(par_job), &c, TR(par_row_jobs)(N), c.op);
    if (!dw) return;
    c.op = TR_PAR_NORM_DW;
    li_train_par(tp, TR(par_job), &c, (d + TR_PAR_COLS - 1) / TR_PAR_COLS, c.op);
}

void TR(li_trop_rope_par)(void *tp, real *x, const real *cs, int64_t N, int T, int H, int hd, int n_rot,
                          int neox, int dir) {
    TR(par_ctx) c = {.op = TR_PAR_ROPE, .v = x, .cs = cs, .N = N, .T = T, .H = H, .hd = hd, .n_rot = n_rot,
                     .neox = neox, .dir = dir};
    li_train_par(tp, TR(par_job), &c, TR(par_row_jobs)(N), c.op);
}

/* h(N, ff) = silu(g) · u; with dh: dg, du */
void TR(li_trop_swiglu_par)(void *tp, const real *g, const real *u, real *h, const real *dh, real *dg,
                            real *du, int64_t N, int64_t ff) {
    TR(par_ctx) c = {.op = dh ? TR_PAR_GLU_BWD : TR_PAR_GLU, .g = g, .u = u, .v = h, .dy = dh, .dg = dg, .du = du,
                     .N = N, .d = ff};
    li_train_par(tp, TR(par_job), &c, TR(par_row_jobs)(N), c.op);
}

/* x(N, dim) through li_trop_hadamard, rows on the pool */
void TR(li_trop_hadamard_par)(void *tp, real *x, const float *s, int64_t N, int64_t dim, int64_t block, int dir) {
    TR(par_ctx) c = {.op = TR_PAR_HAD, .v = x, .sgn = s, .N = N, .d = dim, .block = block, .dir = dir};
    li_train_par(tp, TR(par_job), &c, TR(par_row_jobs)(N), c.op);
}

/* x(N, d) through li_trop_act_quant (act: its li_act_quant), rows on the pool */
void TR(li_trop_act_quant_par)(void *tp, real *x, int64_t N, int64_t d, int act) {
    if (act == LI_ACT_F32) return;
    TR(par_ctx) c = {.op = TR_PAR_ACTQ, .v = x, .N = N, .d = d, .dir = act};
    li_train_par(tp, TR(par_job), &c, TR(par_row_jobs)(N), c.op);
}

/* ==== loss ================================================================ */

/* Over the rows with lab >= 0 (count c): loss = Σ [α·T²·KL(pt ‖ ps) +
 * (1 − α)·CE(softmax(s), lab)] / c, pt = softmax(t/T), ps = softmax(s/T);
 * dlogits(N, V) = gscale · ∂loss/∂s (zero on ignored rows). teacher
 * may be NULL (then α = 0). *kl gets the mean KL(pt ‖ ps) (no α, no T²). */
double TR(li_trop_loss)(const real *logits, const int32_t *lab, const float *teacher, real *dlogits, int64_t N,
                        int64_t V, real alpha, real temp, real gscale, double *kl) {
    int64_t cnt = 0;
    for (int64_t i = 0; i < N; i++) cnt += lab[i] >= 0;
    if (!teacher) alpha = 0;
    double total = 0, kl_sum = 0;
    const real invc = cnt ? (real)1 / (real)cnt : 0;
    for (int64_t i = 0; i < N; i++) {
        const real *s = logits + i * V;
        real *ds = dlogits + i * V;
        if (lab[i] < 0) {
            for (int64_t j = 0; j < V; j++) ds[j] = 0;
            continue;
        }
        /* cross-entropy: softmax(s) − onehot */
        real mx = -INFINITY;
        for (int64_t j = 0; j < V; j++) mx = s[j] > mx ? s[j] : mx;
        double sum = 0;
        for (int64_t j = 0; j < V; j++) sum += TR_EXP(s[j] - mx);
        const double lse = (double)mx + log(sum);
        const real wce = ((real)1 - alpha) * invc * gscale;
        total += ((real)1 - alpha) * (lse - (double)s[lab[i]]);
        for (int64_t j = 0; j < V; j++) ds[j] = wce * (real)exp((double)s[j] - lse);
        ds[lab[i]] -= wce;
        if (alpha == 0) continue;
        /* KL at temperature: ∂/∂s of α·T²·KL = α·T·(ps − pt) */
        const float *t = teacher + i * V;
        real ms = -INFINITY, mt = -INFINITY;
        for (int64_t j = 0; j < V; j++) {
            ms = s[j] / temp > ms ? s[j] / temp : ms;
            mt = (real)t[j] / temp > mt ? (real)t[j] / temp : mt;
        }
        double zs = 0, zt = 0;
        for (int64_t j = 0; j < V; j++) {
            zs += TR_EXP(s[j] / temp - ms);
            zt += TR_EXP((real)t[j] / temp - mt);
        }
        const double lzs = (double)ms + log(zs), lzt = (double)mt + log(zt);
        double kli = 0;
        const real wkl = alpha * temp * invc * gscale;
        for (int64_t j = 0; j < V; j++) {
            const double lpt = (double)((real)t[j] / temp) - lzt, lps = (double)(s[j] / temp) - lzs;
            const double pt = exp(lpt), ps = exp(lps);
            kli += pt * (lpt - lps);
            ds[j] += wkl * (real)(ps - pt);
        }
        kl_sum += kli;
        total += (double)alpha * temp * temp * kli;
    }
    if (kl) *kl = cnt ? kl_sum / (double)cnt : 0;
    return cnt ? total / (double)cnt : 0;
}

/* li_trop_loss over rows on the thread pool: one job per row (the row's
 * own loss with gscale/c), the rows' losses added in row order after, so
 * the bits do not depend on the thread count. */
typedef struct TR(loss_ctx) {
    const real *logits;
    const int32_t *lab;
    const float *teacher;
    real *dlogits;
    int64_t V;
    real alpha, temp, gs;
    double *row; /* (N, 2): loss, KL */
} TR(loss_ctx);

static void TR(loss_job)(void *ctx, int64_t i) {
    const TR(loss_ctx) *c = ctx;
    c->row[2 * i] = TR(li_trop_loss)(c->logits + i * c->V, c->lab + i, c->teacher ? c->teacher + i * c->V : NULL,
                                     c->dlogits + i * c->V, 1, c->V, c->alpha, c->temp, c->gs, &c->row[2 * i + 1]);
}

static double TR(loss_par)(void *tp, const real *logits, const int32_t *lab, const float *teacher, real *dlogits,
                           int64_t N, int64_t V, real alpha, real temp, real gscale, double *kl) {
    int64_t cnt = 0;
    for (int64_t i = 0; i < N; i++) cnt += lab[i] >= 0;
    TR(loss_ctx) c = {.logits = logits, .lab = lab, .teacher = teacher, .dlogits = dlogits, .V = V,
                      .alpha = alpha, .temp = temp, .gs = cnt ? gscale / (real)cnt : 0,
                      .row = li_xcalloc((size_t)LI_MAX(N, 1) * 2, sizeof(double))};
    li_train_par(tp, TR(loss_job), &c, N, 0);
    double total = 0, kl_sum = 0;
    for (int64_t i = 0; i < N; i++) total += c.row[2 * i], kl_sum += c.row[2 * i + 1];
    free(c.row);
    if (kl) *kl = cnt ? kl_sum / (double)cnt : 0;
    return cnt ? total / (double)cnt : 0;
}

/* ==== linear layers (with an optional LoRA adapter) ====================== */

/* y(N, m) = x(N, k) · W^T [+ scale · (x·A^T)·B^T]; xa(N, r) keeps
 * scale · x·A^T for the backward pass; ltmp (N, m) is scratch */
static void TR(lin_fwd)(const li_train_layout *L, const real *P, int ti, const real *x, real *y, real *xa,
                        real *ltmp, int64_t N, void *tp) {
    const li_train_tensor *t = &L->t[ti];
    TR_MM_NT(tp, x, P + t->off, y, N, t->rows, t->cols);
    if (t->lora_a < 0) return;
    const li_train_tensor *A = &L->t[t->lora_a], *Bt = &L->t[t->lora_b];
    const int64_t r = A->rows;
    TR_MM_NT(tp, x, P + A->off, xa, N, r, t->cols);
    for (int64_t i = 0; i < N * r; i++) xa[i] *= (real)L->lora_scale;
    TR_MM_NT(tp, xa, P + Bt->off, ltmp, N, t->rows, r);
    for (int64_t i = 0; i < N * t->rows; i++) y[i] += ltmp[i];
}

/* dx(N, k) += dy·W [+ scale·(dy·B)·A]; dW += dy^T·x (when W trains);
 * adapters: dB += scale·dy^T·xa', dA += scale·(dy·B)^T·x. tmp: N·r reals. */
static void TR(lin_bwd)(const li_train_layout *L, const real *P, real *G, int ti, const real *x, const real *xa,
                        const real *dy, real *dx, real *tmp, int64_t N, void *tp) {
    const li_train_tensor *t = &L->t[ti];
    const int64_t m = t->rows, k = t->cols;
    if (dx) TR_MM_ACC(tp, dy, m, 1, P + t->off, dx, N, m, k);
    if (t->goff >= 0) TR_MM_ACC(tp, dy, 1, m, x, G + t->goff, m, N, k);
    if (t->lora_a < 0) return;
    const li_train_tensor *A = &L->t[t->lora_a], *Bt = &L->t[t->lora_b];
    const int64_t r = A->rows;
    /* xa holds scale·x·A^T: dB(m, r) += dy^T · xa */
    TR_MM_ACC(tp, dy, 1, m, xa, G + Bt->goff, m, N, r);
    /* tmp(N, r) = scale · dy · B */
    memset(tmp, 0, (size_t)(N * r) * sizeof(real));
    TR_MM_ACC(tp, dy, m, 1, P + Bt->off, tmp, N, m, r);
    for (int64_t i = 0; i < N * r; i++) tmp[i] *= (real)L->lora_scale;
    /* dA(r, k) += tmp^T · x;  dx += tmp · A */
    TR_MM_ACC(tp, tmp, 1, r, x, G + A->goff, r, N, k);
    if (dx) TR_MM_ACC(tp, tmp, r, 1, P + A->off, dx, N, r, k);
}

/* ==== the model ============================================================ */

/* The workspace carved into activations (sizes in reals). */
typedef struct TR(acts) {
    real *res;     /* (n_layer + 1, N, d) residual stream entering each block, then the last */
    real *xmid;    /* (n_layer, N, d) after attention's residual add */
    real *xn1, *xn2; /* (n_layer, N, d) normed inputs of attention and FFN */
    real *rstd1, *rstd2; /* (n_layer, N) */
    real *q;       /* (n_layer, N, H·hd) after RoPE */
    real *k, *v;   /* (n_layer, N, Hkv·hd), k after RoPE */
    real *P;       /* (n_layer, B, H, T, T) attention probabilities */
    real *att;     /* (n_layer, N, H·hd) attention output, before wo */
    real *g, *u, *h; /* (n_layer, N, ff) gate, up, silu(g)·u */
    real *xa;      /* (n_layer, 7, N, r) LoRA x·A^T per adapted weight (r = 0: none) */
    real *xnf, *rstdf; /* (N, d), (N) */
    real *logits;  /* (N, V) */
    real *cs;      /* (T, n_rot/2, 2) rope table */
    /* backward scratch */
    real *dlogits; /* (N, V) */
    real *dx, *dxn; /* (N, d) */
    real *dq, *datt; /* (N, H·hd) */
    real *dk, *dv; /* (N, Hkv·hd) */
    real *dg, *du, *dh; /* (N, ff) */
    real *dS;      /* (B, H, T, T) attention's dS, one block at a time */
    real *tmp;     /* (max(T, N·r)) */
    real *ltmp;    /* (N, max(H·hd, Hkv·hd, ff, d)) LoRA's product before its add */
} TR(acts);

/* Carves buf (NULL: only counts) and returns the reals it needs. */
static size_t TR(acts_carve)(TR(acts) *a, real *buf, const li_train_layout *L, int B, int T) {
    const li_hparams *hp = &L->hp;
    const size_t N = (size_t)B * T, d = hp->n_embd, nl = hp->n_layer, qd = (size_t)hp->n_head * hp->head_dim,
                 kvd = (size_t)hp->n_head_kv * hp->head_dim, ff = hp->n_ff, V = hp->n_vocab,
                 r = (size_t)L->lora_rank;
    size_t off = 0;
#define CARVE(field, count)                          \
    do {                                             \
        a->field = buf ? buf + off : NULL;           \
        off += ((size_t)(count) + 15) & ~(size_t)15; \
    } while (0)
    CARVE(res, (nl + 1) * N * d);
    CARVE(xmid, nl * N * d);
    CARVE(xn1, nl * N * d);
    CARVE(xn2, nl * N * d);
    CARVE(rstd1, nl * N);
    CARVE(rstd2, nl * N);
    CARVE(q, nl * N * qd);
    CARVE(k, nl * N * kvd);
    CARVE(v, nl * N * kvd);
    CARVE(P, nl * (size_t)B * hp->n_head * T * T);
    CARVE(att, nl * N * qd);
    CARVE(g, nl * N * ff);
    CARVE(u, nl * N * ff);
    CARVE(h, nl * N * ff);
    CARVE(xa, nl * 7 * N * r);
    CARVE(xnf, N * d);
    CARVE(rstdf, N);
    CARVE(logits, N * V);
    CARVE(cs, (size_t)T * (hp->n_rot / 2) * 2);
    CARVE(dlogits, N * V);
    CARVE(dx, N * d);
    CARVE(dxn, N * d);
    CARVE(dq, N * qd);
    CARVE(datt, N * qd);
    CARVE(dk, N * kvd);
    CARVE(dv, N * kvd);
    CARVE(dg, N * ff);
    CARVE(du, N * ff);
    CARVE(dh, N * ff);
    CARVE(dS, (size_t)B * hp->n_head * T * T);
    CARVE(tmp, LI_MAX((size_t)T, N * r));
    CARVE(ltmp, r ? N * LI_MAX(LI_MAX(qd, ff), d) : 0);
#undef CARVE
    return off;
}

size_t TR(li_train_ws_reals)(const li_train_layout *L, int B, int T) {
    TR(acts) a;
    return TR(acts_carve)(&a, NULL, L, B, T);
}

/* Forward over the batch and, with G, backward. ws holds
 * li_train_ws_reals(L, B, T) reals. Returns the mean loss. */
double TR(li_train_fb)(const li_train_layout *L, const real *P, real *G, const int32_t *tok, const int32_t *lab,
                       const float *teacher, int B, int T, real alpha, real temp, real gscale, real *ws,
                       void *tp, double *kl_out, real **logits_out) {
    const li_hparams *hp = &L->hp;
    const int64_t N = (int64_t)B * T, d = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim,
                  kvd = (int64_t)hp->n_head_kv * hp->head_dim, ff = hp->n_ff, V = hp->n_vocab, r = L->lora_rank;
    const int nl = hp->n_layer, H = hp->n_head, Hkv = hp->n_head_kv, hd = hp->head_dim;
    TR(acts) a;
    TR(acts_carve)(&a, ws, L, B, T);
#define PT(l, kind) (P + L->t[li_train_tensor_index(l, kind)].off)
#define GT(l, kind) (L->t[li_train_tensor_index(l, kind)].goff >= 0 ? G + L->t[li_train_tensor_index(l, kind)].goff : NULL)
#define TRAINS(l, kind) (L->t[li_train_tensor_index(l, kind)].goff >= 0)
#define ACT(l, kind) (L->act ? (int)L->act[li_train_tensor_index(l, kind)] : LI_ACT_F32)
#define XA(l, j) (a.xa + ((int64_t)(l) * 7 + (j)) * N * r)
    TR(li_trop_rope_table)(a.cs, T, hp->n_rot, (real)hp->rope_theta);

    /* ---- forward ---- */
    TR(li_trop_embed_fwd)(PT(-1, LI_TT_TOK_EMBD), tok, a.res, N, d);
    for (int l = 0; l < nl; l++) {
        real *x = a.res + l * N * d, *xmid = a.xmid + l * N * d, *xn1 = a.xn1 + l * N * d,
             *xn2 = a.xn2 + l * N * d, *q = a.q + l * N * qd, *k = a.k + l * N * kvd, *v = a.v + l * N * kvd,
             *att = a.att + l * N * qd, *g = a.g + l * N * ff, *u = a.u + l * N * ff, *h = a.h + l * N * ff,
             *Pl = a.P + (int64_t)l * B * H * T * T, *xnext = a.res + (l + 1) * N * d;
        TR(li_trop_rmsnorm_fwd_par)(tp, x, PT(l, LI_TL_ATTN_NORM), xn1, a.rstd1 + l * N, N, d, (real)hp->norm_eps);
        TR(li_trop_act_quant_par)(tp, xn1, N, d, ACT(l, LI_TL_WQ));
        TR(lin_fwd)(L, P, li_train_tensor_index(l, LI_TL_WQ), xn1, q, XA(l, 0), a.ltmp, N, tp);
        TR(lin_fwd)(L, P, li_train_tensor_index(l, LI_TL_WK), xn1, k, XA(l, 1), a.ltmp, N, tp);
        TR(lin_fwd)(L, P, li_train_tensor_index(l, LI_TL_WV), xn1, v, XA(l, 2), a.ltmp, N, tp);
        TR(li_trop_rope_par)(tp, q, a.cs, N, T, H, hd, hp->n_rot, hp->rope_neox, 1);
        TR(li_trop_rope_par)(tp, k, a.cs, N, T, Hkv, hd, hp->n_rot, hp->rope_neox, 1);
        TR(li_trop_attn_fwd)(q, k, v, Pl, att, B, T, H, Hkv, hd, tp);
        TR(li_trop_act_quant_par)(tp, att, N, qd, ACT(l, LI_TL_WO));
        TR(lin_fwd)(L, P, li_train_tensor_index(l, LI_TL_WO), att, xmid, XA(l, 3), a.ltmp, N, tp);
        for (int64_t i = 0; i < N * d; i++) xmid[i] += x[i];
        TR(li_trop_rmsnorm_fwd_par)(tp, xmid, PT(l, LI_TL_FFN_NORM), xn2, a.rstd2 + l * N, N, d, (real)hp->norm_eps);
        TR(li_trop_act_quant_par)(tp, xn2, N, d, ACT(l, LI_TL_GATE));
        TR(lin_fwd)(L, P, li_train_tensor_index(l, LI_TL_GATE), xn2, g, XA(l, 4), a.ltmp, N, tp);
        TR(lin_fwd)(L, P, li_train_tensor_index(l, LI_TL_UP), xn2, u, XA(l, 5), a.ltmp, N, tp);
        TR(li_trop_swiglu_par)(tp, g, u, h, NULL, NULL, NULL, N, li_hp_n_ff(hp, l)); /* (N, block l's width) */
        if (L->rot_block) /* a rotated model: down_proj reads H·diag(s)·h */
            TR(li_trop_hadamard_par)(tp, h, L->down_had + (int64_t)l * ff, N, li_hp_n_ff(hp, l), L->rot_block, 1);
        TR(li_trop_act_quant_par)(tp, h, N, li_hp_n_ff(hp, l), ACT(l, LI_TL_DOWN));
        TR(lin_fwd)(L, P, li_train_tensor_index(l, LI_TL_DOWN), h, xnext, XA(l, 6), a.ltmp, N, tp);
        for (int64_t i = 0; i < N * d; i++) xnext[i] += xmid[i];
    }
    const real *xlast = a.res + nl * N * d;
    TR(li_trop_rmsnorm_fwd_par)(tp, xlast, PT(-1, LI_TT_OUTPUT_NORM), a.xnf, a.rstdf, N, d, (real)hp->norm_eps);
    TR_MM_NT(tp, a.xnf, PT(-1, LI_TT_OUTPUT), a.logits, N, V, d);
    if (logits_out) *logits_out = a.logits;
    const double loss = TR(loss_par)(tp, a.logits, lab, teacher, a.dlogits, N, V, alpha, temp, gscale, kl_out);
    if (!G) return loss;

    /* ---- backward ---- */
    memset(a.dxn, 0, (size_t)(N * d) * sizeof(real));
    TR(lin_bwd)(L, P, G, LI_TT_OUTPUT, a.xnf, NULL, a.dlogits, a.dxn, a.tmp, N, tp);
    memset(a.dx, 0, (size_t)(N * d) * sizeof(real));
    TR(li_trop_rmsnorm_bwd_par)(tp, xlast, PT(-1, LI_TT_OUTPUT_NORM), a.rstdf, a.dxn, a.dx, GT(-1, LI_TT_OUTPUT_NORM), N, d);
    for (int l = nl - 1; l >= L->bwd_stop; l--) {
        const real *x = a.res + l * N * d, *xmid = a.xmid + l * N * d, *xn1 = a.xn1 + l * N * d,
                   *xn2 = a.xn2 + l * N * d, *q = a.q + l * N * qd, *k = a.k + l * N * kvd,
                   *v = a.v + l * N * kvd, *att = a.att + l * N * qd, *g = a.g + l * N * ff,
                   *u = a.u + l * N * ff, *h = a.h + l * N * ff, *Pl = a.P + (int64_t)l * B * H * T * T;
        /* the gradient of the input stops at the lowest block that trains */
        const bool need_dx = l > L->bwd_stop || TRAINS(-1, LI_TT_TOK_EMBD);
        /* FFN: res[l+1] = xmid + h·Wd^T, so dx is also d(xmid) */
        const int64_t ffl = li_hp_n_ff(hp, l); /* g, u, h of block l are (N, ffl) in slots of N * ff */
        memset(a.dh, 0, (size_t)(N * ffl) * sizeof(real));
        TR(lin_bwd)(L, P, G, li_train_tensor_index(l, LI_TL_DOWN), h, XA(l, 6), a.dx, a.dh, a.tmp, N, tp);
        if (L->rot_block) TR(li_trop_hadamard_par)(tp, a.dh, L->down_had + (int64_t)l * ff, N, ffl, L->rot_block, -1);
        TR(li_trop_swiglu_par)(tp, g, u, NULL, a.dh, a.dg, a.du, N, ffl);
        memset(a.dxn, 0, (size_t)(N * d) * sizeof(real));
        TR(lin_bwd)(L, P, G, li_train_tensor_index(l, LI_TL_GATE), xn2, XA(l, 4), a.dg, a.dxn, a.tmp, N, tp);
        TR(lin_bwd)(L, P, G, li_train_tensor_index(l, LI_TL_UP), xn2, XA(l, 5), a.du, a.dxn, a.tmp, N, tp);
        TR(li_trop_rmsnorm_bwd_par)(tp, xmid, PT(l, LI_TL_FFN_NORM), a.rstd2 + l * N, a.dxn, a.dx, GT(l, LI_TL_FFN_NORM), N, d);
        /* attention: xmid = x + att·Wo^T */
        memset(a.datt, 0, (size_t)(N * qd) * sizeof(real));
        TR(lin_bwd)(L, P, G, li_train_tensor_index(l, LI_TL_WO), att, XA(l, 3), a.dx, a.datt, a.tmp, N, tp);
        memset(a.dk, 0, (size_t)(N * kvd) * sizeof(real));
        memset(a.dv, 0, (size_t)(N * kvd) * sizeof(real));
        TR(li_trop_attn_bwd)(q, k, v, Pl, a.datt, a.dq, a.dk, a.dv, a.dS, B, T, H, Hkv, hd, tp);
        TR(li_trop_rope_par)(tp, a.dq, a.cs, N, T, H, hd, hp->n_rot, hp->rope_neox, -1);
        TR(li_trop_rope_par)(tp, a.dk, a.cs, N, T, Hkv, hd, hp->n_rot, hp->rope_neox, -1);
        memset(a.dxn, 0, (size_t)(N * d) * sizeof(real));
        real *dxn = need_dx || TRAINS(l, LI_TL_ATTN_NORM) ? a.dxn : NULL;
        TR(lin_bwd)(L, P, G, li_train_tensor_index(l, LI_TL_WQ), xn1, XA(l, 0), a.dq, dxn, a.tmp, N, tp);
        TR(lin_bwd)(L, P, G, li_train_tensor_index(l, LI_TL_WK), xn1, XA(l, 1), a.dk, dxn, a.tmp, N, tp);
        TR(lin_bwd)(L, P, G, li_train_tensor_index(l, LI_TL_WV), xn1, XA(l, 2), a.dv, dxn, a.tmp, N, tp);
        if (dxn)
            TR(li_trop_rmsnorm_bwd_par)(tp, x, PT(l, LI_TL_ATTN_NORM), a.rstd1 + l * N, a.dxn, a.dx, GT(l, LI_TL_ATTN_NORM), N, d);
    }
    if (L->bwd_stop == 0 && TRAINS(-1, LI_TT_TOK_EMBD)) TR(li_trop_embed_bwd)(GT(-1, LI_TT_TOK_EMBD), tok, a.dx, N, d);
#undef PT
#undef GT
#undef XA
#undef TRAINS
#undef ACT
    return loss;
}
