/* test_train_eagle.c — the EAGLE draft trainer (core/train/eagle.h):
 *
 *   the prefix + chain attention alone: its forward against a plain
 *   reference that lists each row's keys explicitly, every input's gradient
 *   against central differences in double, at odd sizes (GQA, a padded
 *   chain stride);
 *   the whole draft in double (eagle_f64.c) at odd sizes (L 7, d 12, 3 heads
 *   over 1 kv head, head_dim 4, n_ff 10, F 2, |V| 11 of 17, J 3): the loss
 *   against a plain transcription of docs/eagle.md (every J that fits),
 *   every gradient of the 12 tensors against central differences, with and
 *   without the CE term, both RoPE pairings;
 *   the float path (SIMD kernels, two threads) against the double one, and
 *   the same bits on one and two threads;
 *   the draft vocabulary (frequencies, ties to the lower id, the fill);
 *   on a tiny random GGUF: the base's window (and its head over V alone),
 *   AdamW lowering the loss over 30 steps, a NaN weight stopping the step,
 *   the file read back through li_eagle_file_check (F32 bit for bit,
 *   F16), and refused for another base or a corrupted key. */
#define _POSIX_C_SOURCE 200809L
#include "test_util.h"
#include "tiny_model.h"
#include "train/eagle.h"
#include "train/train_internal.h"
#include "engine/session.h"
#include "runtime/runtime.h"
#include "tokenizer/tokenizer.h"
#include "cpu/threadpool.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define H_FD 1e-5
#define TOL 1e-6

static char dir[256];

/* max |a - n| / max |n| */
static double rel_err(const double *a, const double *n, int64_t cnt) {
    double e = 0, m = 0;
    for (int64_t i = 0; i < cnt; i++) {
        e = fmax(e, fabs(a[i] - n[i]));
        m = fmax(m, fabs(n[i]));
    }
    return m > 0 ? e / m : e;
}

static void fill(double *x, int64_t n, double a) {
    for (int64_t i = 0; i < n; i++) x[i] = a * rng_f();
}

/* ==== the prefix + chain attention ========================================= */

enum { CR = 5, CN0 = 7, CP0 = 2, CNC = 3, CW = 11, CH = 4, CHKV = 2, CHD = 3 };
#define CSTRIDE (CR * CHKV * CHD + 6) /* chain blocks apart by more than their rows */

typedef struct chain_in {
    double q[CR * CH * CHD], k0[CN0 * CHKV * CHD], v0[CN0 * CHKV * CHD], kc[CNC * CSTRIDE], vc[CNC * CSTRIDE];
    double P[CH * CR * CW], out[CR * CH * CHD], R[CR * CH * CHD];
} chain_in;

static double chain_f(chain_in *c) {
    li_trop_chain_attn_fwd_f64(c->q, c->k0, c->v0, c->kc, c->vc, CSTRIDE, c->P, c->out, CR, CN0, CP0, CNC, CW, CH,
                               CHKV, CHD, NULL);
    double s = 0;
    for (int i = 0; i < CR * CH * CHD; i++) s += c->out[i] * c->R[i];
    return s;
}

static void test_chain_attn(void) {
    static chain_in c;
    rng_seed(3);
    fill(c.q, LI_ARRAY_LEN(c.q), 1.5);
    fill(c.k0, LI_ARRAY_LEN(c.k0), 1.5);
    fill(c.v0, LI_ARRAY_LEN(c.v0), 1);
    fill(c.kc, LI_ARRAY_LEN(c.kc), 1.5);
    fill(c.vc, LI_ARRAY_LEN(c.vc), 1);
    fill(c.R, LI_ARRAY_LEN(c.R), 1);
    chain_f(&c);
    /* the reference: row r's keys listed one by one, a plain softmax over them */
    double e = 0;
    for (int r = 0; r < CR; r++)
        for (int h = 0; h < CH; h++) {
            const int hk = h / (CH / CHKV), np = r + CP0 + 1;
            const double *keys[CN0 + CNC], *vals[CN0 + CNC];
            int n = 0;
            for (int j = 0; j < np; j++, n++) {
                keys[n] = c.k0 + (j * CHKV + hk) * CHD;
                vals[n] = c.v0 + (j * CHKV + hk) * CHD;
            }
            for (int i = 0; i < CNC; i++, n++) {
                keys[n] = c.kc + i * CSTRIDE + (r * CHKV + hk) * CHD;
                vals[n] = c.vc + i * CSTRIDE + (r * CHKV + hk) * CHD;
            }
            double sc[CN0 + CNC], mx = -1e300, z = 0;
            for (int j = 0; j < n; j++) {
                sc[j] = 0;
                for (int i = 0; i < CHD; i++) sc[j] += c.q[(r * CH + h) * CHD + i] * keys[j][i];
                sc[j] /= sqrt((double)CHD);
                mx = fmax(mx, sc[j]);
            }
            for (int j = 0; j < n; j++) z += (sc[j] = exp(sc[j] - mx));
            for (int i = 0; i < CHD; i++) {
                double o = 0;
                for (int j = 0; j < n; j++) o += sc[j] / z * vals[j][i];
                e = fmax(e, fabs(o - c.out[(r * CH + h) * CHD + i]));
            }
        }
    report(e < 1e-14, "prefix + chain attention = a softmax over each row's listed keys (R 5, prefix r+3 of 7, "
                      "3 chain keys, 4 heads over 2, hd 3): max diff %.1e",
           e);

    /* the backward against central differences, every input */
    static double dq[LI_ARRAY_LEN(c.q)], dk0[LI_ARRAY_LEN(c.k0)], dv0[LI_ARRAY_LEN(c.v0)], dkc[LI_ARRAY_LEN(c.kc)],
        dvc[LI_ARRAY_LEN(c.vc)], dS[CH * CR * CW], num[CNC * CSTRIDE + CN0 * CHKV * CHD + CR * CH * CHD];
    li_trop_chain_attn_bwd_f64(c.q, c.k0, c.v0, c.kc, c.vc, CSTRIDE, c.P, c.R, dq, dk0, dv0, dkc, dvc, dS, CR, CN0,
                               CP0, CNC, CW, CH, CHKV, CHD, NULL);
    struct {
        const char *what;
        double *x, *g;
        int64_t n;
    } in[] = {{"q", c.q, dq, LI_ARRAY_LEN(c.q)},        {"prefix k", c.k0, dk0, LI_ARRAY_LEN(c.k0)},
              {"prefix v", c.v0, dv0, LI_ARRAY_LEN(c.v0)}, {"chain k", c.kc, dkc, LI_ARRAY_LEN(c.kc)},
              {"chain v", c.vc, dvc, LI_ARRAY_LEN(c.vc)}};
    for (size_t t = 0; t < LI_ARRAY_LEN(in); t++) {
        for (int64_t i = 0; i < in[t].n; i++) {
            const double x0 = in[t].x[i];
            in[t].x[i] = x0 + H_FD;
            const double fp = chain_f(&c);
            in[t].x[i] = x0 - H_FD;
            const double fm = chain_f(&c);
            in[t].x[i] = x0;
            num[i] = (fp - fm) / (2 * H_FD);
        }
        const double r = rel_err(in[t].g, num, in[t].n);
        report(r < TOL, "prefix + chain attention: d(%s) vs central differences, rel err %.1e (%lld values)",
               in[t].what, r, (long long)in[t].n);
    }
}

