/* test_rotate.c — the rotation of `luainfer quantize --rotate` (quant/rotate.h)
 * on a tiny random Llama:
 *  - Q (orders 48 and 576) is orthogonal, li_rot_factor finds 12^a 2^b;
 *  - the double-precision block transform is the hadamard op's;
 *  - the rotated F32 model gives the unrotated one's logits (to f32 rounding),
 *    in one batch and token by token, on the CPU backend and the reference ops;
 *  - a broken rotation does not: the online Hadamard skipped in one layer, or
 *    run in blocks of another size (so the check can fail);
 *  - the same input and options give the same bytes; another seed others;
 *  - refusals: an input already rotated, a block that is not a power of two
 *    or does not divide n_ff, an n_embd with no construction. */
#define _GNU_SOURCE
#include "engine/session.h"
#include "quant/rotate.h"
#include "cpu/cpu_kernels.h"
#include "test_util.h"
#include "tiny_model.h"

#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];

static li_hparams tiny_hp(int32_t n_embd) {
    li_hparams hp = {0};
    snprintf(hp.arch, sizeof hp.arch, "llama");
    hp.n_vocab = 2000;
    hp.n_embd = n_embd;
    hp.n_layer = 2;
    hp.n_head = 4;
    hp.n_head_kv = 2;
    hp.head_dim = n_embd / 4;
    hp.n_ff = 96;
    hp.n_rot = n_embd / 4;
    hp.rope_theta = 10000.0f;
    hp.norm_eps = 1e-5f;
    hp.n_ctx_train = 256;
    return hp;
}

static void test_matrices(void) {
    int n12;
    int64_t p2;
    CHECK(li_rot_factor(576, &n12, &p2) == 0 && n12 == 2 && p2 == 4, "576 = 12^2 * 4 (%d, %lld)", n12, (long long)p2);
    CHECK(li_rot_factor(1536, &n12, &p2) == 0 && n12 == 1 && p2 == 128, "1536 = 12 * 128");
    CHECK(li_rot_factor(4096, &n12, &p2) == 0 && n12 == 0 && p2 == 4096, "4096 = 2^12");
    CHECK(li_rot_factor(40, &n12, &p2) != 0 && li_rot_factor(100, &n12, &p2) != 0, "40, 100: no construction");
    for (int64_t n = 48; n <= 576; n += 528) {
        double *q = li_xmalloc((size_t)(n * n) * sizeof(double)), *s = li_xmalloc((size_t)n * sizeof(double));
        double *tmp = li_xmalloc((size_t)n * sizeof(double));
        for (int64_t j = 0; j < n; j++) s[j] = (j * 7 % 3) ? 1.0 : -1.0;
        for (int64_t i = 0; i < n; i++) { /* row i of Q: e_i Q */
            for (int64_t j = 0; j < n; j++) q[i * n + j] = i == j;
            li_rot_apply(q + i * n, s, n, tmp);
        }
        double worst = 0, entry = 0;
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < n; j++) {
                double acc = 0;
                for (int64_t t = 0; t < n; t++) acc += q[i * n + t] * q[j * n + t];
                worst = fmax(worst, fabs(acc - (i == j)));
                entry = fmax(entry, fabs(fabs(q[i * n + j]) * sqrt((double)n) - 1));
            }
        CHECK(worst < 1e-12, "Q of order %lld orthogonal: |Q Q^T - I| %.1e", (long long)n, worst);
        CHECK(entry < 1e-12, "Q of order %lld: every entry +-1/sqrt(n) (a Hadamard matrix), off by %.1e", (long long)n,
              entry);
        free(q);
        free(s);
        free(tmp);
    }
    /* the offline block map is the runtime op's */
    enum { N = 1536, B = 128 };
    static double v[N], sd[N];
    static float f[N], sf[N];
    for (int j = 0; j < N; j++) {
        v[j] = f[j] = (float)sin(j * 0.37) * 3;
        sd[j] = sf[j] = j % 5 ? 1 : -1;
    }
    li_rot_block_apply(v, sd, N, B);
    li_ref_hadamard(f, sf, N, B);
    double d = 0;
    for (int j = 0; j < N; j++) d = fmax(d, fabs(v[j] - f[j]));
    CHECK(d < 1e-5, "li_rot_block_apply (double) = li_ref_hadamard (f32) to rounding: %.1e", d);
}

/* all logits of toks through a session on be */
static float *logits_of(li_model *m, li_backend *be, const int32_t *toks, int64_t n, int64_t batch) {
    li_error err = {0};
    float *out = li_xmalloc((size_t)(n * m->hp.n_vocab) * sizeof(float));
    li_session s;
    CHECK(li_model_prepare(m, be, &err) == 0, "%s", err.msg);
    CHECK(li_session_init(&s, m, be, 128, LI_TYPE_F32, batch, &err) == 0, "%s", err.msg);
    CHECK(li_session_eval(&s, toks, n, true, out, &err) == 0, "%s", err.msg);
    li_session_free(&s);
    li_model_release(m, be);
    return out;
}

static double max_diff(const float *a, const float *b, int64_t n, double *scale) {
    double d = 0, s = 0;
    for (int64_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i])), s = fmax(s, fabs((double)b[i]));
    *scale = s;
    return d;
}

