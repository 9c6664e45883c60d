/* eagle_tmpl.h — the EAGLE draft's forward and backward passes over `real`
 * (docs/eagle.md), included by eagle_f32.c (training: matmuls on the thread
 * pool) and eagle_f64.c (the gradient checks of tests/unit/test_train_eagle.c),
 * as train_tmpl.h. No include guard: included once per type.
 *
 * The including file defines real, TR(name), TR_SQRT, TR_EXP, TR_MM_NT and
 * TR_MM_ACC (as train_tmpl.h). The other ops are train_tmpl.h's, through
 * their suffixed names (TR(li_trop_rmsnorm_fwd_par) ...).
 *
 * A window of L tokens and J steps: step 0 runs rows 0..n0-1 (n0 = L - J,
 * the rows a chain step's prefix can reach); step j >= 1 runs the R = n0 - 1
 * rows q = 1..n0-1 at positions q + j. Every step's loss counts those R rows
 * (q in [1, L - J)). */

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ==== prefix + chain attention ============================================= */

/* Jobs on the pool as train_tmpl.h's attention: the forward over (head,
 * block of rows); the backward's dq, dS and the chain's dk/dv over (kv
 * head, block of rows), the group's heads summed in order; the prefix's
 * dk/dv over (kv head, block of prefix keys), the rows summed in order.
 * Every output element has one job and one order: the same bits on any
 * number of threads. */
#define TE_ROWS 16

/* Σ a·b with eight partial sums (train_tmpl.h's dot) */
static inline real TR(edot)(const real *a, const real *b, int n) {
    real s[8] = {0};
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int u = 0; u < 8; u++) s[u] += a[j + u] * b[j + u];
    for (int u = 0; j < n; j++, u++) s[u] += a[j] * b[j];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

typedef struct TR(chain_ctx) {
    const real *q, *k0, *v0, *kc, *vc, *P, *dout;
    real *Pw, *out, *dq, *dk0, *dv0, *dkc, *dvc, *dS;
    int64_t cstride;
    int R, n0, p0, nc, W, H, Hkv, hd, nblk, nblk0;
} TR(chain_ctx);

/* key j of row r: the prefix's k0 row j (j < np), else chain key j - np */
static inline const real *TR(chain_key)(const real *k0, const real *kc, int64_t cstride, int r, int j, int np,
                                        int Hkv, int hk, int hd) {
    return j < np ? k0 + ((int64_t)j * Hkv + hk) * hd : kc + (j - np) * cstride + ((int64_t)r * Hkv + hk) * hd;
}

static void TR(chain_fwd_job)(void *ctx, int64_t job) {
    const TR(chain_ctx) *c = ctx;
    const int H = c->H, Hkv = c->Hkv, hd = c->hd, R = c->R, W = c->W;
    const int h = (int)(job / c->nblk), hk = h / (H / Hkv);
    const int r0 = (int)(job % c->nblk) * TE_ROWS, r1 = LI_MIN(R, r0 + TE_ROWS);
    const real scale = (real)1 / TR_SQRT((real)hd);
    for (int r = r0; r < r1; r++) {
        const int np = r + c->p0 + 1, nk = np + c->nc;
        const real *qr = c->q + ((int64_t)r * H + h) * hd;
        real *p = c->Pw + ((int64_t)h * R + r) * W;
        real mx = -INFINITY;
        for (int j = 0; j < nk; j++) {
            p[j] = TR(edot)(qr, TR(chain_key)(c->k0, c->kc, c->cstride, r, j, np, Hkv, hk, hd), hd) * scale;
            if (p[j] > mx) mx = p[j];
        }
        real sum = 0;
        for (int j = 0; j < nk; j++) sum += (p[j] = TR_EXP(p[j] - mx));
        const real inv = (real)1 / sum;
        for (int j = 0; j < nk; j++) p[j] *= inv;
        for (int j = nk; j < W; j++) p[j] = 0;
        real *o = c->out + ((int64_t)r * H + h) * hd;
        for (int i = 0; i < hd; i++) o[i] = 0;
        for (int j = 0; j < nk; j++) {
            const real *vj = TR(chain_key)(c->v0, c->vc, c->cstride, r, j, np, Hkv, hk, hd);
            for (int i = 0; i < hd; i++) o[i] += p[j] * vj[i];
        }
    }
}

