/* test_quant4.c — the 4-bit quantizers' contracts (core/quant/quant4.h) and
 * the 4-bit group kernels (kernels/cpu/q4g_kernels.h):
 *
 *   quantizers  clear errors (a group that does not divide a row, odd rows,
 *               no calibration rows, mismatched widths, a Hessian that
 *               damping cannot save); results viewed as li_weight dequantize
 *               (li_weight_dequant_row_ref) to li_q4_result_dequant; GPTQ
 *               and AWQ below RTN4's output error on a layer with large
 *               activation channels; act-order gives a permutation
 *   A16         every ISA's matmul (and matmul_add) = the reference's bits
 *               at odd shapes, groups 64 / 128 / per channel, with and
 *               without act-order, AWQ / GPTQ / INT4 and W4A4 (int4
 *               activations), 1 and 2 threads, batch sizes 1..70
 *   A8          every ISA = li_q4g_a8_row_ref's bits, close to A16;
 *               batch-invariant (a row alone = the same row in a batch)
 *   factors     GPTQ's / OBS's Cholesky and SPD inverse = plain loops'
 *               bits at sizes across their blocking's edges
 * The float64 NumPy transcriptions of the papers are in
 * tests/integration/test_quant4_ref.py. */
#include "test_util.h"
#include "quant/quant4.h"
#include "cpu/q4g_kernels.h"
#include "cpu/threadpool.h"
#include "util/common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float randn(void) { /* sum of uniforms: enough for test data */
    float s = 0.0f;
    for (int i = 0; i < 4; i++) s += rng_f();
    return s * 0.8660254f;
}

/* ------------------------------------------------------------------------
 * quantizers
 * ---------------------------------------------------------------------- */

static void make_layer(float *w, float *x, int64_t n_out, int64_t n_in, int64_t n_rows) {
    for (int64_t i = 0; i < n_out * n_in; i++) w[i] = 0.05f * randn();
    for (int64_t r = 0; r < n_rows; r++)
        for (int64_t j = 0; j < n_in; j++) x[r * n_in + j] = randn() * (j % 61 == 3 ? 25.0f : 1.0f);
}

static void test_quantizer_errors(void) {
    char why[256];
    li_q4_opts o;
    li_q4_opts_default(&o);
    float w[4 * 96] = {0};
    li_q4_result r;
    o.group_size = 64;
    report(li_q4_rtn(w, 4, 96, &o, &r, why, sizeof why) == -1 && strstr(why, "does not divide"),
           "rtn4 refuses group 64 on rows of 96: \"%s\"", why);
    o.group_size = 0;
    report(li_q4_rtn(w, 4, 95, &o, &r, why, sizeof why) == -1 && strstr(why, "even"),
           "rtn4 refuses rows of 95: \"%s\"", why);
    li_q4_calib c;
    report(li_q4_calib_init(&c, 96, why, sizeof why) == 0, "calib init");
    report(li_q4_calib_finish(&c, why, sizeof why) == -1 && strstr(why, "no calibration rows"),
           "calib refuses to finish with no rows: \"%s\"", why);
    report(li_q4_gptq(w, 4, 96, &c, &o, &r, why, sizeof why) == -1 && strstr(why, "not finished"),
           "gptq refuses unfinished statistics: \"%s\"", why);
    float x[2 * 96] = {0};
    x[5] = x[6] = 1.0f; /* two inputs always equal: a singular Hessian */
    li_q4_calib_accumulate(&c, x, 2);
    li_q4_calib_finish(&c, why, sizeof why);
    report(li_q4_awq(w, 4, 64, &c, &o, &r, why, sizeof why) == -1 && strstr(why, "width 96"),
           "awq refuses statistics of another width: \"%s\"", why);
    o.damp = 0.0;
    report(li_q4_gptq(w, 4, 96, &c, &o, &r, why, sizeof why) == -1 && strstr(why, "positive definite"),
           "gptq without damping on a singular Hessian: \"%s\"", why);
    o.damp = 0.01;
    report(li_q4_gptq(w, 4, 96, &c, &o, &r, why, sizeof why) == 0, "gptq with 1%% damping on it works");
    li_q4_result_free(&r);
    li_q4_calib_free(&c);
}

