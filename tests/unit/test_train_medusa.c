/* test_train_medusa.c — Medusa heads (core/train/medusa.h):
 *
 *   the heads' backward pass against central finite differences in double
 *   (medusa_f64.c) at odd sizes (n_embd 7, n_vocab 11, N 5, K 3): every
 *   parameter, with and without the KL term;
 *   the float path (AVX2 kernels, the loss's rows on two threads) against
 *   the double one, and the same bits on one and two threads;
 *   on a tiny GGUF (spm_tiny's tokenizer, random weights): zero heads give
 *   the base's own logits (z = h bit for bit; the engine's logits to 1e-5),
 *   AdamW makes the heads' loss fall, and the heads file round-trips and
 *   refuses another base's vocabulary. */
#define _POSIX_C_SOURCE 200809L
#include "test_util.h"
#include "tiny_model.h"
#include "train/medusa.h"
#include "train/selfgen.h"
#include "train/train_internal.h"
#include "engine/session.h"
#include "model/gguf_write.h"
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

/* ==== gradient check in double ============================================== */

/* The loss written out plainly from docs/medusa.md (not medusa_tmpl.h):
 * head k at position t: z = h_t + silu(W_k h_t + b_k), s = E·z, against
 * token t+k+2 and base row t+k+1; each head's mean, then the heads' mean. */
static double plain_loss(const double *P, int K, const double *E, const double *H, const float *base,
                         const int32_t *tok, int N, int D, int V, double alpha, double T) {
    double total = 0;
    for (int k = 0; k < K; k++) {
        const double *W = P + k * (D * D + D), *b = W + D * D;
        double sum = 0;
        int cnt = 0;
        for (int t = 0; t + k + 2 < N; t++, cnt++) {
            double z[64], sl[64], mx = -1e300, mt = -1e300, ms = -1e300, zs = 0, zt = 0, ze = 0, kl = 0;
            for (int i = 0; i < D; i++) {
                double a = b[i];
                for (int j = 0; j < D; j++) a += W[i * D + j] * H[t * D + j];
                z[i] = H[t * D + i] + a / (1 + exp(-a));
            }
            for (int v = 0; v < V; v++) {
                sl[v] = 0;
                for (int i = 0; i < D; i++) sl[v] += E[v * D + i] * z[i];
                mx = fmax(mx, sl[v]);
                ms = fmax(ms, sl[v] / T);
                mt = fmax(mt, base[(t + k + 1) * V + v] / T);
            }
            for (int v = 0; v < V; v++) {
                ze += exp(sl[v] - mx);
                zs += exp(sl[v] / T - ms);
                zt += exp(base[(t + k + 1) * V + v] / T - mt);
            }
            for (int v = 0; v < V; v++) {
                const double lpt = base[(t + k + 1) * V + v] / T - mt - log(zt), lps = sl[v] / T - ms - log(zs);
                kl += exp(lpt) * (lpt - lps);
            }
            sum += alpha * T * T * kl + (1 - alpha) * (mx + log(ze) - sl[tok[t + k + 2]]);
        }
        total += cnt ? sum / cnt : 0;
    }
    return total / K;
}