void TR(li_trop_chain_attn_fwd)(const real *q, const real *k0, const real *v0, const real *kc, const real *vc,
                                int64_t cstride, real *P, real *out, int R, int n0, int p0, int nc, int W, int H,
                                int Hkv, int hd, void *tp) {
    (void)n0;
    TR(chain_ctx) c = {.q = q, .k0 = k0, .v0 = v0, .kc = kc, .vc = vc, .cstride = cstride, .Pw = P, .out = out,
                       .R = R, .p0 = p0, .nc = nc, .W = W, .H = H, .Hkv = Hkv, .hd = hd,
                       .nblk = (R + TE_ROWS - 1) / TE_ROWS};
    li_train_par(tp, TR(chain_fwd_job), &c, (int64_t)H * c.nblk, 0);
}

/* rows r of kv head hk, each head of its group in order: dP = dout·v^T,
 * dS = P ⊙ (dP − Σ dP⊙P)·scale kept, dq = dS·k (written); the row's own
 * chain keys: dkc += dS·q, dvc += P·dout */
static void TR(chain_dq_job)(void *ctx, int64_t job) {
    const TR(chain_ctx) *c = ctx;
    const int H = c->H, Hkv = c->Hkv, hd = c->hd, R = c->R, W = c->W, grp = H / Hkv;
    const int hk = (int)(job / c->nblk);
    const int r0 = (int)(job % c->nblk) * TE_ROWS, r1 = LI_MIN(R, r0 + TE_ROWS);
    const real scale = (real)1 / TR_SQRT((real)hd);
    for (int r = r0; r < r1; r++)
        for (int h = hk * grp; h < (hk + 1) * grp; h++) {
            const int np = r + c->p0 + 1, nk = np + c->nc;
            const real *p = c->P + ((int64_t)h * R + r) * W;
            real *ds = c->dS + ((int64_t)h * R + r) * W;
            const real *dor = c->dout + ((int64_t)r * H + h) * hd, *qr = c->q + ((int64_t)r * H + h) * hd;
            real *dqr = c->dq + ((int64_t)r * H + h) * hd;
            real rsum = 0;
            for (int j = 0; j < nk; j++) {
                ds[j] = TR(edot)(dor, TR(chain_key)(c->v0, c->vc, c->cstride, r, j, np, Hkv, hk, hd), hd);
                rsum += ds[j] * p[j];
            }
            for (int i = 0; i < hd; i++) dqr[i] = 0;
            for (int j = 0; j < nk; j++) {
                ds[j] = p[j] * (ds[j] - rsum) * scale;
                const real *kj = TR(chain_key)(c->k0, c->kc, c->cstride, r, j, np, Hkv, hk, hd);
                for (int i = 0; i < hd; i++) dqr[i] += ds[j] * kj[i];
            }
            for (int j = np; j < nk; j++) {
                const int64_t o = (j - np) * c->cstride + ((int64_t)r * Hkv + hk) * hd;
                for (int i = 0; i < hd; i++) {
                    c->dkc[o + i] += ds[j] * qr[i];
                    c->dvc[o + i] += p[j] * dor[i];
                }
            }
        }
}

/* prefix keys s of kv head hk: dk0 += Σ_h Σ_{r: s <= r + p0} dS·q, dv0 += Σ P·dout */
static void TR(chain_dkv_job)(void *ctx, int64_t job) {
    const TR(chain_ctx) *c = ctx;
    const int H = c->H, Hkv = c->Hkv, hd = c->hd, R = c->R, W = c->W, grp = H / Hkv;
    const int hk = (int)(job / c->nblk0);
    const int s0 = (int)(job % c->nblk0) * TE_ROWS, s1 = LI_MIN(c->n0, s0 + TE_ROWS);
    for (int s = s0; s < s1; s++) {
        real *dks = c->dk0 + ((int64_t)s * Hkv + hk) * hd, *dvs = c->dv0 + ((int64_t)s * Hkv + hk) * hd;
        for (int h = hk * grp; h < (hk + 1) * grp; h++)
            for (int r = LI_MAX(0, s - c->p0); r < R; r++) {
                const int64_t pi = ((int64_t)h * R + r) * W + s;
                const real ds = c->dS[pi], pp = c->P[pi];
                const real *qr = c->q + ((int64_t)r * H + h) * hd, *dor = c->dout + ((int64_t)r * H + h) * hd;
                for (int i = 0; i < hd; i++) {
                    dks[i] += ds * qr[i];
                    dvs[i] += pp * dor[i];
                }
            }
    }
}