static bool view_matches(const li_q4_result *r, li_scheme scheme, li_act_quant act, const char *what) {
    char why[256];
    uint8_t *packed = li_xmalloc((size_t)(r->n_out * r->n_in / 2));
    li_weight w;
    const int rc = li_q4_weight_view(r, scheme, act, packed, &w, why, sizeof why);
    float *a = li_xmalloc((size_t)(r->n_out * r->n_in) * sizeof(float));
    float *b = li_xmalloc((size_t)r->n_in * sizeof(float));
    li_q4_result_dequant(r, a);
    bool ok = rc == 0;
    for (int64_t i = 0; ok && i < r->n_out; i++) {
        li_weight_dequant_row_ref(&w, i, b);
        ok = !memcmp(a + i * r->n_in, b, (size_t)r->n_in * sizeof(float));
    }
    report(ok, "%s: the li_weight view dequantizes to li_q4_result_dequant%s%s", what, rc ? ": " : "", rc ? why : "");
    free(packed);
    free(a);
    free(b);
    return ok;
}

static void test_quantizers(void) {
    const int64_t n_out = 37, n_in = 256, n_rows = 300;
    float *w = li_xmalloc((size_t)(n_out * n_in) * sizeof(float));
    float *x = li_xmalloc((size_t)(n_rows * n_in) * sizeof(float));
    rng_seed(11);
    make_layer(w, x, n_out, n_in, n_rows);
    char why[256];
    li_q4_calib c, c2;
    li_q4_calib_init(&c, n_in, why, sizeof why);
    li_q4_calib_init(&c2, n_in, why, sizeof why);
    li_q4_calib_accumulate(&c, x, n_rows);
    for (int64_t r = 0; r < n_rows; r += 40) li_q4_calib_accumulate(&c2, x + r * n_in, LI_MIN(40, n_rows - r));
    li_q4_calib_finish(&c, why, sizeof why);
    li_q4_calib_finish(&c2, why, sizeof why);
    report(!memcmp(c.xtx, c2.xtx, (size_t)(n_in * n_in) * sizeof(double)) &&
               !memcmp(c.abs_sum, c2.abs_sum, (size_t)n_in * sizeof(double)),
           "calibration streamed in chunks of 40 rows = in one call, bit for bit");
    { /* accumulated on a pool of 3 (the 256-row run split by row tiles of the triangle; the last 44 rows
       * on the caller): the same bits */
        li_q4_calib c3;
        li_q4_calib_init(&c3, n_in, why, sizeof why);
        c3.tp = li_threadpool_init(3);
        li_q4_calib_accumulate(&c3, x, n_rows);
        li_q4_calib_finish(&c3, why, sizeof why);
        report(c3.tp && !memcmp(c.xtx, c3.xtx, (size_t)(n_in * n_in) * sizeof(double)) &&
                   !memcmp(c.abs_sum, c3.abs_sum, (size_t)n_in * sizeof(double)),
               "calibration accumulated on 3 threads = on one, bit for bit");
        li_threadpool_free(c3.tp);
        li_q4_calib_free(&c3);
    }
    li_q4_opts o;
    li_q4_opts_default(&o);
    li_q4_result rtn, gptq, gptq_ao, awq, sym, w4;
    li_q4_rtn(w, n_out, n_in, &o, &rtn, why, sizeof why);
    li_q4_gptq(w, n_out, n_in, &c, &o, &gptq, why, sizeof why);
    o.act_order = true;
    li_q4_gptq(w, n_out, n_in, &c, &o, &gptq_ao, why, sizeof why);
    o.act_order = false;
    li_q4_awq(w, n_out, n_in, &c, &o, &awq, why, sizeof why);
    o.symmetric = true;
    li_q4_rtn(w, n_out, n_in, &o, &sym, why, sizeof why);
    li_q4_w4a4(w, n_out, n_in, NULL, 0, &w4, why, sizeof why);
    const double e_rtn = li_q4_output_error(w, &rtn, &c), e_gptq = li_q4_output_error(w, &gptq, &c),
                 e_ao = li_q4_output_error(w, &gptq_ao, &c), e_awq = li_q4_output_error(w, &awq, &c);
    report(e_gptq < 0.8 * e_rtn && e_ao < 0.8 * e_rtn, "gptq (%.4g, act-order %.4g) < 0.8 x rtn4 (%.4g)", e_gptq, e_ao,
           e_rtn);
    report(e_awq < e_rtn && awq.alpha > 0.0, "awq (%.4g, alpha %.3f) < rtn4 (%.4g)", e_awq, awq.alpha, e_rtn);
    bool perm_ok = gptq_ao.perm != NULL && gptq.perm == NULL;
    uint8_t *seen = calloc((size_t)n_in, 1);
    for (int64_t j = 0; perm_ok && j < n_in; j++) perm_ok = !seen[gptq_ao.perm[j]]++;
    /* the first stored columns are the large-activation ones (diag(H) largest) */
    perm_ok = perm_ok && gptq_ao.perm[0] % 61 == 3;
    free(seen);
    report(perm_ok, "act-order: a permutation, large-activation columns first (perm[0] = %d)",
           gptq_ao.perm ? gptq_ao.perm[0] : -1);
    report(w4.act == LI_ACT_INT4 && w4.n_groups == 1 && !w4.zeros, "w4a4: per channel, symmetric, int4 activations");
    view_matches(&rtn, LI_SCHEME_AWQ, LI_ACT_F32, "rtn4 as awq");
    view_matches(&gptq_ao, LI_SCHEME_GPTQ, LI_ACT_F32, "gptq act-order as gptq");
    view_matches(&sym, LI_SCHEME_INT4, LI_ACT_F32, "rtn4 symmetric as int4");
    view_matches(&w4, LI_SCHEME_INT4, LI_ACT_INT4, "w4a4 as int4 with int4 activations");
    uint8_t packed[37 * 128];
    li_weight vw;
    report(li_q4_weight_view(&gptq_ao, LI_SCHEME_AWQ, LI_ACT_F32, packed, &vw, why, sizeof why) == -1 &&
               strstr(why, "permutation"), "the view refuses act-order on awq: \"%s\"", why);
    report(li_q4_weight_view(&sym, LI_SCHEME_AWQ, LI_ACT_F32, packed, &vw, why, sizeof why) == -1 &&
               strstr(why, "symmetric"), "the view refuses a symmetric result as awq: \"%s\"", why);
    li_q4_result_free(&rtn);
    li_q4_result_free(&gptq);
    li_q4_result_free(&gptq_ao);
    li_q4_result_free(&awq);
    li_q4_result_free(&sym);
    li_q4_result_free(&w4);
    li_q4_calib_free(&c);
    li_q4_calib_free(&c2);
    free(w);
    free(x);
}