/* ==== the whole draft in double ============================================= */

/* the small shape of the gradient checks */
static li_hparams small_hp(int neox, int n_rot) {
    li_hparams hp = {0};
    snprintf(hp.arch, sizeof hp.arch, "llama");
    hp.n_vocab = 17;
    hp.n_embd = 12;
    hp.n_layer = 5;
    hp.n_head = 3;
    hp.n_head_kv = 1;
    hp.head_dim = 4;
    hp.n_ff = 10;
    hp.n_rot = n_rot;
    hp.rope_theta = 100.0f;
    hp.norm_eps = 1e-5f;
    hp.rope_neox = neox;
    return hp;
}

/* One window's inputs in double, and the draft's parameters. */
typedef struct dwin {
    li_train_eagle_dims D;
    size_t off[LI_EAGLE_N_TENSORS];
    size_t np;
    double *P, *emb, *feat, *EV;
    float *teacher;
    int32_t tok[32], labv[32];
} dwin;

/* ---- a plain transcription of docs/eagle.md, one row at a time ---- */

static void p_rms(const double *x, const double *w, double *y, int64_t d, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < d; i++) ss += x[i] * x[i];
    const double r = 1 / sqrt(ss / (double)d + eps);
    for (int64_t i = 0; i < d; i++) y[i] = x[i] * r * w[i];
}

static void p_matvec(const double *W, const double *x, double *y, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows; i++) {
        y[i] = 0;
        for (int64_t j = 0; j < cols; j++) y[i] += W[i * cols + j] * x[j];
    }
}

static void p_rope(double *x, int nh, const li_train_eagle_dims *D, int pos) {
    const int half = D->n_rot / 2;
    for (int h = 0; h < nh; h++)
        for (int i = 0; i < half; i++) {
            const double a = pos * pow(D->theta, -2.0 * i / D->n_rot), co = cos(a), si = sin(a);
            double *v = x + h * D->hd;
            const int i0 = D->neox ? i : 2 * i, i1 = D->neox ? i + half : 2 * i + 1;
            const double x0 = v[i0], x1 = v[i1];
            v[i0] = x0 * co - x1 * si;
            v[i1] = x0 * si + x1 * co;
        }
}

/* The block at position pos for token embedding e and hidden input hid,
 * attending to nprev earlier keys and its own: x' and its own k, v. */
static void p_block(const dwin *w, const double *e, const double *hid, int pos, const double **pk, const double **pv,
                    int nprev, double *x, double *k, double *v) {
    const li_train_eagle_dims *D = &w->D;
    const int64_t d = D->d, qd = (int64_t)D->H * D->hd, ff = D->ff;
    const double *P = w->P;
    double z[64], q[64], att[64], xa[32], n[32], g[32], u[32], hh[32];
    p_rms(e, P + w->off[LI_EAGLE_ENORM], z, d, D->eps);
    p_rms(hid, P + w->off[LI_EAGLE_HNORM], z + d, d, D->eps);
    p_matvec(P + w->off[LI_EAGLE_WQ], z, q, qd, 2 * d);
    p_matvec(P + w->off[LI_EAGLE_WK], z, k, (int64_t)D->Hkv * D->hd, 2 * d);
    p_matvec(P + w->off[LI_EAGLE_WV], z, v, (int64_t)D->Hkv * D->hd, 2 * d);
    p_rope(q, D->H, D, pos);
    p_rope(k, D->Hkv, D, pos);
    for (int h = 0; h < D->H; h++) {
        const int hk = h / (D->H / D->Hkv);
        double sc[32], mx = -1e300, zs = 0;
        for (int j = 0; j <= nprev; j++) {
            const double *kj = (j < nprev ? pk[j] : k) + hk * D->hd;
            sc[j] = 0;
            for (int i = 0; i < D->hd; i++) sc[j] += q[h * D->hd + i] * kj[i];
            sc[j] /= sqrt((double)D->hd);
            mx = fmax(mx, sc[j]);
        }
        for (int j = 0; j <= nprev; j++) zs += (sc[j] = exp(sc[j] - mx));
        for (int i = 0; i < D->hd; i++) {
            att[h * D->hd + i] = 0;
            for (int j = 0; j <= nprev; j++) att[h * D->hd + i] += sc[j] / zs * (j < nprev ? pv[j] : v)[hk * D->hd + i];
        }
    }
    p_matvec(P + w->off[LI_EAGLE_WO], att, xa, d, qd);
    for (int64_t i = 0; i < d; i++) xa[i] += hid[i];
    p_rms(xa, P + w->off[LI_EAGLE_FFN_NORM], n, d, D->eps);
    p_matvec(P + w->off[LI_EAGLE_GATE], n, g, ff, d);
    p_matvec(P + w->off[LI_EAGLE_UP], n, u, ff, d);
    for (int64_t i = 0; i < ff; i++) hh[i] = g[i] / (1 + exp(-g[i])) * u[i];
    p_matvec(P + w->off[LI_EAGLE_DOWN], hh, x, d, ff);
    for (int64_t i = 0; i < d; i++) x[i] += xa[i];
}