void TR(li_trop_chain_attn_bwd)(const real *q, const real *k0, const real *v0, const real *kc, const real *vc,
                                int64_t cstride, const real *P, const real *dout, real *dq, real *dk0, real *dv0,
                                real *dkc, real *dvc, real *dS, int R, int n0, int p0, int nc, int W, int H, int Hkv,
                                int hd, void *tp) {
    TR(chain_ctx) c = {.q = q, .k0 = k0, .v0 = v0, .kc = kc, .vc = vc, .P = P, .dout = dout, .dq = dq, .dk0 = dk0,
                       .dv0 = dv0, .dkc = dkc, .dvc = dvc, .dS = dS, .cstride = cstride, .R = R, .n0 = n0, .p0 = p0,
                       .nc = nc, .W = W, .H = H, .Hkv = Hkv, .hd = hd, .nblk = (R + TE_ROWS - 1) / TE_ROWS,
                       .nblk0 = (n0 + TE_ROWS - 1) / TE_ROWS};
    li_train_par(tp, TR(chain_dq_job), &c, (int64_t)Hkv * c.nblk, 1);
    li_train_par(tp, TR(chain_dkv_job), &c, (int64_t)Hkv * c.nblk0, 2);
}

/* ==== the loss ============================================================== */

/* The base's side of the loss, once per position p (a position's row is
 * read by up to J steps): pt = softmax(t/T) over V, log of its partition
 * lzt, and its argmax (the lowest index of ties). */
typedef struct TR(tprep_ctx) {
    const float *t;     /* (L, V) */
    real *pt, *lzt;     /* (L, V), (L) */
    int32_t *at;        /* (L) */
    int64_t V;
    real temp;
} TR(tprep_ctx);

static void TR(tprep_job)(void *ctx, int64_t p) {
    const TR(tprep_ctx) *c = ctx;
    const float *t = c->t + p * c->V;
    real *pt = c->pt + p * c->V;
    int64_t at = 0;
    for (int64_t j = 1; j < c->V; j++)
        if (t[j] > t[at]) at = j;
    const real mt = (real)t[at] / c->temp;
    double z = 0;
    for (int64_t j = 0; j < c->V; j++) z += TR_EXP((real)t[j] / c->temp - mt);
    const real lz = (real)((double)mt + log(z));
    for (int64_t j = 0; j < c->V; j++) pt[j] = TR_EXP((real)t[j] / c->temp - lz);
    c->lzt[p] = lz;
    c->at[p] = (int32_t)at;
}

/* Row s (V) of a step against the base's row t (V, over the draft's
 * vocabulary; pt, lzt, at: its tprep) and label lab (an index in V, or -1:
 * outside V, no CE term):
 *   α·T²·KL(softmax(t/T) ‖ softmax(s/T)) + (1 − α)·CE(s, lab).
 * ds (may be s itself, or NULL) = w·∂/∂s: α·T·(ps − pt) + (1 − α)·(softmax(s) −
 * onehot). Returns the loss; *kl the KL (no α, no T²); *amax the argmax of s
 * (the lowest index of ties), *agree whether it is t's. Sums in double, as
 * li_trop_loss. */
static double TR(eagle_loss_row)(const real *s, const float *t, const real *pt, real lzt, int32_t at, int32_t lab,
                                 int64_t V, real alpha, real temp, real w, real *ds, double *kl, int32_t *amax,
                                 int *agree) {
    int64_t as = 0;
    for (int64_t j = 1; j < V; j++)
        if (s[j] > s[as]) as = j;
    *amax = (int32_t)as;
    *agree = as == at;
    const bool ce = alpha < 1 && lab >= 0, t1 = temp == 1; /* T = 1: softmax(s/T) is CE's softmax */
    const real ms = s[as], mst = s[as] / temp;
    double ze = 0, zs = 0;
    for (int64_t j = 0; j < V; j++) {
        zs += TR_EXP(s[j] / temp - mst);
        if (ce && !t1) ze += TR_EXP(s[j] - ms);
    }
    const double lzs = (double)mst + log(zs), lse = ce && !t1 ? (double)ms + log(ze) : lzs;
    const double slab = ce ? (double)s[lab] : 0; /* read before ds overwrites s */
    const real wkl = w * alpha * temp, wce = w * ((real)1 - alpha), lzs_r = (real)lzs, lse_r = (real)lse;
    double k = 0;
    for (int64_t j = 0; j < V; j++) {
        const real lps = s[j] / temp - lzs_r, lpt = (real)t[j] / temp - lzt;
        k += (double)pt[j] * (double)(lpt - lps);
        if (!ds) continue;
        const real ps = TR_EXP(lps);
        real gj = wkl * (ps - pt[j]);
        if (ce) gj += wce * (t1 ? ps : TR_EXP(s[j] - lse_r));
        ds[j] = gj;
    }
    double loss = (double)alpha * temp * temp * k;
    if (ce) {
        loss += (1 - (double)alpha) * (lse - slab);
        if (ds) ds[lab] -= wce;
    }
    *kl = k;
    return loss;
}