/* ------------------------------------------------------------------------
 * kernels
 * ---------------------------------------------------------------------- */

typedef struct {
    li_scheme scheme;
    li_act_quant act;
    int64_t k, m, gs;
    bool perm;
} kcase;

/* a random weight of the case: codes 0..15, integer zeros, scales ~1/64 */
static void make_weight(const kcase *kc, li_weight *w, uint8_t **data, float **sc, float **zp, int32_t **perm) {
    const int64_t ng = kc->gs ? (kc->k + kc->gs - 1) / kc->gs : 1;
    *data = li_xmalloc((size_t)(kc->m * kc->k / 2));
    for (int64_t i = 0; i < kc->m * kc->k / 2; i++) (*data)[i] = (uint8_t)rng_u32();
    *sc = li_xmalloc((size_t)(kc->m * ng) * sizeof(float));
    for (int64_t i = 0; i < kc->m * ng; i++) (*sc)[i] = (0.5f + (float)(rng_u32() % 1024) / 1024.0f) / 64.0f;
    *zp = NULL;
    if (kc->scheme != LI_SCHEME_INT4) {
        *zp = li_xmalloc((size_t)(kc->m * ng) * sizeof(float));
        for (int64_t i = 0; i < kc->m * ng; i++) (*zp)[i] = (float)(rng_u32() % 16);
    }
    *perm = NULL;
    if (kc->perm) {
        *perm = li_xmalloc((size_t)kc->k * sizeof(int32_t));
        for (int64_t j = 0; j < kc->k; j++) (*perm)[j] = (int32_t)j;
        for (int64_t j = kc->k - 1; j > 0; j--) {
            const int64_t r = (int64_t)(rng_u32() % (uint32_t)(j + 1));
            const int32_t t = (*perm)[j];
            (*perm)[j] = (*perm)[r];
            (*perm)[r] = t;
        }
    }
    *w = (li_weight){.type = LI_TYPE_U4, .k = kc->k, .m = kc->m, .row_bytes = (size_t)(kc->k / 2), .data = *data,
                     .name = "test", .scheme = kc->scheme, .act = kc->act, .group_size = kc->gs, .scales = *sc,
                     .zeros = *zp, .perm = *perm};
}