/* the seed's loss of the draft's x' against base row p and label lab */
static double p_loss(const dwin *w, const double *x, int p, int32_t lab, double alpha, double T) {
    const li_train_eagle_dims *D = &w->D;
    double y[32], s[32], ms = -1e300, mt = -1e300, ze = 0, zs = 0, zt = 0, kl = 0;
    p_rms(x, w->P + w->off[LI_EAGLE_OUTPUT_NORM], y, D->d, D->eps);
    p_matvec(w->EV, y, s, D->Vd, D->d);
    const float *t = w->teacher + (int64_t)p * D->Vd;
    for (int64_t i = 0; i < D->Vd; i++) ms = fmax(ms, s[i]), mt = fmax(mt, t[i]);
    for (int64_t i = 0; i < D->Vd; i++) {
        ze += exp(s[i] - ms);
        zs += exp((s[i] - ms) / T);
        zt += exp((t[i] - mt) / T);
    }
    for (int64_t i = 0; i < D->Vd; i++) {
        const double lpt = (t[i] - mt) / T - log(zt), lps = (s[i] - ms) / T - log(zs);
        kl += exp(lpt) * (lpt - lps);
    }
    return alpha * T * T * kl + (lab >= 0 ? (1 - alpha) * (ms + log(ze) - s[lab]) : 0);
}

static double plain_loss(const dwin *w, double alpha, double T, double *loss_j) {
    const li_train_eagle_dims *D = &w->D;
    const int L = D->L, J = D->J, n0 = L - J;
    const int64_t d = D->d, kvd = (int64_t)D->Hkv * D->hd;
    double *K = calloc((size_t)(J * n0 * kvd), sizeof *K), *Vv = calloc((size_t)(J * n0 * kvd), sizeof *Vv),
           *X = calloc((size_t)(J * n0 * d), sizeof *X), hid[32];
    const double *pk[32], *pv[32];
    double total = 0;
    for (int j = 0; j < J; j++) {
        double sum = 0;
        for (int q = j ? 1 : 0; q < n0; q++) {
            int n = 0; /* step 0's keys at positions 0..q (< q for step 0 itself), then this row's chain */
            for (int p = 0; p < (j ? q + 1 : q); p++, n++) pk[n] = K + p * kvd, pv[n] = Vv + p * kvd;
            for (int i = 1; i < j; i++, n++) pk[n] = K + (i * n0 + q) * kvd, pv[n] = Vv + (i * n0 + q) * kvd;
            if (j) memcpy(hid, X + ((j - 1) * n0 + q) * d, (size_t)d * sizeof *hid);
            else if (q) p_matvec(w->P + w->off[LI_EAGLE_FC], w->feat + (q - 1) * D->F * d, hid, d, D->F * d);
            else memset(hid, 0, sizeof hid);
            double *x = X + (j * n0 + q) * d;
            p_block(w, w->emb + (q + j) * d, hid, q + j, pk, pv, n, x, K + (j * n0 + q) * kvd,
                    Vv + (j * n0 + q) * kvd);
            if (q >= 1) sum += p_loss(w, x, q + j, w->labv[q + j + 1], alpha, T);
        }
        loss_j[j] = sum / (n0 - 1);
        total += pow(0.8, j) * loss_j[j];
    }
    free(K);
    free(Vv);
    free(X);
    return total;
}

/* A draft of small_hp and a random window of L tokens, J steps, in double. */
static void dwin_init(dwin *w, li_train_eagle *e, int neox, int n_rot, int L, int J) {
    li_error err = {0};
    const li_hparams hp = small_hp(neox, n_rot);
    const int32_t feat[2] = {1, 3}, vocab[11] = {0, 2, 3, 5, 7, 8, 9, 11, 12, 14, 16};
    CHECK(li_train_eagle_init(e, &hp, 2, feat, vocab, 11, NULL, 7, &err) == 0, "%s", err.msg);
    memset(w, 0, sizeof *w);
    w->D = (li_train_eagle_dims){.d = hp.n_embd, .ff = hp.n_ff, .Vd = e->n_draft, .F = 2, .H = hp.n_head,
                                 .Hkv = hp.n_head_kv, .hd = hp.head_dim, .n_rot = hp.n_rot, .neox = hp.rope_neox,
                                 .theta = hp.rope_theta, .eps = hp.norm_eps, .L = L, .J = J};
    w->np = e->tm.L.n_params;
    for (int i = 0; i < LI_EAGLE_N_TENSORS; i++) w->off[i] = e->tm.L.t[i].off;
    const int64_t d = hp.n_embd;
    w->P = calloc(w->np, sizeof *w->P);
    /* weights far from the start's N(0, 0.02), norms away from 1: every term matters */
    for (int i = 0; i < LI_EAGLE_N_TENSORS; i++) {
        const li_train_tensor *t = &e->tm.L.t[i];
        for (int64_t j = 0; j < t->rows * t->cols; j++)
            w->P[t->off + j] = t->rows == 1 ? 1 + 0.3 * rng_f() : 0.5 * rng_f();
    }
    w->emb = malloc((size_t)(L * d) * sizeof *w->emb);
    w->feat = malloc((size_t)(L * 2 * d) * sizeof *w->feat);
    w->EV = malloc((size_t)(e->n_draft * d) * sizeof *w->EV);
    w->teacher = malloc((size_t)(L * e->n_draft) * sizeof *w->teacher);
    double Etok[17 * 12];
    fill(Etok, 17 * d, 1);
    fill(w->feat, L * 2 * d, 1.5);
    fill(w->EV, e->n_draft * d, 1);
    for (int64_t i = 0; i < L * e->n_draft; i++) w->teacher[i] = 3 * rng_f();
    for (int i = 0; i < L; i++) {
        w->tok[i] = (int32_t)(rng_u32() % 17);
        w->labv[i] = e->vmap[w->tok[i]];
        memcpy(w->emb + i * d, Etok + w->tok[i] * d, (size_t)d * sizeof(double));
    }
}

