/* test_train_grad.c — the backward pass of core/train/ against central
 * finite differences in double precision (train_f64.c), at odd sizes:
 *
 *   each op alone (embedding, RMSNorm, RoPE normal and neox with
 *   n_rot < head_dim, causal attention with GQA, SwiGLU, the loss with and
 *   without the teacher's KL term): loss = Σ out · R for a random R, every
 *   input's gradient against (f(x + h) − f(x − h)) / 2h;
 *   the whole model (2 blocks + head + loss, tied and untied, LoRA): every
 *   parameter, relative error ‖analytic − numeric‖∞ / ‖numeric‖∞ < 1e-6;
 *   the float path (SIMD kernels, the thread pool) against the double one.
 * The matmul kernels alone: test_train_mm.c. */
#include "test_util.h"
#include "train/train_internal.h"
#include "cpu/threadpool.h"

#include <string.h>

#define H_FD 1e-5
#define TOL 1e-6

static double rnd(void) { return (double)rng_f(); }
static void fill(double *x, int64_t n, double a) {
    for (int64_t i = 0; i < n; i++) x[i] = a * rnd();
}

/* max |a - n| / max |n| */
static double rel_err(const double *a, const double *n, int64_t cnt) {
    double e = 0, m = 0;
    for (int64_t i = 0; i < cnt; i++) {
        e = fmax(e, fabs(a[i] - n[i]));
        m = fmax(m, fabs(n[i]));
    }
    return m > 0 ? e / m : e;
}

/* ==== per-op checks ======================================================== */

/* The op under test: computes out from the inputs; the checker perturbs
 * each input element and differences Σ out·R. */
typedef struct opctx {
    int kind;
    int64_t N, d;
    int B, T, H, Hkv, hd, n_rot, neox;
    double *in[3];     /* inputs differentiated */
    int64_t in_n[3];
    int n_in;
    double *aux;       /* fixed inputs (norm weights, u, rope table, ...) */
    int32_t *ids;
    float *teacher;
    double *out, *R;
    int64_t out_n;
    double *scratch;
} opctx;

enum { OP_RMSNORM_X, OP_EMBED, OP_ROPE, OP_ATTN, OP_SWIGLU, OP_LOSS };

static double op_f(opctx *c) {
    switch (c->kind) {
    case OP_RMSNORM_X: li_trop_rmsnorm_fwd_f64(c->in[0], c->in[1], c->out, c->scratch, c->N, c->d, 1e-5); break;
    case OP_EMBED: li_trop_embed_fwd_f64(c->in[0], c->ids, c->out, c->N, c->d); break;
    case OP_ROPE:
        memcpy(c->out, c->in[0], (size_t)c->out_n * sizeof(double));
        li_trop_rope_f64(c->out, c->aux, c->N, c->T, c->H, c->hd, c->n_rot, c->neox, 1);
        break;
    case OP_ATTN:
        li_trop_attn_fwd_f64(c->in[0], c->in[1], c->in[2], c->scratch, c->out, c->B, c->T, c->H, c->Hkv, c->hd, NULL);
        break;
    case OP_SWIGLU: li_trop_swiglu_fwd_f64(c->in[0], c->in[1], c->out, c->N); break;
    case OP_LOSS:
        return li_trop_loss_f64(c->in[0], c->ids, c->teacher, c->scratch, c->N, c->d, 0.4, 2.0, 1.0, NULL);
    }
    double s = 0;
    for (int64_t i = 0; i < c->out_n; i++) s += c->out[i] * c->R[i];
    return s;
}

/* numeric gradient of op_f with respect to input j */
static void op_numeric(opctx *c, int j, double *g) {
    for (int64_t i = 0; i < c->in_n[j]; i++) {
        const double x0 = c->in[j][i];
        c->in[j][i] = x0 + H_FD;
        const double fp = op_f(c);
        c->in[j][i] = x0 - H_FD;
        const double fm = op_f(c);
        c->in[j][i] = x0;
        g[i] = (fp - fm) / (2 * H_FD);
    }
}