static void test_kernels(void) {
    const kcase cases[] = {
        {LI_SCHEME_AWQ, LI_ACT_F32, 576, 37, 64, false},   {LI_SCHEME_AWQ, LI_ACT_F32, 256, 45, 128, false},
        {LI_SCHEME_GPTQ, LI_ACT_F32, 384, 37, 128, true},  {LI_SCHEME_GPTQ, LI_ACT_F32, 192, 16, 64, true},
        {LI_SCHEME_INT4, LI_ACT_F32, 320, 21, 0, false},   {LI_SCHEME_INT4, LI_ACT_INT4, 256, 37, 0, false},
        {LI_SCHEME_AWQ, LI_ACT_F32, 130, 19, 26, false},   /* no SIMD A8: k, group not multiples of 64 */
        {LI_SCHEME_GPTQ, LI_ACT_F32, 200, 7, 64, true},    /* a partial last group */
        /* A8 panels of 16 rows: m not a multiple of 16, k a multiple of 8 but not of 64 */
        {LI_SCHEME_AWQ, LI_ACT_F32, 168, 53, 32, false},   {LI_SCHEME_INT4, LI_ACT_F32, 232, 67, 0, false},
        {LI_SCHEME_GPTQ, LI_ACT_F32, 392, 50, 128, true},  {LI_SCHEME_AWQ, LI_ACT_F32, 72, 33, 8, false},
        /* A8 groups inside the panel stream: a last group of one chunk, 5 full panels (4 + 1 at decode) */
        {LI_SCHEME_GPTQ, LI_ACT_F32, 328, 80, 64, true},
    };
    const int64_t ns[] = {1, 2, 3, 5, 17, 70};
    const char *isas[] = {"scalar", "avx2", "avx512", "amx"};
    li_backend ref_be = {.ops = li_backend_ref_ops()};
    for (size_t ci = 0; ci < LI_ARRAY_LEN(cases); ci++) {
        const kcase *kc = &cases[ci];
        rng_seed(100 + ci);
        li_weight w0;
        uint8_t *data;
        float *sc, *zp;
        int32_t *perm;
        make_weight(kc, &w0, &data, &sc, &zp, &perm);
        char what[128];
        snprintf(what, sizeof what, "%s act %s k=%lld m=%lld group %lld%s", li_scheme_name(kc->scheme),
                 li_act_quant_name(kc->act), (long long)kc->k, (long long)kc->m, (long long)kc->gs,
                 kc->perm ? " perm" : "");
        const int64_t nmax = 70, k = kc->k, m = kc->m;
        float *x = li_xmalloc((size_t)(nmax * k) * sizeof(float));
        for (int64_t i = 0; i < nmax * k; i++) x[i] = rng_f() * (i % 13 == 0 ? 8.0f : 1.0f);
        float *want = li_xmalloc((size_t)(nmax * m) * sizeof(float));
        float *got = li_xmalloc((size_t)(nmax * m) * sizeof(float));
        float *a8 = li_xmalloc((size_t)(nmax * m) * sizeof(float)), *one = li_xmalloc((size_t)m * sizeof(float));
        float *res = li_xmalloc((size_t)(nmax * m) * sizeof(float));
        float *res2 = li_xmalloc((size_t)(nmax * m) * sizeof(float));
        ref_be.ops->matmul(&ref_be, &w0, x, want, nmax);
        for (size_t b = 0; b < LI_ARRAY_LEN(isas); b++)
            for (int nt = 1; nt <= 2; nt++) {
                li_backend be;
                li_error err = {0};
                if (li_backend_cpu_init(&be, nt, isas[b], &err)) {
                    if (nt == 1 && ci == 0) printf("skip %s: %s\n", isas[b], err.msg);
                    continue;
                }
                li_weight w = w0;
                const int rc = be.ops->weight_prepare(&be, &w);
                bool a16 = rc == 0 && li_q4g_packed_of(&w), a16_add = a16;
                const bool simd = strcmp(li_backend_cpu_isa(&be), "scalar") != 0;
                /* the panels are built on first use: none at prepare, only the mode that ran after */
                bool lazy = a16 && !li_q4g_packed_of(&w)->codes && !li_q4g_packed_of(&w)->a8codes;
                for (size_t ni = 0; a16 && ni < LI_ARRAY_LEN(ns); ni++) {
                    be.ops->matmul(&be, &w, x, got, ns[ni]);
                    a16 = !memcmp(got, want, (size_t)(ns[ni] * m) * sizeof(float));
                }
                /* matmul_add: y and res += y, the bits of matmul then add */
                for (int64_t i = 0; i < nmax * m; i++) res[i] = res2[i] = rng_f();
                be.ops->matmul_add(&be, &w, x, got, res, nmax);
                for (int64_t i = 0; i < nmax * m; i++) res2[i] += want[i];
                a16_add = a16_add && !memcmp(got, want, (size_t)(nmax * m) * sizeof(float)) &&
                          !memcmp(res, res2, (size_t)(nmax * m) * sizeof(float));
                report(a16 && a16_add, "%s, %s x%d: A16 matmul and matmul_add = the reference's bits (n 1..70)",
                       what, li_backend_cpu_isa(&be), nt);
                lazy = lazy && (li_q4g_packed_of(&w)->codes != NULL) == simd && !li_q4g_packed_of(&w)->a8codes;
                if (kc->act == LI_ACT_F32 && rc == 0) {
                    li_backend_cpu_set_q4_act(&be, LI_ACT_INT8, &err);
                    be.ops->matmul(&be, &w, x, a8, nmax);
                    /* the definition, row by row */
                    const li_q4g_packed *p = li_q4g_packed_of(&w);
                    lazy = lazy && (p->a8codes != NULL) == (simd && p->a8_simd);
                    uint8_t *act = li_aligned_alloc(li_q4g_act_bytes(k, p->ng));
                    bool def = true, inv = true;
                    double num = 0.0, den = 0.0;
                    for (int64_t i = 0; i < nmax; i++) {
                        li_q4g_act_quantize(&w, p, x + i * k, act);
                        for (int64_t r = 0; r < m; r++) {
                            const float v = li_q4g_a8_row_ref(&w, p, r, act);
                            def &= !memcmp(&v, a8 + i * m + r, sizeof v);
                            num += (double)(v - want[i * m + r]) * (v - want[i * m + r]);
                            den += (double)want[i * m + r] * want[i * m + r];
                        }
                    }
                    for (int64_t i = 0; i < nmax; i += 7) { /* alone = in the batch */
                        be.ops->matmul(&be, &w, x + i * k, one, 1);
                        inv &= !memcmp(one, a8 + i * m, (size_t)m * sizeof(float));
                    }
                    static const int64_t small[] = {2, 3, 4, 5, 6, 7, 8, 13}; /* each kernel shape and row grouping */
                    for (size_t si = 0; si < LI_ARRAY_LEN(small); si++) {
                        be.ops->matmul(&be, &w, x, got, small[si]);
                        inv &= !memcmp(got, a8, (size_t)(small[si] * m) * sizeof(float));
                    }
                    li_aligned_free(act);
                    report(def && inv && num / den < 1e-3,
                           "%s, %s x%d: A8 = the definition's bits, batch-invariant (n 1..8, 13, 70), "
                           "NMSE vs A16 %.2g",
                           what,
                           li_backend_cpu_isa(&be), nt, num / den);
                    li_backend_cpu_set_q4_act(&be, LI_ACT_F32, &err);
                }
                report(rc != 0 || lazy, "%s, %s x%d: panels built on first use, only the mode's (A16 then A8)", what,
                       li_backend_cpu_isa(&be), nt);
                if (be.ops->weight_release) be.ops->weight_release(&be, &w);
                li_backend_cpu_free(&be);
            }
        free(x);
        free(want);
        free(got);
        free(a8);
        free(one);
        free(res);
        free(res2);
        free(data);
        free(sc);
        free(zp);
        free(perm);
    }
    li_backend be;
    li_error err = {0};
    if (!li_backend_cpu_init(&be, 1, NULL, &err)) {
        const int rc = li_backend_cpu_set_q4_act(&be, LI_ACT_FP8, &err);
        report(rc == LI_EINVAL && strstr(err.msg, "fp8"), "set_q4_act refuses fp8: \"%s\"", err.msg);
        li_backend_cpu_free(&be);
    }
}