static void dwin_free(dwin *w) {
    free(w->P);
    free(w->emb);
    free(w->feat);
    free(w->EV);
    free(w->teacher);
}

static double dwin_fb(dwin *w, double *G, double alpha, double T, double *ws, li_train_eagle_stats *st) {
    return li_train_eagle_fb_f64(&w->D, w->off, w->P, G, w->emb, w->feat, w->teacher, w->labv, w->EV, alpha, T, 1.0,
                                 ws, NULL, st, NULL);
}

static void test_draft_grad(int neox, int n_rot, double alpha, double T) {
    li_train_eagle e;
    dwin w;
    rng_seed(100 + neox);
    dwin_init(&w, &e, neox, n_rot, 7, 3);
    double *ws = malloc(li_train_eagle_ws_reals_f64(&w.D) * sizeof *ws), *G = calloc(w.np, sizeof *G),
           *num = calloc(w.np, sizeof *num);
    li_train_eagle_stats st, st2;
    const double l0 = dwin_fb(&w, G, alpha, T, ws, &st);
    double lj[LI_TRAIN_EAGLE_MAX_TTT];
    const double lp = plain_loss(&w, alpha, T, lj);
    report(fabs(l0 - lp) < 1e-12 * fabs(lp) && fabs(st.loss_j[2] - lj[2]) < 1e-12 * fabs(lj[2]),
           "draft loss (neox %d, alpha %.2f, T %.0f) = the plain transcription's: %.12f vs %.12f (steps %.4f %.4f "
           "%.4f)",
           neox, alpha, T, l0, lp, st.loss_j[0], st.loss_j[1], st.loss_j[2]);
    for (size_t i = 0; i < w.np; i++) {
        const double p0 = w.P[i];
        w.P[i] = p0 + H_FD;
        const double fp = dwin_fb(&w, NULL, alpha, T, ws, &st2);
        w.P[i] = p0 - H_FD;
        const double fm = dwin_fb(&w, NULL, alpha, T, ws, &st2);
        w.P[i] = p0;
        num[i] = (fp - fm) / (2 * H_FD);
    }
    const double all = rel_err(G, num, (int64_t)w.np);
    char per[512] = "";
    double worst = 0;
    bool moved = true;
    for (int i = 0; i < LI_EAGLE_N_TENSORS; i++) {
        const li_train_tensor *t = &e.tm.L.t[i];
        const double r = rel_err(G + t->off, num + t->off, t->rows * t->cols);
        double mx = 0;
        for (int64_t j = 0; j < t->rows * t->cols; j++) mx = fmax(mx, fabs(num[t->off + j]));
        moved = moved && mx > 1e-6; /* the gradient reaches every tensor */
        worst = fmax(worst, r);
        snprintf(per + strlen(per), sizeof per - strlen(per), " %.0e", r);
    }
    report(all < TOL && worst < 1e-4 && moved,
           "draft gradient vs central differences (L 7, J 3, d 12, 3/1 heads, hd 4, n_rot %d, neox %d, F 2, |V| 11 "
           "of 17, alpha %.2f, T %.0f): rel err %.1e < %.0e; per tensor%s",
           n_rot, neox, alpha, T, all, TOL, per);
    free(ws);
    free(G);
    free(num);
    dwin_free(&w);
    li_train_eagle_free(&e);
}

/* the loss against the plain transcription for every J a window of 7 allows */
static void test_draft_steps(void) {
    bool ok = true;
    double worst = 0;
    for (int J = 1; J <= 5; J++) {
        li_train_eagle e;
        dwin w;
        rng_seed(200 + J);
        dwin_init(&w, &e, 0, 4, 7, J);
        double *ws = malloc(li_train_eagle_ws_reals_f64(&w.D) * sizeof *ws), lj[LI_TRAIN_EAGLE_MAX_TTT];
        li_train_eagle_stats st;
        const double l = dwin_fb(&w, NULL, 0.3, 1.5, ws, &st), lp = plain_loss(&w, 0.3, 1.5, lj);
        worst = fmax(worst, fabs(l - lp) / fabs(lp));
        ok = ok && st.rows == 7 - J - 1;
        for (int j = 0; j < J; j++) ok = ok && fabs(st.loss_j[j] - lj[j]) < 1e-12 * fabs(lj[j]);
        free(ws);
        dwin_free(&w);
        li_train_eagle_free(&e);
    }
    report(ok && worst < 1e-12, "J 1..5 over a window of 7: every step's loss is the plain transcription's (rel %.1e)",
           worst);
}

/* ==== the float path ========================================================== */