static bool same_bytes(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    for (int ca = 0, cb = 0; same && ca != EOF;) {
        ca = fgetc(fa), cb = fgetc(fb);
        same = ca == cb;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

static void test_model(void) {
    char base[512], rot[512], rot2[512], rot3[512];
    const li_hparams hp = tiny_hp(48);
    if (li_test_tiny_model(&hp, "tiny-rotate", 11, 3.0f, dir, base, sizeof base)) return;
    snprintf(rot, sizeof rot, "%s/rot.gguf", dir);
    snprintf(rot2, sizeof rot2, "%s/rot2.gguf", dir);
    snprintf(rot3, sizeof rot3, "%s/rot3.gguf", dir);
    li_error err = {0};
    CHECK(li_rotate_model(base, rot, &(li_rot_opts){.seed = 0, .down_block = 32}, &err) == 0, "%s", err.msg);
    CHECK(li_rotate_model(base, rot2, &(li_rot_opts){.seed = 0, .down_block = 32}, &err) == 0, "%s", err.msg);
    CHECK(li_rotate_model(base, rot3, &(li_rot_opts){.seed = 1, .down_block = 32}, &err) == 0, "%s", err.msg);
    CHECK(same_bytes(rot, rot2), "the same input and options give the same bytes");
    CHECK(!same_bytes(rot, rot3), "another seed gives other bytes");

    li_model *m0, *m1;
    CHECK(li_model_load(&m0, base, &err) == 0, "%s", err.msg);
    CHECK(li_model_load(&m1, rot, &err) == 0, "%s", err.msg);
    CHECK(m0->rot_block == 0 && m1->rot_block == 32 && m1->layers[1].down_had, "the loader reads the rotation");
    CHECK(m1->output.data != m1->tok_embd.data && m0->output.data == m0->tok_embd.data, "the head is untied");
    bool ones = true;
    for (int j = 0; j < hp.n_embd; j++) ones &= m1->layers[0].attn_norm[j] == 1.0f && m1->output_norm[j] == 1.0f;
    CHECK(ones, "the stored gammas are 1 (folded)");

    int32_t toks[40];
    for (int i = 0; i < 40; i++) toks[i] = (int32_t)((i * 131 + 7) % hp.n_vocab);
    const int64_t n = 40, nv = hp.n_vocab;
    li_backend cpu, ref = {.ops = li_backend_ref_ops(), .n_threads = 1};
    CHECK(li_backend_cpu_init(&cpu, 2, "auto", &err) == 0, "%s", err.msg);
    float *want = logits_of(m0, &cpu, toks, n, 64), *got = logits_of(m1, &cpu, toks, n, 64);
    float *step = logits_of(m1, &cpu, toks, n, 1), *got_ref = logits_of(m1, &ref, toks, n, 64);
    double scale, d = max_diff(got, want, n * nv, &scale);
    const double tol = 1e-4 * scale;
    printf("rotated vs unrotated (f32, cpu %s): max |dlogit| %.2e of logits up to %.1f\n", li_backend_cpu_isa(&cpu), d,
           scale);
    CHECK(scale > 1 && d < tol, "rotated logits = unrotated to f32 rounding: %.2e (tolerance %.2e)", d, tol);
    d = max_diff(got_ref, want, n * nv, &scale);
    CHECK(d < tol, "reference ops: rotated = unrotated: %.2e", d);
    d = max_diff(step, got, n * nv, &scale);
    CHECK(d == 0, "rotated, token by token = one batch, bit for bit (%.1e)", d);

    /* broken: layer 0 without its online Hadamard, or in blocks of 16 */
    const float *keep = m1->layers[0].down_had;
    m1->layers[0].down_had = NULL;
    float *bad = logits_of(m1, &cpu, toks, n, 64);
    m1->layers[0].down_had = keep;
    d = max_diff(bad, want, n * nv, &scale);
    printf("broken (no online Hadamard in layer 0): max |dlogit| %.2e\n", d);
    CHECK(d > 100 * tol, "a rotation missing its online Hadamard is caught: %.2e > %.2e", d, 100 * tol);
    free(bad);
    m1->rot_block = 16;
    bad = logits_of(m1, &cpu, toks, n, 64);
    m1->rot_block = 32;
    d = max_diff(bad, want, n * nv, &scale);
    CHECK(d > 100 * tol, "the online Hadamard in other blocks is caught: %.2e", d);
    free(bad);
    free(want);
    free(got);
    free(step);
    free(got_ref);

    /* refusals */
    CHECK(li_model_refuse_rotated(m1, "prune", &err) == LI_EUNSUP && strstr(err.msg, "rotated"), "%s", err.msg);
    CHECK(li_model_refuse_rotated(m0, "prune", &err) == 0, "an unrotated model passes");
    li_model_free(m0);
    li_model_free(m1);
    CHECK(li_rotate_model(rot, rot2, &(li_rot_opts){.down_block = 32}, &err) == LI_EINVAL &&
              strstr(err.msg, "already rotated"), "%s", err.msg);
    CHECK(li_rotate_model(base, rot2, &(li_rot_opts){.down_block = 24}, &err) == LI_EINVAL &&
              strstr(err.msg, "power of two dividing n_ff 96"), "%s", err.msg);
    CHECK(li_rotate_model(base, rot2, &(li_rot_opts){.down_block = 64}, &err) == LI_EINVAL, "64 does not divide 96");
    li_backend_cpu_free(&cpu);

    char d40[300], base40[512];
    snprintf(d40, sizeof d40, "%s/e40", dir);
    mkdir(d40, 0700);
    const li_hparams h40 = tiny_hp(40);
    if (li_test_tiny_model(&h40, NULL, 3, 1.0f, d40, base40, sizeof base40)) return;
    CHECK(li_rotate_model(base40, rot2, &(li_rot_opts){.down_block = 32}, &err) == LI_EUNSUP &&
              strstr(err.msg, "n_embd 40"), "%s", err.msg);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/li_test_rotate.XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_matrices();
    test_model();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return t_summary("rotate");
}