static void check_grad(const char *what, const double *analytic, const double *numeric, int64_t n) {
    const double e = rel_err(analytic, numeric, n);
    report(e < TOL, "%-44s rel err %.2e (%lld values)", what, e, (long long)n);
}

static void test_rmsnorm(void) {
    const int64_t N = 5, d = 7;
    double x[35], w[7], y[35], R[35], rstd[5], dx[35], dw[7], nx[35], nw[7];
    fill(x, N * d, 1.5);
    for (int i = 0; i < d; i++) w[i] = 1 + 0.3 * rnd();
    fill(R, N * d, 1);
    opctx c = {.kind = OP_RMSNORM_X, .N = N, .d = d, .in = {x, w}, .in_n = {N * d, d}, .n_in = 2, .out = y,
               .R = R, .out_n = N * d, .scratch = rstd};
    op_f(&c);
    memset(dx, 0, sizeof dx);
    memset(dw, 0, sizeof dw);
    li_trop_rmsnorm_bwd_f64(x, w, rstd, R, dx, dw, N, d);
    op_numeric(&c, 0, nx);
    op_numeric(&c, 1, nw);
    check_grad("rmsnorm dx (5 x 7)", dx, nx, N * d);
    check_grad("rmsnorm dw", dw, nw, d);
}

static void test_embed(void) {
    const int64_t V = 11, d = 7, N = 6;
    int32_t ids[6] = {3, 0, 3, 10, 5, 3}; /* repeats: the scatter must add */
    double E[77], x[42], R[42], dE[77], nE[77];
    fill(E, V * d, 1);
    fill(R, N * d, 1);
    opctx c = {.kind = OP_EMBED, .N = N, .d = d, .in = {E}, .in_n = {V * d}, .n_in = 1, .ids = ids, .out = x,
               .R = R, .out_n = N * d};
    memset(dE, 0, sizeof dE);
    li_trop_embed_bwd_f64(dE, ids, R, N, d);
    op_numeric(&c, 0, nE);
    check_grad("embedding scatter-add (ids repeat)", dE, nE, V * d);
}

static void test_rope(int neox) {
    const int T = 5, H = 3, hd = 6, n_rot = 4;
    const int64_t N = 2 * T, n = N * H * hd;
    double x[180], y[180], R[180], cs[5 * 2 * 2], dx[180], nx[180];
    li_trop_rope_table_f64(cs, T, n_rot, 10000.0);
    fill(x, n, 1);
    fill(R, n, 1);
    opctx c = {.kind = OP_ROPE, .N = N, .T = T, .H = H, .hd = hd, .n_rot = n_rot, .neox = neox, .in = {x},
               .in_n = {n}, .n_in = 1, .aux = cs, .out = y, .R = R, .out_n = n};
    memcpy(dx, R, sizeof dx);
    li_trop_rope_f64(dx, cs, N, T, H, hd, n_rot, neox, -1);
    op_numeric(&c, 0, nx);
    char what[64];
    snprintf(what, sizeof what, "rope %s (hd 6, n_rot 4, T 5, 2 seqs)", neox ? "neox" : "normal");
    check_grad(what, dx, nx, n);
}