static void test_f32(void) {
    enum { L = 21, J = 3, D = 40, NV = 100, VD = 60, F = 3 };
    li_error err = {0};
    li_hparams hp = small_hp(0, 6);
    hp.n_vocab = NV, hp.n_embd = D, hp.n_head = 4, hp.n_head_kv = 2, hp.head_dim = 10, hp.n_ff = 28, hp.n_layer = 6;
    int32_t vocab[VD], feat[F] = {0, 2, 5};
    for (int i = 0; i < VD; i++) vocab[i] = i * NV / VD;
    li_train_eagle e;
    CHECK(li_train_eagle_init(&e, &hp, F, feat, vocab, VD, NULL, 3, &err) == 0, "%s", err.msg);
    rng_seed(21);
    const size_t np = e.tm.L.n_params;
    for (int i = 0; i < LI_EAGLE_N_TENSORS; i++) {
        const li_train_tensor *t = &e.tm.L.t[i];
        for (int64_t j = 0; j < t->rows * t->cols; j++)
            e.tm.params[t->off + j] = t->rows == 1 ? 1 + 0.2f * rng_f() : 0.2f * rng_f();
    }
    float *emb = malloc(L * D * sizeof *emb), *feats = malloc(L * F * D * sizeof *feats),
          *base = malloc(L * NV * sizeof *base), *EV = malloc(VD * D * sizeof *EV);
    int32_t tok[L];
    for (int i = 0; i < L * D; i++) emb[i] = rng_f();
    for (int i = 0; i < L * F * D; i++) feats[i] = 2 * rng_f();
    for (int i = 0; i < L * NV; i++) base[i] = 3 * rng_f();
    for (int i = 0; i < VD * D; i++) EV[i] = rng_f();
    for (int i = 0; i < L; i++) tok[i] = (int32_t)(rng_u32() % NV);
    /* double: the same inputs, the teacher gathered over V by hand */
    dwin w = {0};
    w.D = (li_train_eagle_dims){.d = D, .ff = hp.n_ff, .Vd = VD, .F = F, .H = 4, .Hkv = 2, .hd = 10, .n_rot = 6,
                                .theta = hp.rope_theta, .eps = hp.norm_eps, .L = L, .J = J};
    w.np = np;
    for (int i = 0; i < LI_EAGLE_N_TENSORS; i++) w.off[i] = e.tm.L.t[i].off;
    w.P = malloc(np * sizeof *w.P);
    w.emb = malloc(L * D * sizeof *w.emb);
    w.feat = malloc(L * F * D * sizeof *w.feat);
    w.EV = malloc(VD * D * sizeof *w.EV);
    w.teacher = malloc(L * VD * sizeof *w.teacher);
    for (size_t i = 0; i < np; i++) w.P[i] = e.tm.params[i];
    for (int i = 0; i < L * D; i++) w.emb[i] = emb[i];
    for (int i = 0; i < L * F * D; i++) w.feat[i] = feats[i];
    for (int i = 0; i < VD * D; i++) w.EV[i] = EV[i];
    for (int p = 0; p < L; p++)
        for (int i = 0; i < VD; i++) w.teacher[p * VD + i] = base[p * NV + vocab[i]];
    for (int i = 0; i < L; i++) w.labv[i] = e.vmap[tok[i]];
    double *wsd = malloc(li_train_eagle_ws_reals_f64(&w.D) * sizeof *wsd), *Gd = calloc(np, sizeof *Gd);
    li_train_eagle_stats sd, s1, s2;
    const double ld = dwin_fb(&w, Gd, 0.5, 2.0, wsd, &sd);

    li_train_eagle_ws ws;
    CHECK(li_train_eagle_ws_init(&ws, &e, L, J, &err) == 0, "%s", err.msg);
    li_train_grads g1, g2;
    CHECK(li_train_grads_init(&g1, &e.tm.L) == 0 && li_train_grads_init(&g2, &e.tm.L) == 0, "grads");
    li_threadpool *tp = li_threadpool_init(2);
    const li_train_eagle_window win = {.L = L, .tok = tok, .emb = emb, .feat = feats, .base = base};
    const li_train_eagle_opts o = {.J = J, .alpha = 0.5f, .temperature = 2.0f};
    CHECK(li_train_eagle_forward_backward(&e, &g1, EV, &win, &o, &ws, NULL, &s1, &err) == 0, "%s", err.msg);
    int32_t *am1 = malloc((size_t)J * (L - J - 1) * sizeof *am1);
    memcpy(am1, ws.argmax, (size_t)J * (L - J - 1) * sizeof *am1);
    CHECK(li_train_eagle_forward_backward(&e, &g2, EV, &win, &o, &ws, tp, &s2, &err) == 0, "%s", err.msg);
    float *gdf = malloc(np * sizeof *gdf);
    for (size_t i = 0; i < np; i++) gdf[i] = (float)Gd[i];
    const double en = nmse(g2.g, gdf, (int64_t)np);
    double dl = 0;
    for (int j = 0; j < J; j++) dl = fmax(dl, fabs(s2.loss_j[j] - sd.loss_j[j]) / fabs(sd.loss_j[j]));
    report(en < 1e-9 && dl < 1e-5 && fabs(s2.loss - ld) < 1e-5 * fabs(ld),
           "float draft (SIMD kernels, 2 threads) vs double: grad nmse %.1e, step losses rel %.1e (%.5f vs %.5f)", en,
           dl, s2.loss, ld);
    report(!memcmp(g1.g, g2.g, np * sizeof(float)) && !memcmp(&s1, &s2, sizeof s1) &&
               !memcmp(am1, ws.argmax, (size_t)J * (L - J - 1) * sizeof *am1),
           "the same bits on one and two threads (gradients, losses, top-1)");
    int32_t bad[L];
    memcpy(bad, tok, sizeof bad);
    bad[4] = NV;
    li_train_eagle_window wb = win;
    wb.tok = bad;
    report(li_train_eagle_forward_backward(&e, &g1, EV, &wb, &o, &ws, NULL, &s1, &err) == LI_EINVAL &&
               strstr(err.msg, "outside the vocabulary"),
           "a token outside the vocabulary is refused: %s", err.msg);
    li_train_eagle_ws ws2;
    report(li_train_eagle_ws_init(&ws2, &e, 4, 3, &err) == LI_EINVAL && strstr(err.msg, "needs >= 5"),
           "a window too short for J is refused: %s", err.msg);
    li_threadpool_free(tp);
    li_train_grads_free(&g1);
    li_train_grads_free(&g2);
    li_train_eagle_ws_free(&ws);
    li_train_eagle_free(&e);
    dwin_free(&w);
    free(wsd);
    free(Gd);
    free(gdf);
    free(am1);
    free(emb);
    free(feats);
    free(base);
    free(EV);
}