/* The AVX2 A8 activation rows are the reference's bytes: odd lengths (the
 * scalar tail), a permutation (the gather), NaN and infinity, values on
 * rounding ties and past the clamp. */
/* matmul_multi on 4-bit weights with A8: one job for weights that share k,
 * group size and perm (q/k/v, gate/up), each output the bits of its own
 * matmul; a weight of another perm or group size falls back one by one. */
static void test_a8_multi(void) {
    const kcase sets[][3] = {
        {{LI_SCHEME_AWQ, LI_ACT_F32, 192, 37, 64, false},
         {LI_SCHEME_AWQ, LI_ACT_F32, 192, 16, 64, false},
         {LI_SCHEME_AWQ, LI_ACT_F32, 192, 70, 64, false}},
        {{LI_SCHEME_GPTQ, LI_ACT_F32, 256, 21, 128, true}, /* perms differ: one by one */
         {LI_SCHEME_GPTQ, LI_ACT_F32, 256, 33, 128, true},
         {LI_SCHEME_GPTQ, LI_ACT_F32, 256, 9, 128, true}},
        {{LI_SCHEME_AWQ, LI_ACT_F32, 256, 21, 64, false}, /* groups differ: one by one */
         {LI_SCHEME_AWQ, LI_ACT_F32, 256, 33, 32, false},
         {LI_SCHEME_AWQ, LI_ACT_F32, 256, 9, 64, false}},
    };
    const int64_t ns[] = {1, 5, 70};
    const char *isas[] = {"scalar", "avx2", "avx512", "amx"};
    for (size_t si = 0; si < LI_ARRAY_LEN(sets); si++) {
        li_weight w0[3];
        uint8_t *data[3];
        float *sc[3], *zp[3], *ym[3], *y1[3];
        int32_t *perm[3];
        const int64_t k = sets[si][0].k, nmax = 70;
        for (int i = 0; i < 3; i++) {
            rng_seed(500 + 10 * si + i);
            make_weight(&sets[si][i], &w0[i], &data[i], &sc[i], &zp[i], &perm[i]);
            ym[i] = li_xmalloc((size_t)(nmax * sets[si][i].m) * sizeof(float));
            y1[i] = li_xmalloc((size_t)(nmax * sets[si][i].m) * sizeof(float));
        }
        float *x = li_xmalloc((size_t)(nmax * k) * sizeof(float));
        for (int64_t i = 0; i < nmax * k; i++) x[i] = rng_f() * (i % 11 == 0 ? 6.0f : 1.0f);
        for (size_t b = 0; b < LI_ARRAY_LEN(isas); b++)
            for (int nt = 1; nt <= 2; nt++) {
                li_backend be;
                li_error err = {0};
                if (li_backend_cpu_init(&be, nt, isas[b], &err)) continue;
                li_weight w[3];
                const li_weight *wp[3] = {&w[0], &w[1], &w[2]};
                bool ok = true;
                for (int i = 0; i < 3; i++) {
                    w[i] = w0[i];
                    ok &= be.ops->weight_prepare(&be, &w[i]) == 0;
                }
                ok &= li_backend_cpu_set_q4_act(&be, LI_ACT_INT8, &err) == 0;
                for (size_t ni = 0; ok && ni < LI_ARRAY_LEN(ns); ni++) {
                    be.ops->matmul_multi(&be, wp, 3, x, ym, ns[ni]);
                    for (int i = 0; i < 3; i++) {
                        be.ops->matmul(&be, &w[i], x, y1[i], ns[ni]);
                        ok &= !memcmp(ym[i], y1[i], (size_t)(ns[ni] * w[i].m) * sizeof(float));
                    }
                }
                report(ok, "A8 matmul_multi, %s, %s x%d: each output = its matmul's bits (n 1, 5, 70)",
                       si == 0 ? "one job" : si == 1 ? "perms differ" : "groups differ", li_backend_cpu_isa(&be), nt);
                for (int i = 0; i < 3; i++)
                    if (be.ops->weight_release) be.ops->weight_release(&be, &w[i]);
                li_backend_cpu_free(&be);
            }
        free(x);
        for (int i = 0; i < 3; i++) {
            free(data[i]);
            free(sc[i]);
            free(zp[i]);
            free(perm[i]);
            free(ym[i]);
            free(y1[i]);
        }
    }
}