static void test_attn(int H, int Hkv) {
    const int B = 2, T = 5, hd = 6;
    const int64_t nq = (int64_t)B * T * H * hd, nk = (int64_t)B * T * Hkv * hd;
    double *q = malloc(nq * sizeof(double)), *k = malloc(nk * sizeof(double)), *v = malloc(nk * sizeof(double));
    double *o = malloc(nq * sizeof(double)), *R = malloc(nq * sizeof(double));
    double *P = malloc((size_t)B * H * T * T * sizeof(double)), *dS = malloc((size_t)B * H * T * T * sizeof(double));
    double *dq = malloc(nq * sizeof(double)), *dk = calloc(nk, sizeof(double)), *dv = calloc(nk, sizeof(double));
    double *ng = malloc(nq * sizeof(double));
    fill(q, nq, 1.5);
    fill(k, nk, 1.5);
    fill(v, nk, 1);
    fill(R, nq, 1);
    opctx c = {.kind = OP_ATTN, .B = B, .T = T, .H = H, .Hkv = Hkv, .hd = hd, .in = {q, k, v},
               .in_n = {nq, nk, nk}, .n_in = 3, .out = o, .R = R, .out_n = nq, .scratch = P};
    op_f(&c);
    li_trop_attn_bwd_f64(q, k, v, P, R, dq, dk, dv, dS, B, T, H, Hkv, hd, NULL);
    char what[64];
    op_numeric(&c, 0, ng);
    snprintf(what, sizeof what, "attention dq (heads %d, kv heads %d, hd 6)", H, Hkv);
    check_grad(what, dq, ng, nq);
    op_numeric(&c, 1, ng);
    snprintf(what, sizeof what, "attention dk (heads %d, kv heads %d)", H, Hkv);
    check_grad(what, dk, ng, nk);
    op_numeric(&c, 2, ng);
    snprintf(what, sizeof what, "attention dv (heads %d, kv heads %d)", H, Hkv);
    check_grad(what, dv, ng, nk);
    free(q), free(k), free(v), free(o), free(R), free(P), free(dS), free(dq), free(dk), free(dv), free(ng);
}

/* the rotated model's Hadamard against its matrix H_b ⊗ I · diag(s),
 * H_b[i][j] = (-1)^popcount(i & j) / sqrt(b) built here, and its
 * transpose (dir -1) against that matrix's transpose */
static void test_hadamard(void) {
    enum { DIM = 24, BLK = 8, NR = 3 };
    float s[DIM];
    double x[NR * DIM], y[NR * DIM], want[NR * DIM];
    for (int j = 0; j < DIM; j++) s[j] = rng_u32() & 1 ? 1.0f : -1.0f;
    for (int dir = 1; dir >= -1; dir -= 2) {
        fill(x, NR * DIM, 1);
        memcpy(y, x, sizeof x);
        li_trop_hadamard_f64(y, s, NR, DIM, BLK, dir);
        for (int r = 0; r < NR; r++)
            for (int i = 0; i < DIM; i++) {
                double acc = 0;
                for (int j = (i / BLK) * BLK; j < (i / BLK + 1) * BLK; j++) {
                    const double h = (__builtin_popcount((unsigned)((i % BLK) & (j % BLK))) & 1 ? -1.0 : 1.0) / sqrt(BLK);
                    /* forward: y_i = sum_j H_ij s_j x_j; transpose: y_i = s_i sum_j H_ji x_j */
                    acc += dir > 0 ? h * s[j] * x[r * DIM + j] : s[i] * h * x[r * DIM + j];
                }
                want[r * DIM + i] = acc;
            }
        double e = 0;
        for (int i = 0; i < NR * DIM; i++) e = fmax(e, fabs(y[i] - want[i]));
        report(e < 1e-12, "hadamard %s (dim %d, blocks of %d) = the explicit matrix: max err %.1e",
               dir > 0 ? "forward" : "transpose", DIM, BLK, e);
    }
}

static void test_swiglu(void) {
    const int64_t n = 13;
    double g[13], u[13], h[13], R[13], dg[13], du[13], ng[13], nu[13];
    fill(g, n, 4);
    fill(u, n, 2);
    fill(R, n, 1);
    opctx c = {.kind = OP_SWIGLU, .N = n, .in = {g, u}, .in_n = {n, n}, .n_in = 2, .out = h, .R = R, .out_n = n};
    li_trop_swiglu_bwd_f64(g, u, R, dg, du, n);
    op_numeric(&c, 0, ng);
    op_numeric(&c, 1, nu);
    check_grad("swiglu dg", dg, ng, n);
    check_grad("swiglu du", du, nu, n);
}