typedef struct TR(eloss_ctx) {
    real *logits;       /* (R, V), dlogits in place when grad */
    const float *teacher; /* row r at teacher + r·V */
    const real *pt, *lzt; /* the teacher rows' tprep, row r at pt + r·V, lzt[r] */
    const int32_t *at;
    const int32_t *lab; /* (R) */
    int64_t V;
    real alpha, temp, w;
    int grad;
    double *loss, *kl;  /* (R) */
    int32_t *amax;      /* (R) */
    int *agree;         /* (R) */
} TR(eloss_ctx);

static void TR(eloss_job)(void *ctx, int64_t r) {
    const TR(eloss_ctx) *c = ctx;
    real *s = c->logits + r * c->V;
    c->loss[r] = TR(eagle_loss_row)(s, c->teacher + r * c->V, c->pt + r * c->V, c->lzt[r], c->at[r], c->lab[r], c->V,
                                    c->alpha, c->temp, c->w, c->grad ? s : NULL, &c->kl[r], &c->amax[r],
                                    &c->agree[r]);
}

/* ==== the draft's passes =================================================== */

/* The workspace carved into activations (sizes in reals). Per-step arrays
 * hold J blocks of n0 rows (a chain step uses the first R). */
typedef struct TR(eacts) {
    real *cs;        /* (L, n_rot/2, 2) the rope table */
    real *en;        /* (L, d) rmsnorm(E[x_p]; enorm) */
    real *rstd_e;    /* (L) */
    real *hid0;      /* (n0, d) step 0's hid: W_fc·g_{q-1}, row 0 zero */
    real *hn;        /* (n0, d) the normed hid of the step being computed */
    real *z;         /* (J, n0, 2d) [en, hn] */
    real *rstd_h;    /* (J, n0) */
    real *q;         /* (J, n0, H·hd) after RoPE */
    real *k, *v;     /* (J, n0, Hkv·hd), k after RoPE; the chain's keys: blocks 1..J-1 */
    real *att;       /* (J, n0, H·hd) attention's output, before W_o */
    real *xa;        /* (J, n0, d) hid + W_o·att */
    real *nf;        /* (J, n0, d) rmsnorm(xa; ffn_norm) */
    real *rstd_f;    /* (J, n0) */
    real *g, *u, *h; /* (J, n0, ff) gate, up, silu(g)·u */
    real *xo;        /* (J, n0, d) the step's x' */
    real *yo;        /* (J, n0, d) rmsnorm(x'; output_norm) */
    real *rstd_o;    /* (J, n0) */
    real *P0;        /* (H, n0, n0) step 0's attention */
    real *Pc;        /* (J - 1, H, R, W) the chain steps' */
    real *logits;    /* (R, Vd) one step's logits, then its dlogits in place */
    real *pt;        /* (L, Vd) softmax(t/T) of the base's rows over V */
    real *lzt;       /* (L) their log-partitions */
    real *dy;        /* (J, R, d) d(yo) of the loss rows */
    /* backward scratch */
    real *dx;        /* (n0, d) */
    real *dnext;     /* (n0, d) d(hid) of the step above: d(x') here */
    real *dhn;       /* (n0, d) */
    real *dnf;       /* (n0, d) */
    real *dh, *dg, *du; /* (n0, ff) */
    real *datt, *dq; /* (n0, H·hd) */
    real *dk, *dv;   /* (J, n0, Hkv·hd) summed over the steps that read them */
    real *dz;        /* (n0, 2d) */
    real *den;       /* (L, d) d(en), summed over steps by position */
    real *dS;        /* (max(H·n0·n0, H·R·W)) */
} TR(eacts);