static void test_act_quantize(void) {
    if (!__builtin_cpu_supports("avx2")) {
        printf("SKIP: A8 activation rows on AVX2: this CPU has no AVX2\n");
        return;
    }
    const int64_t ks[] = {8, 24, 37, 64, 70, 576};
    bool ok = true;
    for (size_t a = 0; a < LI_ARRAY_LEN(ks); a++)
        for (int variant = 0; variant < 4; variant++) {
            const int64_t k = ks[a], gs = k % 8 ? k : 8;
            float *x = malloc((size_t)k * sizeof *x);
            int32_t *perm = malloc((size_t)k * sizeof *perm);
            for (int64_t j = 0; j < k; j++) {
                x[j] = rng_f() * 3.0f;
                perm[j] = (int32_t)j;
            }
            for (int64_t j = k - 1; j > 0; j--) { /* a shuffle */
                const int64_t i = (int64_t)((rng_f() * 0.5f + 0.5f) * (float)j) % (j + 1);
                const int32_t t = perm[i];
                perm[i] = perm[j];
                perm[j] = t;
            }
            x[0] = 2.54f; /* amax: 2.54 / 127 = 0.02, so multiples of 0.01 fall on ties */
            for (int64_t j = 1; j < k; j += 5) x[j] = 0.01f * (float)(j % 50) - 0.25f;
            if (variant == 2) x[k / 2] = NAN;
            if (variant == 3) x[k - 1] = INFINITY;
            li_weight w = {.k = k, .perm = variant % 2 ? perm : NULL};
            li_q4g_packed p = {.k = k, .gs = gs, .ng = (k + gs - 1) / gs};
            const size_t nb = li_q4g_act_bytes(k, p.ng);
            uint8_t *r = li_aligned_alloc(nb), *v = li_aligned_alloc(nb);
            memset(r, 0xa5, nb);
            memset(v, 0xa5, nb);
            li_q4g_act_quantize(&w, &p, x, r);
            li_q4g_act_quantize_avx2(&w, &p, x, v);
            if (memcmp(r, v, nb)) {
                ok = false;
                fprintf(stderr, "    act row k %lld variant %d differs\n", (long long)k, variant);
            }
            li_aligned_free(r);
            li_aligned_free(v);
            free(x);
            free(perm);
        }
    report(ok, "A8 activation rows: AVX2 = the reference's bytes (k 8..576, odd tails, perm, NaN, inf, ties)");
}