static void test_loss(void) {
    const int64_t N = 5, V = 11;
    double s[55], ds[55], ns[55], scratch[55];
    float t[55];
    int32_t lab[5] = {3, -1, 10, 0, 3};
    fill(s, N * V, 3);
    for (int i = 0; i < N * V; i++) t[i] = 3 * rng_f();
    for (int with_teacher = 0; with_teacher < 2; with_teacher++) {
        opctx c = {.kind = OP_LOSS, .N = N, .d = V, .in = {s}, .in_n = {N * V}, .n_in = 1, .ids = lab,
                   .teacher = with_teacher ? t : NULL, .scratch = scratch};
        li_trop_loss_f64(s, lab, c.teacher, ds, N, V, 0.4, 2.0, 1.0, NULL);
        op_numeric(&c, 0, ns);
        check_grad(with_teacher ? "loss: 0.4·KL(T=2)·T² + 0.6·CE, one ignored label" : "loss: cross-entropy",
                   ds, ns, N * V);
    }
    /* the value itself: CE by hand; KL(p‖p) = 0 */
    double ce = 0;
    int cnt = 0;
    for (int i = 0; i < N; i++) {
        if (lab[i] < 0) continue;
        double mx = -1e300, z = 0;
        for (int j = 0; j < V; j++) mx = fmax(mx, s[i * V + j]);
        for (int j = 0; j < V; j++) z += exp(s[i * V + j] - mx);
        ce += mx + log(z) - s[i * V + lab[i]];
        cnt++;
    }
    ce /= cnt;
    const double got = li_trop_loss_f64(s, lab, NULL, ds, N, V, 0.4, 2.0, 1.0, NULL);
    report(fabs(got - ce) < 1e-12, "cross-entropy value %.12f (by hand %.12f)", got, ce);
    for (int i = 0; i < N * V; i++) t[i] = (float)s[i];
    double kl = 1;
    li_trop_loss_f64(s, lab, t, ds, N, V, 1.0, 2.0, 1.0, &kl);
    report(fabs(kl) < 1e-6, "KL of the student against itself %.2e", kl);
}

/* ==== the whole model ====================================================== */

static li_hparams tiny_hp(int neox) {
    li_hparams hp = {0};
    hp.n_vocab = 13;
    hp.n_embd = 7;
    hp.n_layer = 2;
    hp.n_head = 3;
    hp.n_head_kv = 1;
    hp.head_dim = 6;
    hp.n_ff = 11;
    hp.n_rot = 4;
    hp.rope_theta = 10000.0f;
    hp.norm_eps = 1e-5f;
    hp.rope_neox = neox;
    hp.n_ctx_train = 64;
    return hp;
}

typedef struct mcase {
    li_train_model tm;
    double *P, *ws;
    int32_t tok[10], lab[10];
    float teacher[10 * 13];
    int B, T;
} mcase;

static double model_loss(mcase *c, double *G) {
    return li_train_fb_f64(&c->tm.L, c->P, G, c->tok, c->lab, c->teacher, c->B, c->T, 0.5, 2.0, 1.0, c->ws, NULL,
                           NULL, NULL);
}

/* > 0: the models of mcase_init are rotated (an online Hadamard in blocks
 * of rot_block before down_proj, random signs; n_ff 12) */
static int rot_block;