static void test_grad(double alpha) {
    enum { K = 3, D = 7, V = 11, N = 5 };
    const int64_t per = D * D + D, np = K * per;
    double P[K * (D * D + D)], G[K * (D * D + D)], num[K * (D * D + D)], E[V * D], H[N * D];
    float base[N * V];
    int32_t tok[N], lab[N];
    rng_seed(11);
    for (int64_t i = 0; i < np; i++) P[i] = 0.5 * rng_f();
    for (int i = 0; i < V * D; i++) E[i] = rng_f();
    for (int i = 0; i < N * D; i++) H[i] = 1.5 * rng_f();
    for (int i = 0; i < N * V; i++) base[i] = 3 * rng_f();
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(rng_u32() % V);
    double *ws = malloc(li_train_medusa_ws_reals(D, V, N) * sizeof(double));
    memset(G, 0, sizeof G);
    double lk[K], kk[K];
    const double l0 = li_train_medusa_fb_f64(P, G, K, E, H, base, tok, N, D, V, alpha, 2.0, 1.0, ws, lab, NULL, lk, kk);
    for (int64_t i = 0; i < np; i++) {
        const double p0 = P[i];
        P[i] = p0 + H_FD;
        const double lp = li_train_medusa_fb_f64(P, NULL, K, E, H, base, tok, N, D, V, alpha, 2.0, 1.0, ws, lab, NULL, NULL, NULL);
        P[i] = p0 - H_FD;
        const double lm = li_train_medusa_fb_f64(P, NULL, K, E, H, base, tok, N, D, V, alpha, 2.0, 1.0, ws, lab, NULL, NULL, NULL);
        P[i] = p0;
        num[i] = (lp - lm) / (2 * H_FD);
    }
    const double e = rel_err(G, num, np);
    double eh[K];
    for (int k = 0; k < K; k++) eh[k] = rel_err(G + k * per, num + k * per, per);
    report(e < TOL && eh[0] < 1e-4 && eh[1] < 1e-4 && eh[2] < 1e-4 && l0 > 0,
           "heads' gradient vs central differences (K 3, n_embd 7, n_vocab 11, N 5, alpha %.1f): rel err %.1e "
           "(heads %.1e %.1e %.1e) < %.0e; loss %.4f = mean of %.3f %.3f %.3f",
           alpha, e, eh[0], eh[1], eh[2], TOL, l0, lk[0], lk[1], lk[2]);
    const double lp = plain_loss(P, K, E, H, base, tok, N, D, V, alpha, 2.0);
    report(fabs(l0 - lp) < 1e-12 * fabs(lp), "the loss is the plain transcription's: %.12f vs %.12f", l0, lp);
    /* head 3 at N 5 has one position (t = 0: token 4 against base row 3) */
    report(fabs(l0 - (lk[0] + lk[1] + lk[2]) / 3) < 1e-12 && (alpha == 0 || kk[2] > 0),
           "the loss is the heads' mean; head 3 has its one position");
    free(ws);
}

/* ==== the float path ========================================================== */

static void test_f32(void) {
    enum { K = 2, D = 37, V = 45, N = 9 };
    const int64_t per = D * D + D, np = K * per;
    li_error err = {0};
    li_train_medusa h;
    CHECK(li_train_medusa_init(&h, K, D, V, &err) == 0, "%s", err.msg);
    double *P = malloc(np * sizeof *P), *Gd = calloc(np, sizeof *Gd), Ed[V * D], Hd[N * D];
    float E[V * D], Hf[N * D], base[N * V];
    int32_t tok[N], lab[N];
    rng_seed(5);
    for (int64_t i = 0; i < np; i++) h.tm.params[i] = (float)(P[i] = 0.2 * rng_f());
    for (int i = 0; i < V * D; i++) Ed[i] = E[i] = rng_f();
    for (int i = 0; i < N * D; i++) Hd[i] = Hf[i] = rng_f();
    for (int i = 0; i < N * V; i++) base[i] = 2 * rng_f();
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(rng_u32() % V);
    double *wsd = malloc(li_train_medusa_ws_reals(D, V, N) * sizeof(double));
    const double ld = li_train_medusa_fb_f64(P, Gd, K, Ed, Hd, base, tok, N, D, V, 0.5, 2.0, 1.0, wsd, lab, NULL, NULL, NULL);
    li_train_medusa_ws ws;
    CHECK(li_train_medusa_ws_init(&ws, &h, N, &err) == 0, "%s", err.msg);
    li_train_grads g1, g2;
    CHECK(li_train_grads_init(&g1, &h.tm.L) == 0 && li_train_grads_init(&g2, &h.tm.L) == 0, "grads");
    li_threadpool *tp = li_threadpool_init(2);
    const li_train_loss_opts o = {.alpha = 0.5f, .temperature = 2.0f};
    double l1 = 0, l2 = 0;
    CHECK(li_train_medusa_forward_backward(&h, &g1, E, Hf, base, tok, N, &o, &ws, NULL, &l1, NULL, NULL, &err) == 0, "%s", err.msg);
    CHECK(li_train_medusa_forward_backward(&h, &g2, E, Hf, base, tok, N, &o, &ws, tp, &l2, NULL, NULL, &err) == 0, "%s", err.msg);
    float *gdf = malloc(np * sizeof *gdf);
    for (int64_t i = 0; i < np; i++) gdf[i] = (float)Gd[i];
    const double e = nmse(g2.g, gdf, np);
    report(e < 1e-10 && fabs(l2 - ld) < 1e-5 * fabs(ld), "float heads (AVX2, 2 threads) vs double: grad nmse %.1e, loss %.6f vs %.6f",
           e, l2, ld);
    report(!memcmp(g1.g, g2.g, np * sizeof(float)) && l1 == l2, "the same bits on one and two threads");
    int32_t bad[N];
    memcpy(bad, tok, sizeof bad);
    bad[3] = V;
    report(li_train_medusa_forward_backward(&h, &g1, E, Hf, base, bad, N, &o, &ws, NULL, &l1, NULL, NULL, &err) == LI_EINVAL &&
               strstr(err.msg, "outside the vocabulary"),
           "a token outside the vocabulary is refused: %s", err.msg);
    li_threadpool_free(tp);
    li_train_grads_free(&g1);
    li_train_grads_free(&g2);
    li_train_medusa_ws_free(&ws);
    li_train_medusa_free(&h);
    free(P);
    free(Gd);
    free(gdf);
    free(wsd);
}