static size_t TR(eacts_carve)(TR(eacts) *a, real *buf, const li_train_eagle_dims *D) {
    const size_t L = (size_t)D->L, J = (size_t)D->J, n0 = L - J, R = n0 - 1, W = n0 + J - 1, d = (size_t)D->d,
                 qd = (size_t)D->H * D->hd, kvd = (size_t)D->Hkv * D->hd, ff = (size_t)D->ff, H = (size_t)D->H;
    size_t off = 0;
#define CARVE(field, count)                          \
    do {                                             \
        a->field = buf ? buf + off : NULL;           \
        off += ((size_t)(count) + 15) & ~(size_t)15; \
    } while (0)
    CARVE(cs, L * (size_t)(D->n_rot / 2) * 2);
    CARVE(en, L * d);
    CARVE(rstd_e, L);
    CARVE(hid0, n0 * d);
    CARVE(hn, n0 * d);
    CARVE(z, J * n0 * 2 * d);
    CARVE(rstd_h, J * n0);
    CARVE(q, J * n0 * qd);
    CARVE(k, J * n0 * kvd);
    CARVE(v, J * n0 * kvd);
    CARVE(att, J * n0 * qd);
    CARVE(xa, J * n0 * d);
    CARVE(nf, J * n0 * d);
    CARVE(rstd_f, J * n0);
    CARVE(g, J * n0 * ff);
    CARVE(u, J * n0 * ff);
    CARVE(h, J * n0 * ff);
    CARVE(xo, J * n0 * d);
    CARVE(yo, J * n0 * d);
    CARVE(rstd_o, J * n0);
    CARVE(P0, H * n0 * n0);
    CARVE(Pc, (J - 1) * H * R * W);
    CARVE(logits, R * (size_t)D->Vd);
    CARVE(pt, L * (size_t)D->Vd);
    CARVE(lzt, L);
    CARVE(dy, J * R * d);
    CARVE(dx, n0 * d);
    CARVE(dnext, n0 * d);
    CARVE(dhn, n0 * d);
    CARVE(dnf, n0 * d);
    CARVE(dh, n0 * ff);
    CARVE(dg, n0 * ff);
    CARVE(du, n0 * ff);
    CARVE(datt, n0 * qd);
    CARVE(dq, n0 * qd);
    CARVE(dk, J * n0 * kvd);
    CARVE(dv, J * n0 * kvd);
    CARVE(dz, n0 * 2 * d);
    CARVE(den, L * d);
    CARVE(dS, LI_MAX(H * n0 * n0, H * R * W));
#undef CARVE
    return off;
}

size_t TR(li_train_eagle_ws_reals)(const li_train_eagle_dims *D) {
    TR(eacts) a;
    return TR(eacts_carve)(&a, NULL, D);
}

/* Forward over the window's J steps and, with G, backward (see eagle.h).
 * Returns the window's loss Σ_j 0.8^j loss_j. */