/* ------------------------------------------------------------------------
 * the factorizations under GPTQ and OBS against their plain loops
 * ---------------------------------------------------------------------- */

/* a = L L^T, element (i, m) subtracting l[i][j] l[m][j] for j increasing,
 * then the root or the division: the order gptq.c's blocked loops keep */
static bool chol_ref(double *a, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t m = 0; m <= i; m++) {
            double x = a[i * n + m];
            for (int64_t j = 0; j < m; j++) x -= a[i * n + j] * a[m * n + j];
            if (m == i) {
                if (!(x > 0.0)) return false;
                a[i * n + i] = sqrt(x);
            } else {
                a[i * n + m] = x / a[m * n + m];
            }
        }
    for (int64_t i = 0; i < n; i++)
        for (int64_t m = i + 1; m < n; m++) a[i * n + m] = 0.0;
    return true;
}

/* a^-1 = L^-T L^-1: forward substitution row by row (element j's terms k
 * increasing from j), then the sum over k of x_k^T x_k, k increasing */
static void spd_inverse_ref(double *a, int64_t n) {
    chol_ref(a, n);
    double *x = calloc((size_t)(n * n), sizeof *x), *inv = calloc((size_t)(n * n), sizeof *inv);
    for (int64_t i = 0; i < n; i++) {
        x[i * n + i] = 1.0;
        for (int64_t k = 0; k < i; k++)
            for (int64_t j = 0; j <= k; j++) x[i * n + j] -= a[i * n + k] * x[k * n + j];
        for (int64_t j = 0; j <= i; j++) x[i * n + j] = x[i * n + j] / a[i * n + i];
    }
    for (int64_t k = 0; k < n; k++)
        for (int64_t i = 0; i <= k; i++)
            for (int64_t j = 0; j <= i; j++) inv[i * n + j] += x[k * n + i] * x[k * n + j];
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j <= i; j++) a[i * n + j] = a[j * n + i] = inv[i * n + j];
    free(x), free(inv);
}