static void mcase_init(mcase *c, int neox, bool tied, const char *sel_s) {
    li_hparams hp = tiny_hp(neox);
    if (rot_block) hp.n_ff = 12;
    li_train_select sel;
    li_error err = {0};
    CHECK(li_train_select_parse(sel_s, &sel, &err) == 0, "%s", err.msg);
    CHECK(li_train_model_init_random(&c->tm, &hp, tied, &sel, 7, &err) == 0, "%s", err.msg);
    if (rot_block) {
        c->tm.L.rot_block = rot_block;
        c->tm.L.down_had = malloc((size_t)(hp.n_layer * hp.n_ff) * sizeof(float));
        for (int64_t i = 0; i < (int64_t)hp.n_layer * hp.n_ff; i++) c->tm.L.down_had[i] = rng_u32() & 1 ? 1.0f : -1.0f;
    }
    c->B = 2;
    c->T = 5;
    c->P = malloc(c->tm.L.n_params * sizeof(double));
    for (size_t i = 0; i < c->tm.L.n_params; i++) c->P[i] = c->tm.params[i];
    /* LoRA's B starts at zero, which would hide dA: make it random here */
    for (int i = LI_TT_N_GLOBAL + LI_TL_N * hp.n_layer; i < c->tm.L.n_tensors; i++) {
        const li_train_tensor *t = &c->tm.L.t[i];
        for (int64_t j = 0; j < t->rows * t->cols; j++) c->P[t->off + j] = 0.3 * rnd();
    }
    c->ws = calloc(li_train_ws_reals_f64(&c->tm.L, c->B, c->T), sizeof(double));
    for (int i = 0; i < 10; i++) {
        c->tok[i] = (int32_t)(rng_u32() % 13);
        c->lab[i] = i == 4 ? -1 : (int32_t)(rng_u32() % 13);
    }
    for (int i = 0; i < 10 * 13; i++) c->teacher[i] = 2 * rng_f();
}

static void mcase_free(mcase *c) {
    free(c->P);
    free(c->ws);
    li_train_model_free(&c->tm);
}

/* every trainable parameter against central differences */
static void test_model(int neox, bool tied, const char *sel_s) {
    mcase c;
    mcase_init(&c, neox, tied, sel_s);
    const li_train_layout *L = &c.tm.L;
    double *G = calloc(L->n_grads, sizeof(double)), *NG = calloc(L->n_grads, sizeof(double));
    model_loss(&c, G);
    for (int i = 0; i < L->n_tensors; i++) {
        const li_train_tensor *t = &L->t[i];
        if (t->goff < 0 || (i == LI_TT_OUTPUT && tied)) continue;
        for (int64_t j = 0; j < t->rows * t->cols; j++) {
            double *p = &c.P[t->off + j];
            const double x0 = *p;
            *p = x0 + H_FD;
            const double fp = model_loss(&c, NULL);
            *p = x0 - H_FD;
            const double fm = model_loss(&c, NULL);
            *p = x0;
            NG[t->goff + j] = (fp - fm) / (2 * H_FD);
        }
    }
    double worst = 0;
    const char *worst_name = "-";
    for (int i = 0; i < L->n_tensors; i++) {
        const li_train_tensor *t = &L->t[i];
        if (t->goff < 0) continue;
        const double e = rel_err(G + t->goff, NG + t->goff, t->rows * t->cols);
        if (e > worst) worst = e, worst_name = t->name;
    }
    const double e = rel_err(G, NG, (int64_t)L->n_grads);
    report(e < TOL && worst < 1e-4, "model %s, %s rope, %s%s: %zu params, rel err %.2e (worst tensor %s %.2e)",
           sel_s, neox ? "neox" : "normal", tied ? "tied head" : "own head",
           rot_block ? ", rotated (Hadamard before down_proj)" : "", L->n_grads, e, worst_name, worst);
    free(G);
    free(NG);
    mcase_free(&c);
}

/* a subset's gradients are the full model's at the same tensors, and the
 * frozen tensors have no slots */
static void test_subset(const char *sel_s) {
    mcase all, sub;
    const uint64_t seed = rng_state;
    mcase_init(&all, 0, true, "all");
    rng_seed(seed);
    mcase_init(&sub, 0, true, sel_s);
    double *Ga = calloc(all.tm.L.n_grads, sizeof(double)), *Gs = calloc(sub.tm.L.n_grads + 1, sizeof(double));
    model_loss(&all, Ga);
    model_loss(&sub, Gs);
    double e = 0;
    size_t n_train = 0;
    for (int i = 0; i < sub.tm.L.n_tensors; i++) {
        const li_train_tensor *t = &sub.tm.L.t[i];
        if (t->goff < 0 || i == LI_TT_OUTPUT) continue;
        n_train += (size_t)(t->rows * t->cols);
        e = fmax(e, rel_err(Gs + t->goff, Ga + all.tm.L.t[i].goff, t->rows * t->cols));
    }
    report(e < 1e-12 && n_train == sub.tm.L.n_grads && sub.tm.L.n_grads < all.tm.L.n_grads,
           "subset %s: %zu of %zu gradient slots, the full model's values (err %.1e), backward stops at block %d",
           sel_s, sub.tm.L.n_grads, all.tm.L.n_grads, e, sub.tm.L.bwd_stop);
    free(Ga);
    free(Gs);
    mcase_free(&all);
    mcase_free(&sub);
}