double TR(li_train_eagle_fb)(const li_train_eagle_dims *D, const size_t *off, const real *P, real *G,
                             const real *emb, const real *feat, const float *teacher, const int32_t *labv,
                             const real *EV, real alpha, real temp, real gscale, real *ws, void *tp,
                             li_train_eagle_stats *st, int32_t *argmax) {
    const int L = D->L, J = D->J, n0 = L - J, R = n0 - 1, W = n0 + J - 1, H = D->H, Hkv = D->Hkv, hd = D->hd,
              n_rot = D->n_rot, neox = D->neox;
    const int64_t d = D->d, d2 = 2 * d, qd = (int64_t)H * hd, kvd = (int64_t)Hkv * hd, ff = D->ff, Vd = D->Vd,
                  Fd = (int64_t)D->F * d;
    const real eps = (real)D->eps;
    TR(eacts) a;
    TR(eacts_carve)(&a, ws, D);
#define PW(t) (P + off[t])
#define GW(t) (G + off[t])
#define STEP(arr, s, width) (a.arr + (int64_t)(s) * n0 * (width))
    TR(li_trop_rope_table)(a.cs, L, n_rot, (real)D->theta);
    TR(li_trop_rmsnorm_fwd_par)(tp, emb, PW(LI_EAGLE_ENORM), a.en, a.rstd_e, L, d, eps);
    memset(st, 0, sizeof *st);
    st->J = J;
    st->rows = R;
    double *rloss = li_xcalloc((size_t)R, sizeof(double)), *rkl = li_xcalloc((size_t)R, sizeof(double));
    int32_t *ramax = li_xcalloc((size_t)R, sizeof(int32_t)), *rlab = li_xcalloc((size_t)R, sizeof(int32_t)),
            *tat = li_xcalloc((size_t)L, sizeof(int32_t));
    int *ragree = li_xcalloc((size_t)R, sizeof(int));

    /* the base's rows over V, softmax(t/T) once per position (rows 1..L-2 are read) */
    TR(tprep_ctx) tc = {.t = teacher, .pt = a.pt, .lzt = a.lzt, .at = tat, .V = Vd, .temp = temp};
    li_train_par(tp, TR(tprep_job), &tc, L, 4);

    /* ---- forward, step by step ---- */
    for (int s = 0; s < J; s++) {
        const int ns = s ? R : n0, pos0 = s ? 1 + s : 0, lo = s ? 0 : 1; /* lo: the first loss row */
        const real *hid = s == 0 ? a.hid0 : s == 1 ? a.xo + d : STEP(xo, s - 1, d);
        if (s == 0) { /* hid_q = W_fc·g_{q-1}, g_{-1} = 0 */
            memset(a.hid0, 0, (size_t)d * sizeof(real));
            TR_MM_NT(tp, feat, PW(LI_EAGLE_FC), a.hid0 + d, n0 - 1, d, Fd);
        }
        real *z = STEP(z, s, d2), *q = STEP(q, s, qd), *k = STEP(k, s, kvd), *v = STEP(v, s, kvd),
             *att = STEP(att, s, qd), *xa = STEP(xa, s, d), *nf = STEP(nf, s, d), *g = STEP(g, s, ff),
             *u = STEP(u, s, ff), *h = STEP(h, s, ff), *xo = STEP(xo, s, d), *yo = STEP(yo, s, d);
        real *rstd_h = a.rstd_h + (int64_t)s * n0, *rstd_f = a.rstd_f + (int64_t)s * n0,
             *rstd_o = a.rstd_o + (int64_t)s * n0;
        const real *cs = a.cs + (int64_t)pos0 * (n_rot / 2) * 2;
        /* z = [rmsnorm(E[x_p]; enorm), rmsnorm(hid; hnorm)] at the rows' positions p */
        TR(li_trop_rmsnorm_fwd_par)(tp, hid, PW(LI_EAGLE_HNORM), a.hn, rstd_h, ns, d, eps);
        for (int r = 0; r < ns; r++) {
            memcpy(z + r * d2, a.en + (int64_t)(pos0 + r) * d, (size_t)d * sizeof(real));
            memcpy(z + r * d2 + d, a.hn + (int64_t)r * d, (size_t)d * sizeof(real));
        }
        TR_MM_NT(tp, z, PW(LI_EAGLE_WQ), q, ns, qd, d2);
        TR_MM_NT(tp, z, PW(LI_EAGLE_WK), k, ns, kvd, d2);
        TR_MM_NT(tp, z, PW(LI_EAGLE_WV), v, ns, kvd, d2);
        TR(li_trop_rope_par)(tp, q, cs, ns, L, H, hd, n_rot, neox, 1);
        TR(li_trop_rope_par)(tp, k, cs, ns, L, Hkv, hd, n_rot, neox, 1);
        if (s == 0) TR(li_trop_attn_fwd)(q, k, v, a.P0, att, 1, n0, H, Hkv, hd, tp);
        else
            TR(li_trop_chain_attn_fwd)(q, a.k, a.v, STEP(k, 1, kvd), STEP(v, 1, kvd), (int64_t)n0 * kvd,
                                       a.Pc + (int64_t)(s - 1) * H * R * W, att, R, n0, 1, s, W, H, Hkv, hd, tp);
        TR_MM_NT(tp, att, PW(LI_EAGLE_WO), xa, ns, d, qd);
        for (int64_t i = 0; i < ns * d; i++) xa[i] += hid[i];
        TR(li_trop_rmsnorm_fwd_par)(tp, xa, PW(LI_EAGLE_FFN_NORM), nf, rstd_f, ns, d, eps);
        TR_MM_NT(tp, nf, PW(LI_EAGLE_GATE), g, ns, ff, d);
        TR_MM_NT(tp, nf, PW(LI_EAGLE_UP), u, ns, ff, d);
        TR(li_trop_swiglu_par)(tp, g, u, h, NULL, NULL, NULL, ns, ff);
        TR_MM_NT(tp, h, PW(LI_EAGLE_DOWN), xo, ns, d, ff);
        for (int64_t i = 0; i < ns * d; i++) xo[i] += xa[i];
        /* the head over the loss rows: row lo + r is q = r + 1 at position r + 1 + s */
        TR(li_trop_rmsnorm_fwd_par)(tp, xo + lo * d, PW(LI_EAGLE_OUTPUT_NORM), yo + lo * d, rstd_o + lo, R, d, eps);
        TR_MM_NT(tp, yo + lo * d, EV, a.logits, R, Vd, d);
        for (int r = 0; r < R; r++) rlab[r] = labv[r + 2 + s];
        const double wstep = pow(LI_TRAIN_EAGLE_DECAY, s);
        TR(eloss_ctx) lc = {.logits = a.logits, .teacher = teacher + (int64_t)(1 + s) * Vd,
                            .pt = a.pt + (int64_t)(1 + s) * Vd, .lzt = a.lzt + 1 + s, .at = tat + 1 + s, .lab = rlab,
                            .V = Vd,
                            .alpha = alpha, .temp = temp, .w = (real)(gscale * wstep / R), .grad = G != NULL,
                            .loss = rloss, .kl = rkl, .amax = ramax, .agree = ragree};
        li_train_par(tp, TR(eloss_job), &lc, R, 3);
        double ls = 0, ks = 0;
        int64_t ag = 0;
        for (int r = 0; r < R; r++) ls += rloss[r], ks += rkl[r], ag += ragree[r];
        st->loss_j[s] = ls / R;
        st->kl_j[s] = ks / R;
        st->agree_j[s] = ag;
        st->loss += wstep * st->loss_j[s];
        if (argmax) memcpy(argmax + (int64_t)s * R, ramax, (size_t)R * sizeof(int32_t));
        if (G) { /* d(yo) now: the logits' buffer serves the next step */
            real *dy = a.dy + (int64_t)s * R * d;
            memset(dy, 0, (size_t)(R * d) * sizeof(real));
            TR_MM_ACC(tp, a.logits, Vd, 1, EV, dy, R, Vd, d);
        }
    }
    free(rloss);
    free(rkl);
    free(ramax);
    free(rlab);
    free(ragree);
    free(tat);
    if (!G) return st->loss;

    /* ---- backward, the last step first: a step's keys and x' are read by the steps above it ---- */
    memset(a.dk, 0, (size_t)(J * n0 * kvd) * sizeof(real));
    memset(a.dv, 0, (size_t)(J * n0 * kvd) * sizeof(real));
    memset(a.den, 0, (size_t)(L * d) * sizeof(real));
    for (int s = J - 1; s >= 0; s--) {
        const int ns = s ? R : n0, pos0 = s ? 1 + s : 0, lo = s ? 0 : 1;
        const real *hid = s == 0 ? a.hid0 : s == 1 ? a.xo + d : STEP(xo, s - 1, d);
        const real *z = STEP(z, s, d2), *q = STEP(q, s, qd), *att = STEP(att, s, qd), *xa = STEP(xa, s, d),
                   *nf = STEP(nf, s, d), *g = STEP(g, s, ff), *u = STEP(u, s, ff), *h = STEP(h, s, ff),
                   *xo = STEP(xo, s, d);
        const real *rstd_h = a.rstd_h + (int64_t)s * n0, *rstd_f = a.rstd_f + (int64_t)s * n0,
                   *rstd_o = a.rstd_o + (int64_t)s * n0;
        real *dk = STEP(dk, s, kvd), *dv = STEP(dv, s, kvd);
        const real *cs = a.cs + (int64_t)pos0 * (n_rot / 2) * 2;
        /* d(x'): the head's, and the step above's d(hid) */
        memset(a.dx, 0, (size_t)(ns * d) * sizeof(real));
        TR(li_trop_rmsnorm_bwd_par)(tp, xo + lo * d, PW(LI_EAGLE_OUTPUT_NORM), rstd_o + lo, a.dy + (int64_t)s * R * d,
                                    a.dx + lo * d, GW(LI_EAGLE_OUTPUT_NORM), R, d);
        if (s < J - 1)
            for (int64_t i = 0; i < R * d; i++) a.dx[lo * d + i] += a.dnext[i];
        /* FFN: x' = xa + W_down·(silu(W_gate nf) ⊙ W_up nf) */
        memset(a.dh, 0, (size_t)(ns * ff) * sizeof(real));
        TR_MM_ACC(tp, a.dx, d, 1, PW(LI_EAGLE_DOWN), a.dh, ns, d, ff);
        TR_MM_ACC(tp, a.dx, 1, d, h, GW(LI_EAGLE_DOWN), d, ns, ff);
        TR(li_trop_swiglu_par)(tp, g, u, NULL, a.dh, a.dg, a.du, ns, ff);
        memset(a.dnf, 0, (size_t)(ns * d) * sizeof(real));
        TR_MM_ACC(tp, a.dg, ff, 1, PW(LI_EAGLE_GATE), a.dnf, ns, ff, d);
        TR_MM_ACC(tp, a.du, ff, 1, PW(LI_EAGLE_UP), a.dnf, ns, ff, d);
        TR_MM_ACC(tp, a.dg, 1, ff, nf, GW(LI_EAGLE_GATE), ff, ns, d);
        TR_MM_ACC(tp, a.du, 1, ff, nf, GW(LI_EAGLE_UP), ff, ns, d);
        TR(li_trop_rmsnorm_bwd_par)(tp, xa, PW(LI_EAGLE_FFN_NORM), rstd_f, a.dnf, a.dx, GW(LI_EAGLE_FFN_NORM), ns, d);
        /* attention: xa = hid + W_o·att; a.dx is now d(xa), and d(hid) through the residual */
        memset(a.datt, 0, (size_t)(ns * qd) * sizeof(real));
        TR_MM_ACC(tp, a.dx, d, 1, PW(LI_EAGLE_WO), a.datt, ns, d, qd);
        TR_MM_ACC(tp, a.dx, 1, d, att, GW(LI_EAGLE_WO), d, ns, qd);
        if (s == 0) TR(li_trop_attn_bwd)(q, a.k, a.v, a.P0, a.datt, a.dq, a.dk, a.dv, a.dS, 1, n0, H, Hkv, hd, tp);
        else
            TR(li_trop_chain_attn_bwd)(q, a.k, a.v, STEP(k, 1, kvd), STEP(v, 1, kvd), (int64_t)n0 * kvd,
                                       a.Pc + (int64_t)(s - 1) * H * R * W, a.datt, a.dq, a.dk, a.dv,
                                       STEP(dk, 1, kvd), STEP(dv, 1, kvd), a.dS, R, n0, 1, s, W, H, Hkv, hd, tp);
        /* this step's keys have all their readers now (itself and the steps above) */
        TR(li_trop_rope_par)(tp, a.dq, cs, ns, L, H, hd, n_rot, neox, -1);
        TR(li_trop_rope_par)(tp, dk, cs, ns, L, Hkv, hd, n_rot, neox, -1);
        memset(a.dz, 0, (size_t)(ns * d2) * sizeof(real));
        TR_MM_ACC(tp, a.dq, qd, 1, PW(LI_EAGLE_WQ), a.dz, ns, qd, d2);
        TR_MM_ACC(tp, dk, kvd, 1, PW(LI_EAGLE_WK), a.dz, ns, kvd, d2);
        TR_MM_ACC(tp, dv, kvd, 1, PW(LI_EAGLE_WV), a.dz, ns, kvd, d2);
        TR_MM_ACC(tp, a.dq, 1, qd, z, GW(LI_EAGLE_WQ), qd, ns, d2);
        TR_MM_ACC(tp, dk, 1, kvd, z, GW(LI_EAGLE_WK), kvd, ns, d2);
        TR_MM_ACC(tp, dv, 1, kvd, z, GW(LI_EAGLE_WV), kvd, ns, d2);
        /* z's halves: the embedding's (frozen: only enorm learns, summed by position below), hid's */
        for (int r = 0; r < ns; r++) {
            real *de = a.den + (int64_t)(pos0 + r) * d;
            const real *dzr = a.dz + r * d2;
            for (int64_t i = 0; i < d; i++) de[i] += dzr[i];
            memcpy(a.dhn + r * d, dzr + d, (size_t)d * sizeof(real));
        }
        TR(li_trop_rmsnorm_bwd_par)(tp, hid, PW(LI_EAGLE_HNORM), rstd_h, a.dhn, a.dx, GW(LI_EAGLE_HNORM), ns, d);
        /* a.dx = d(hid): the step below's x' (rows q = 1..n0-1), or W_fc's input */
        if (s > 0) memcpy(a.dnext, a.dx, (size_t)(R * d) * sizeof(real));
        else TR_MM_ACC(tp, a.dx + d, 1, d, feat, GW(LI_EAGLE_FC), d, n0 - 1, Fd);
    }
    /* enorm: dw += Σ_p d(en)·E[x_p]·rstd (E frozen: no dx) */
    real *gw = GW(LI_EAGLE_ENORM);
    for (int p = 0; p < L; p++) {
        const real *de = a.den + (int64_t)p * d, *x = emb + (int64_t)p * d;
        const real r = a.rstd_e[p];
        for (int64_t i = 0; i < d; i++) gw[i] += de[i] * x[i] * r;
    }
#undef PW
#undef GW
#undef STEP
    return st->loss;
}