static void test_factorizations(void) {
    const int64_t sizes[] = {1, 3, 4, 7, 15, 16, 17, 33, 47, 100};
    bool chol_ok = true, inv_ok = true, refused = true;
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        const int64_t n = sizes[s], rows = 2 * n + 3;
        double *x = malloc((size_t)(rows * n) * sizeof *x), *h = calloc((size_t)(n * n), sizeof *h);
        double *a = malloc((size_t)(n * n) * sizeof *a), *b = malloc((size_t)(n * n) * sizeof *b);
        for (int64_t i = 0; i < rows * n; i++) x[i] = randn();
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < n; j++) h[i * n + j] += x[r * n + i] * x[r * n + j];
        for (int64_t i = 0; i < n; i++) h[i * n + i] += 0.01;
        memcpy(a, h, (size_t)(n * n) * sizeof *a), memcpy(b, h, (size_t)(n * n) * sizeof *b);
        chol_ok &= li_q4_cholesky(a, n) == 0 && chol_ref(b, n) && !memcmp(a, b, (size_t)(n * n) * sizeof *a);
        memcpy(a, h, (size_t)(n * n) * sizeof *a), memcpy(b, h, (size_t)(n * n) * sizeof *b);
        inv_ok &= li_q4_spd_inverse(a, n) == 0 && !memcmp(a, (spd_inverse_ref(b, n), b), (size_t)(n * n) * sizeof *a);
        if (n > 2) { /* indefinite: a negative pivot in the last panel */
            memcpy(a, h, (size_t)(n * n) * sizeof *a);
            a[(n - 1) * n + n - 1] = -1.0;
            refused &= li_q4_cholesky(a, n) == -1 && (memcpy(a, h, (size_t)(n * n) * sizeof *a),
                                                     a[(n - 1) * n + n - 1] = -1.0, li_q4_spd_inverse(a, n) == -1);
        }
        free(x), free(h), free(a), free(b);
    }
    report(chol_ok, "cholesky (16-column panels) = the plain loop's bits, n 1..100 across the panel edges");
    report(inv_ok, "spd inverse (16-row blocks, 8-column register tiles) = the plain loops' bits, n 1..100");
    report(refused, "an indefinite matrix is refused by both");
}

int main(void) {
    test_quantizer_errors();
    test_quantizers();
    test_kernels();
    test_a8_multi();
    test_act_quantize();
    test_factorizations();
    return t_summary("test_quant4");
}