/* ==== the draft vocabulary ==================================================== */

static void test_vocab(void) {
    const int32_t ids[] = {5, 3, 5, 7, 3, 5, 9, 1, 1, 7, 11};
    int32_t v3[3], v7[7], v12[12];
    li_train_eagle_vocab_select(ids, LI_ARRAY_LEN(ids), 12, 3, v3);
    li_train_eagle_vocab_select(ids, LI_ARRAY_LEN(ids), 12, 7, v7);
    li_train_eagle_vocab_select(ids, LI_ARRAY_LEN(ids), 12, 12, v12);
    /* 5 thrice; 1, 3, 7 twice (ties: 1 and 3 first); 9, 11 once; then unseen ids from 0 */
    const int32_t w3[3] = {1, 3, 5}, w7[7] = {0, 1, 3, 5, 7, 9, 11};
    bool all = true;
    for (int i = 0; i < 12; i++) all = all && v12[i] == i;
    report(!memcmp(v3, w3, sizeof w3) && !memcmp(v7, w7, sizeof w7) && all,
           "draft vocabulary: the most frequent ids, ties to the lower id, unseen ids fill in id order, ascending");
    int32_t f[4];
    const int n30 = li_train_eagle_default_features(30, f);
    const bool d30 = n30 == 3 && f[0] == 2 && f[1] == 15 && f[2] == 29;
    const int n3 = li_train_eagle_default_features(3, f);
    report(d30 && n3 == 2 && f[0] == 1 && f[1] == 2, "default features: 2, 15, 29 of 30 blocks; 1, 2 of 3");

    /* another vocabulary for a draft (--resume --draft-vocab): the map
     * follows, the parameters stay; bad ids refused, the old V kept */
    li_error err = {0};
    li_train_eagle e;
    const li_hparams hp = small_hp(0, 4);
    const int32_t feat[2] = {1, 3}, va[4] = {1, 4, 6, 9}, vb[3] = {0, 9, 15}, bad[3] = {0, 9, 9};
    CHECK(li_train_eagle_init(&e, &hp, 2, feat, va, 4, NULL, 7, &err) == 0, "%s", err.msg);
    const size_t bytes = e.tm.L.n_params * sizeof(float);
    float *before = malloc(bytes);
    memcpy(before, e.tm.params, bytes);
    const bool set = li_train_eagle_set_vocab(&e, vb, 3, &err) == 0;
    const bool mapped = e.n_draft == 3 && e.vocab[2] == 15 && e.vmap[0] == 0 && e.vmap[9] == 1 && e.vmap[15] == 2 &&
                        e.vmap[4] == -1 && e.vmap[1] == -1;
    const bool same = !memcmp(before, e.tm.params, bytes);
    const bool refused = li_train_eagle_set_vocab(&e, bad, 3, &err) != 0 && strstr(err.msg, "ascending") &&
                         e.n_draft == 3 && e.vmap[15] == 2;
    const bool whole = li_train_eagle_set_vocab(&e, NULL, 0, &err) == 0 && !e.vocab && e.n_draft == hp.n_vocab &&
                       e.vmap[4] == 4;
    report(set && mapped && same && refused && whole,
           "set_vocab: a new V and its map, the parameters unchanged, bad ids refused (old V kept), NULL: all");
    free(before);
    li_train_eagle_free(&e);
}

/* ==== on a tiny GGUF ========================================================== */

static li_hparams tiny_hp(void) {
    li_hparams hp = {0};
    snprintf(hp.arch, sizeof hp.arch, "llama");
    hp.n_vocab = 2000;
    hp.n_embd = 16;
    hp.n_layer = 3;
    hp.n_head = 2;
    hp.n_head_kv = 1;
    hp.head_dim = 8;
    hp.n_ff = 24;
    hp.n_rot = 6;
    hp.rope_theta = 10000.0f;
    hp.norm_eps = 1e-5f;
    hp.n_ctx_train = 64;
    return hp;
}

#define SEQ 24
#define NWIN 2

/* a byte string's first occurrence in the file's bytes, or -1 */
static long find_bytes(const char *buf, long n, const char *s) {
    const long m = (long)strlen(s);
    for (long i = 0; i + m <= n; i++)
        if (!memcmp(buf + i, s, (size_t)m)) return i;
    return -1;
}