/* ==== on a tiny GGUF ========================================================== */

static li_hparams tiny_hp(void) {
    li_hparams hp = {0};
    snprintf(hp.arch, sizeof hp.arch, "llama");
    hp.n_vocab = 2000;
    hp.n_embd = 16;
    hp.n_layer = 2;
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

/* spm_tiny's tokenizer with tiny_hp and random weights, written by li_train_save */
static int make_tiny(char *base, size_t cap) {
    const li_hparams hp = tiny_hp();
    return li_test_tiny_model(&hp, NULL, 3, 3.0f, dir, base, cap);
}

#define SEQ 24

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
    int32_t tok[SEQ];
    rng_seed(7);
    for (int i = 0; i < SEQ; i++) tok[i] = 3 + (int32_t)(rng_u32() % 1990);
    float *lg = malloc((size_t)SEQ * V * sizeof *lg), *lg2 = malloc((size_t)SEQ * V * sizeof *lg2),
          *ref = malloc((size_t)SEQ * V * sizeof *ref), *H = malloc((size_t)SEQ * d * sizeof *H);
    CHECK(li_train_medusa_base_window(&s, tok, SEQ, lg, H, &err) == 0, "%s", err.msg);
    li_session_reset(&s);
    CHECK(li_session_eval(&s, tok, SEQ, true, lg2, &err) == 0, "%s", err.msg);
    report(!memcmp(lg, lg2, (size_t)SEQ * V * sizeof *lg), "the window's logits are li_session_eval's, bit for bit");
    float *E = li_train_medusa_output_f32(m);
    li_train_medusa h;
    CHECK(li_train_medusa_init(&h, 3, d, V, &err) == 0, "%s", err.msg);
    li_train_medusa_ws ws;
    CHECK(li_train_medusa_ws_init(&ws, &h, SEQ, &err) == 0, "%s", err.msg);
    /* zero heads: z = h exactly, so every head's logits are h·E^T */
    li_train_mm_nt(NULL, H, E, ref, SEQ, V, d);
    bool same = true;
    for (int k = 0; k < 3; k++) {
        li_train_medusa_head_logits(&h, k, E, H, SEQ, &ws, NULL);
        same = same && !memcmp(ws.Z, H, (size_t)SEQ * d * sizeof *H) &&
               !memcmp(ws.logits, ref, (size_t)SEQ * V * sizeof *ref);
    }
    double e = 0, mx = 0;
    for (int64_t i = 0; i < SEQ * V; i++) {
        e = fmax(e, fabs((double)ws.logits[i] - lg[i]));
        mx = fmax(mx, fabs((double)lg[i]));
    }
    report(same && e / mx < 1e-5, "zero heads: z = h bit for bit, the logits h·E^T; vs the engine's logits rel diff %.1e < 1e-5",
           e / mx);

    /* the loss falls: AdamW on one window */
    li_train_grads g;
    li_adamw opt;
    CHECK(li_train_grads_init(&g, &h.tm.L) == 0 && li_adamw_init(&opt, &h.tm.L) == 0, "alloc");
    const li_train_loss_opts lo = {.alpha = 0.5f, .temperature = 2.0f};
    const li_adamw_opts ao = {.lr = 2e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .clip = 1.0f};
    double l_first = 0, l = 0, lk[3];
    for (int step = 0; step < 40; step++) {
        li_train_grads_zero(&g);
        CHECK(li_train_medusa_forward_backward(&h, &g, E, H, lg, tok, SEQ, &lo, &ws, NULL, &l, lk, NULL, &err) == 0, "%s", err.msg);
        if (step == 0) l_first = l;
        CHECK(li_adamw_step(&opt, &h.tm, &g, &ao, NULL, &err) == 0, "%s", err.msg);
    }
    report(l < 0.8 * l_first, "AdamW: the heads' loss falls by over a fifth, from %.3f to %.3f in 40 steps (heads %.3f %.3f %.3f)", l_first, l,
           lk[0], lk[1], lk[2]);

    /* the file: written, read back, checked against the base */
    char out[512];
    snprintf(out, sizeof out, "%s/heads.gguf", dir);
    const uint64_t vh = li_tokenizer_vocab_hash(m->tok);
    li_train_medusa_meta meta = {.base_name = "tiny", .vocab_hash = vh, .steps = 40, .tokens = 40 * SEQ, .alpha = 0.5f,
                           .temperature = 2, .data = "test"};
    CHECK(li_train_medusa_save(&h, &meta, LI_CKPT_F32, out, &err) == 0, "%s", err.msg);
    li_train_medusa back;
    int rc = li_train_medusa_load(&back, out, d, V, vh, &err);
    report(rc == 0 && back.K == 3 && !memcmp(back.tm.params, h.tm.params, h.tm.L.n_params * sizeof(float)),
           "the heads file reads back bit for bit%s%s", rc ? ": " : "", rc ? err.msg : "");
    if (!rc) li_train_medusa_free(&back);
    rc = li_train_medusa_load(&back, out, d, V, vh ^ 1, &err);
    report(rc == LI_EINVAL && strstr(err.msg, "vocab hash"), "another vocabulary is refused: %s", err.msg);
    rc = li_train_medusa_load(&back, out, d + 1, V, vh, &err);
    report(rc == LI_EINVAL && strstr(err.msg, "n_embd"), "another width is refused: %s", err.msg);
    rc = li_train_medusa_load(&back, path, d, V, vh, &err);
    report(rc == LI_EINVAL && strstr(err.msg, "architecture"), "a model file is not a heads file: %s", err.msg);
    CHECK(li_train_medusa_save(&h, &meta, LI_CKPT_F16, out, &err) == 0, "%s", err.msg);
    rc = li_train_medusa_load(&back, out, d, V, vh, &err);
    double fe = 0;
    if (!rc) {
        for (size_t i = 0; i < h.tm.L.n_params; i++) fe = fmax(fe, fabs(back.tm.params[i] - h.tm.params[i]));
        li_train_medusa_free(&back);
    }
    report(rc == 0 && fe < 1e-2, "F16 heads read back (max diff %.1e)", fe);

    /* several streams per forward pass: each stream's tokens depend on its
     * own generator only (its KV rows apart from the others'), so stream 0
     * of three is stream 0 alone */
    int32_t *g3 = NULL, *g1 = NULL, *g3b = NULL;
    CHECK(li_train_self_generate_n(m, &rt.be, 3 * 255, 9, 3, &g3, &err) == 0, "%s", err.msg);
    CHECK(li_train_self_generate_n(m, &rt.be, 255, 9, 1, &g1, &err) == 0, "%s", err.msg);
    CHECK(li_train_self_generate_n(m, &rt.be, 3 * 255, 9, 3, &g3b, &err) == 0, "%s", err.msg);
    bool in_vocab = g3 && g1, differ = g3 != NULL;
    for (int i = 0; g3 && i < 3 * 255; i++) in_vocab = in_vocab && g3[i] >= 0 && g3[i] < V;
    if (g3) differ = memcmp(g3, g3 + 255, 255 * sizeof *g3) != 0;
    report(in_vocab && differ && !memcmp(g3, g1, 255 * sizeof *g1) && !memcmp(g3, g3b, 3 * 255 * sizeof *g3),
           "self-generate, 3 streams: stream 0 is the one-stream run's, the streams differ, the same seed repeats");
    free(g3);
    free(g1);
    free(g3b);

    li_train_grads_free(&g);
    li_adamw_free(&opt);
    li_train_medusa_ws_free(&ws);
    li_train_medusa_free(&h);
    li_aligned_free(E);
    free(lg);
    free(lg2);
    free(ref);
    free(H);
    li_session_free(&s);
    li_runtime_close(&rt);
}

int main(void) {
    setenv("LUAINFER_PROGRESS", "0", 1); /* self-generate's progress lines */
    test_grad(0.5);
    test_grad(0.0);
    test_f32();
    snprintf(dir, sizeof dir, "/tmp/li_test_medusa.XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char base[512];
    if (make_tiny(base, sizeof base) == 0) test_tiny(base);
    else printf("SKIP: the tiny-model checks (no tests/golden/spm_tiny.gguf)\n");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return t_summary("test_train_medusa");
}