/* the float path (SIMD kernels, thread pool) agrees with the double one */
static void test_float_path(void) {
    mcase c;
    mcase_init(&c, 1, false, "all");
    const li_train_layout *L = &c.tm.L;
    double *G = calloc(L->n_grads, sizeof(double));
    for (size_t i = 0; i < L->n_params; i++) c.tm.params[i] = (float)c.P[i];
    for (size_t i = 0; i < L->n_params; i++) c.P[i] = c.tm.params[i];
    const double ld = model_loss(&c, G);
    li_threadpool *tp = li_threadpool_init(2);
    li_train_grads g;
    li_train_ws ws;
    li_error err = {0};
    li_train_grads_init(&g, L);
    CHECK(li_train_ws_init(&ws, L, c.B, c.T, &err) == 0, "%s", err.msg);
    li_train_batch b = {.B = c.B, .T = c.T, .tokens = c.tok, .labels = c.lab, .teacher = c.teacher};
    li_train_loss_opts o = {.alpha = 0.5f, .temperature = 2.0f};
    double lf = 0;
    CHECK(li_train_forward_backward(&c.tm, &g, &b, &o, &ws, tp, &lf, NULL, &err) == 0, "%s", err.msg);
    float *gd = malloc(L->n_grads * sizeof(float));
    for (size_t i = 0; i < L->n_grads; i++) gd[i] = (float)G[i];
    const double e = nmse(g.g, gd, (int64_t)L->n_grads);
    report(e < 1e-9 && fabs(lf - ld) < 1e-5 * fabs(ld), "float path (2 threads): loss %.7f vs %.7f, grads nmse %.1e",
           lf, ld, e);
    /* the same bits on 1 and 3 threads: matmuls, attention and the loss
     * each write every element from one job, sums in a fixed order */
    float *g2 = malloc(L->n_grads * sizeof(float));
    memcpy(g2, g.g, L->n_grads * sizeof(float));
    li_threadpool *tp3 = li_threadpool_init(3);
    bool same = true;
    for (int run = 0; run < 2; run++) {
        double l1 = 0;
        li_train_grads_zero(&g);
        CHECK(li_train_forward_backward(&c.tm, &g, &b, &o, &ws, run ? tp3 : NULL, &l1, NULL, &err) == 0, "%s",
              err.msg);
        same = same && l1 == lf && !memcmp(g.g, g2, L->n_grads * sizeof(float));
    }
    report(same, "float path: loss and gradients bit-identical on 1, 2 and 3 threads");
    li_threadpool_free(tp3);
    free(g2);
    /* a bad token is refused */
    c.tok[3] = 13;
    report(li_train_forward_backward(&c.tm, &g, &b, &o, &ws, tp, &lf, NULL, &err) == LI_EINVAL,
           "token outside the vocabulary refused: %s", err.msg);
    free(gd);
    free(G);
    li_train_grads_free(&g);
    li_train_ws_free(&ws);
    li_threadpool_free(tp);
    mcase_free(&c);
}

int main(void) {
    rng_seed(12345);
    test_rmsnorm();
    test_embed();
    test_rope(0);
    test_rope(1);
    test_attn(3, 1);
    test_attn(3, 3);
    test_swiglu();
    test_loss();
    test_model(0, true, "all");
    test_model(1, false, "all");
    test_model(0, true, "lora:2");
    test_hadamard();
    rot_block = 4;
    test_model(1, false, "all");
    rot_block = 0;
    test_subset("norms");
    test_subset("layers:1-1");
    test_float_path();
    return t_summary("test_train_grad");
}