static void test_tiny(const char *path) {
    li_runtime rt = {0};
    li_error err = {0};
    if (li_runtime_open(&rt, path, 1, NULL, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    li_model *m = rt.model;
    const int64_t d = m->hp.n_embd, V = m->hp.n_vocab;
    li_session s;
    CHECK(li_session_init(&s, m, &rt.be, SEQ, LI_TYPE_F32, SEQ, &err) == 0, "%s", err.msg);
    int32_t feat[4];
    const int F = li_train_eagle_default_features(m->hp.n_layer, feat);
    int32_t tok[NWIN * SEQ];
    rng_seed(7);
    for (int i = 0; i < NWIN * SEQ; i++) tok[i] = 3 + (int32_t)(rng_u32() % 60); /* repeats: something to learn */
    float *lg = malloc((size_t)NWIN * SEQ * V * sizeof *lg), *lg2 = malloc((size_t)SEQ * V * sizeof *lg2),
          *lgv = malloc((size_t)NWIN * SEQ * 64 * sizeof *lgv), *cap = malloc((size_t)NWIN * SEQ * F * d * sizeof *cap),
          *cap2 = malloc((size_t)SEQ * F * d * sizeof *cap2), *emb = malloc((size_t)NWIN * SEQ * d * sizeof *emb);
    /* the draft over the 64 most frequent ids of the windows */
    int32_t vocab[64];
    li_train_eagle_vocab_select(tok, NWIN * SEQ, (int32_t)V, 64, vocab);
    float *EV = li_train_eagle_output_f32(m, vocab, 64);
    li_threadpool *tp = li_threadpool_init(2);
    for (int w = 0; w < NWIN; w++) {
        CHECK(li_train_eagle_base_window(&s, tok + w * SEQ, SEQ, feat, F, NULL, 0, NULL, lg + (size_t)w * SEQ * V,
                                         cap + (size_t)w * SEQ * F * d, &err) == 0,
              "%s", err.msg);
        CHECK(li_train_eagle_base_window(&s, tok + w * SEQ, SEQ, feat, F, EV, 64, tp, lgv + (size_t)w * SEQ * 64,
                                         cap2, &err) == 0,
              "%s", err.msg);
    }
    li_train_eagle_embed(m, tok, NWIN * SEQ, emb);
    li_session_reset(&s);
    CHECK(li_session_eval(&s, tok + SEQ, SEQ, true, lg2, &err) == 0, "%s", err.msg);
    report(!memcmp(lg + (size_t)SEQ * V, lg2, (size_t)SEQ * V * sizeof *lg) &&
               !memcmp(cap + (size_t)SEQ * F * d, cap2, (size_t)SEQ * F * d * sizeof *cap2),
           "the base's window: its logits are li_session_eval's bit for bit (with %d feature blocks captured, the "
           "same with the head over V)", F);
    double ev = 0, mv = 0;
    for (int64_t r = 0; r < NWIN * SEQ; r++)
        for (int i = 0; i < 64; i++) {
            ev = fmax(ev, fabs((double)lgv[r * 64 + i] - lg[r * V + vocab[i]]));
            mv = fmax(mv, fabs((double)lg[r * V + vocab[i]]));
        }
    report(ev / mv < 1e-5, "the head over V alone (post-norm hidden · E_V in float32): the engine's logits over V, "
                           "rel diff %.1e", ev / mv);

    li_train_eagle e;
    CHECK(li_train_eagle_init(&e, &m->hp, F, feat, vocab, 64, m->output_norm, 1, &err) == 0, "%s", err.msg);
    li_train_eagle_ws ws;
    CHECK(li_train_eagle_ws_init(&ws, &e, SEQ, 3, &err) == 0, "%s", err.msg);
    li_train_grads g;
    li_adamw opt;
    CHECK(li_train_grads_init(&g, &e.tm.L) == 0 && li_adamw_init(&opt, &e.tm.L) == 0, "alloc");
    const li_train_eagle_opts o = {.J = 3, .alpha = 1, .temperature = 1, .grad_scale = 1.0f / NWIN};
    const li_adamw_opts ao = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .clip = 1.0f};
    li_train_eagle_stats first = {0}, last = {0};
    for (int step = 0; step < 30; step++) {
        li_train_grads_zero(&g);
        li_train_eagle_stats sum = {0};
        for (int w = 0; w < NWIN; w++) {
            const li_train_eagle_window win = {.L = SEQ, .tok = tok + w * SEQ, .emb = emb + (size_t)w * SEQ * d,
                                               .feat = cap + (size_t)w * SEQ * F * d,
                                               .base_v = lgv + (size_t)w * SEQ * 64};
            li_train_eagle_stats st;
            CHECK(li_train_eagle_forward_backward(&e, &g, EV, &win, &o, &ws, NULL, &st, &err) == 0, "%s", err.msg);
            li_train_eagle_stats_add(&sum, &st);
        }
        if (step == 0) first = sum;
        last = sum;
        CHECK(li_adamw_step(&opt, &e.tm, &g, &ao, NULL, &err) == 0, "%s", err.msg);
    }
    report(last.loss < 0.5 * first.loss && last.loss_j[2] < first.loss_j[2],
           "AdamW, 30 steps on a tiny random base: the loss falls from %.3f to %.3f (steps %.3f %.3f %.3f; top-1 "
           "%lld/%lld at step 0)",
           first.loss, last.loss, last.loss_j[0], last.loss_j[1], last.loss_j[2], (long long)last.agree_j[0],
           (long long)last.rows);

    /* a NaN in the draft: the loss says so and AdamW refuses the step, the parameters untouched */
    {
        float *w0 = li_train_eagle_param(&e, LI_EAGLE_WO), keep = w0[5];
        float *copy = malloc(e.tm.L.n_params * sizeof *copy);
        w0[5] = NAN;
        memcpy(copy, e.tm.params, e.tm.L.n_params * sizeof *copy);
        const li_train_eagle_window win = {.L = SEQ, .tok = tok, .emb = emb, .feat = cap, .base_v = lgv};
        li_train_eagle_stats st;
        li_train_grads_zero(&g);
        CHECK(li_train_eagle_forward_backward(&e, &g, EV, &win, &o, &ws, NULL, &st, &err) == 0, "%s", err.msg);
        const int arc = li_adamw_step(&opt, &e.tm, &g, &ao, NULL, &err);
        report(isnan(st.loss) && arc == LI_ERANGE && !memcmp(copy, e.tm.params, e.tm.L.n_params * sizeof *copy),
               "a NaN weight: the loss is nan and AdamW refuses the step, nothing moved: %s", err.msg);
        w0[5] = keep;
        free(copy);
    }

    /* the file: written, read back through li_eagle_file_check */
    char out[512], bad[512];
    snprintf(out, sizeof out, "%s/draft.gguf", dir);
    snprintf(bad, sizeof bad, "%s/corrupt.gguf", dir);
    const uint64_t vh = li_tokenizer_vocab_hash(m->tok);
    const li_eagle_base base = {.name = "tiny-eagle", .n_embd = d, .n_vocab = V, .n_layer = m->hp.n_layer,
                                .head_dim = m->hp.head_dim, .vocab_hash = vh};
    li_train_eagle_meta meta = {.base_name = "tiny-eagle", .vocab_hash = vh, .steps = 30, .tokens = 30 * NWIN * SEQ,
                                .alpha = 1, .temperature = 1, .lr = 3e-3f, .ttt = 3, .data = "test"};
    CHECK(li_train_eagle_save(&e, &meta, LI_CKPT_F32, out, &err) == 0, "%s", err.msg);
    li_gguf gf;
    li_eagle_file f;
    int rc = li_gguf_open(&gf, out, &err);
    if (!rc) rc = li_eagle_file_check(&gf, out, &base, &f, &err);
    report(rc == 0 && f.n_features == F && f.feature_layer[F - 1] == feat[F - 1] && f.n_draft == 64 && f.vocab &&
               !memcmp(f.vocab, vocab, sizeof vocab) && f.n_head == 2 && f.n_head_kv == 1 && f.n_ff == 24 &&
               !strcmp(f.base_name, "tiny-eagle"),
           "li_eagle_file_check accepts the written draft (features, vocabulary of 64, shape)%s%s", rc ? ": " : "",
           rc ? err.msg : "");
    if (!rc) li_gguf_free(&gf);
    li_train_eagle back;
    rc = li_train_eagle_load(&back, out, &m->hp, &base, &err);
    report(rc == 0 && back.n_draft == 64 && !memcmp(back.vocab, vocab, sizeof vocab) &&
               !memcmp(back.tm.params, e.tm.params, e.tm.L.n_params * sizeof(float)),
           "the draft reads back bit for bit%s%s", rc ? ": " : "", rc ? err.msg : "");
    if (!rc) li_train_eagle_free(&back);
    li_eagle_base other = base;
    other.vocab_hash ^= 1;
    rc = li_train_eagle_load(&back, out, &m->hp, &other, &err);
    report(rc == LI_EINVAL && strstr(err.msg, "vocab hash"), "a draft made for another base is refused: %s", err.msg);
    rc = li_train_eagle_load(&back, path, &m->hp, &base, &err);
    report(rc == LI_EINVAL && strstr(err.msg, "architecture"), "a model file is not a draft: %s", err.msg);
    /* a corrupted key: the hash's first digit made 'G' */
    FILE *fp = fopen(out, "rb");
    char *buf = malloc(1 << 20);
    const long n = fp ? (long)fread(buf, 1, 1 << 20, fp) : 0;
    if (fp) fclose(fp);
    char hx[17];
    snprintf(hx, sizeof hx, "%016llx", (unsigned long long)vh);
    const long at = find_bytes(buf, n, hx);
    if (at >= 0) buf[at] = 'G';
    fp = fopen(bad, "wb");
    if (fp) {
        fwrite(buf, 1, (size_t)n, fp);
        fclose(fp);
    }
    rc = li_train_eagle_load(&back, bad, &m->hp, &base, &err);
    report(at >= 0 && rc == LI_EINVAL && strstr(err.msg, "not 16 lowercase hex digits"),
           "a corrupted key is refused with its message: %s", err.msg);
    free(buf);
    CHECK(li_train_eagle_save(&e, &meta, LI_CKPT_F16, out, &err) == 0, "%s", err.msg);
    rc = li_train_eagle_load(&back, out, &m->hp, &base, &err);
    double fe = 0;
    if (!rc) {
        for (size_t i = 0; i < e.tm.L.n_params; i++) fe = fmax(fe, fabs(back.tm.params[i] - e.tm.params[i]));
        li_train_eagle_free(&back);
    }
    report(rc == 0 && fe < 1e-2, "an F16 draft reads back (max diff %.1e)", fe);

    li_train_grads_free(&g);
    li_adamw_free(&opt);
    li_train_eagle_ws_free(&ws);
    li_train_eagle_free(&e);
    li_aligned_free(EV);
    li_threadpool_free(tp);
    free(lg);
    free(lg2);
    free(lgv);
    free(cap);
    free(cap2);
    free(emb);
    li_session_free(&s);
    li_runtime_close(&rt);
}

int main(void) {
    setenv("LUAINFER_PROGRESS", "0", 1);
    test_chain_attn();
    test_draft_steps();
    test_draft_grad(0, 4, 0.5, 2.0);
    test_draft_grad(1, 2, 1.0, 1.0);
    test_draft_grad(0, 4, 0.25, 1.0);
    test_f32();
    test_vocab();
    snprintf(dir, sizeof dir, "/tmp/li_test_eagle.XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char base[512];
    const li_hparams hp = tiny_hp();
    if (li_test_tiny_model(&hp, "tiny-eagle", 3, 3.0f, dir, base, sizeof base) == 0) test_tiny(base);
    else printf("SKIP: the tiny-model checks (no tests/golden/spm_tiny.gguf)\n");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return t_summary("test_train_eagle");
}
