/* test_cuda_ops.c — every op of the CUDA backend (kernels/cuda/backend_cuda.cu)
 * against the scalar reference (li_backend_ref_ops), then the real model
 * on CUDA against the CPU backend.
 *
 * Skips, saying why (exit 77), in a build without CUDA or on a machine
 * without a device. Sizes are odd on purpose: k = 67 (float and 8-bit
 * codes), 160 (32-element blocks), 68 (4-bit codes, a partial last group),
 * m = 131 rows (144 where the tensor cores' shapes need multiples of 16),
 * n in {1, 3, 8, 17, 70} activation rows (8 is the GEMV's largest batch;
 * above it q4_0 / q4_1 / q8_0 take k_mmq, whose activation tiles are 64
 * rows, the rest cuBLASLt or cuBLAS), head_dim 64 with 9 query heads
 * over 3 kv heads, block size 16 and block tables with holes.
 *
 * Thresholds, as ggml's test-backend-ops states them (normalized mean
 * squared error, sum (got - want)^2 / sum want^2):
 *   exact W8A8 above 8 rows with k a multiple of 16 (the int8 tensor cores'
 *         integer sums, then the CPU's epilogue: the reference's bits)
 *   5e-4  matmul, matmul_add and attention (its mul_mat and flash_attn_ext
 *         bound: the reference multiplies Q8 activations with integer
 *         sums; the GPU rounds the activations as those Q8 blocks do, then
 *         sums in f32 in its own order: 1e-7 measured on an H100)
 *   1e-7  every other op (its default): get_rows, rmsnorm, rope, silu_mul, add
 *   exact argmax's ids (the sampler's greedy rule: ties, NaN, infinities),
 *         topk's values and ids (a host sort)
 *   1e-6  lse, relative (the sampler's formula, the double sum in the
 *         device's order: the same float but for a rare last-bit rounding)
 *   exact the KV store's bytes (the conversions are the reference's bits,
 *         cuda_math.h, checked on the CPU by test_cuda_math)
 *
 * Whole model (models/, skipped without it): 32 greedy tokens on CUDA and
 * on the CPU backend, printing how many agree and the first divergence
 * with the CPU's logit gap between the two tokens (a divergence must be a
 * near tie: gap < 0.5), the prompt logits' NMSE, and the perplexity of
 * the start of tests/data/alice29.txt (about 480 tokens) on both (within
 * 0.5%). Then recorded passes (CUDA graphs) against the same decode
 * steps op by op: bit for bit up to 8 rows.
 *
 *   test_cuda_ops                the checks
 *   test_cuda_ops --bench        also decode steps at batch 1, 8, 64, 256 on CUDA,
 *                                op by op and as recorded passes (tokens/s and ms
 *                                per step), and a per-kernel profile
 *                                (tools/device_check.sh)
 *   test_cuda_ops --only bench [--model FILE]
 *                                the benchmarks alone (prefill 512 tokens, then
 *                                decode), on FILE (default: the default model)
 *   test_cuda_ops --only GROUP   one group: weights, rowops, attention or model
 *                                (device_check.sh runs each in its own process,
 *                                so an op that aborts hides nothing else) */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "util/common.h"
#include "cuda/cuda_backend.h"
#include "engine/engine.h"
#include "engine/session.h"
#include "sample/sampler.h"
#include "kv/kv_cache.h"
#include "model/forward.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "test_util.h"
#include "test_weight.h"

#include <string.h>

static li_backend cu, ref;

/* a device buffer holding n bytes of src (zeros when src is NULL) */
static li_buffer up(const void *src, size_t n) {
    li_buffer b;
    li_error err = {0};
    if (li_buffer_alloc(&cu, n, &b, &err)) {
        fprintf(stderr, "FAIL buffer_alloc %zu: %s\n", n, err.msg);
        exit(1);
    }
    if (src) cu.ops->buffer_set(&cu, &b, 0, src, n);
    return b;
}

static void down(li_buffer *b, void *dst, size_t n) {
    cu.ops->buffer_get(&cu, b, 0, dst, n);
}

static float *frand(int64_t n, float scale) {
    float *x = li_xmalloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = rng_f() * scale;
    return x;
}

static void fill_rand(float *row, int64_t k) {
    for (int64_t j = 0; j < k; j++) row[j] = rng_f();
}

/* ------------------------------------------------------------------------
 * matmul, matmul_add, get_rows
 * ---------------------------------------------------------------------- */

static void check_weight(test_weight *tw, const char *what) {
    const li_weight *w = &tw->w;
    const int64_t k = w->k, m = w->m;
    li_weight wc = *w;
    wc.packed = NULL;
    const int rc = cu.ops->weight_prepare(&cu, &wc);
    report(rc == 0, "%s: weight_prepare (%d)", what, rc);
    if (rc) return;
    const int64_t ns[] = {1, 3, 8, 17, 70}; /* 70: k_mmq's two activation tiles, the second partial */
    /* the GGUF block types above 8 rows both ways: k_mmq, then the f16 copy through cuBLASLt */
    const bool blocks = w->scheme == LI_SCHEME_PLAIN &&
                        (w->type == LI_TYPE_Q4_0 || w->type == LI_TYPE_Q4_1 || w->type == LI_TYPE_Q8_0);
    for (size_t t = 0; t < LI_ARRAY_LEN(ns) + (blocks ? 2 : 0); t++) {
        const int64_t n = ns[t < LI_ARRAY_LEN(ns) ? t : t - 2];
        const bool f16 = t >= LI_ARRAY_LEN(ns);
        li_backend_cuda_set_mmq(&cu, !f16);
        float *x = frand(n * k, 1.0f), *want = frand(n * m, 0), *got = frand(n * m, 0);
        ref.ops->matmul(&ref, w, x, want, n);
        li_buffer bx = up(x, (size_t)(n * k) * 4), by = up(NULL, (size_t)(n * m) * 4);
        cu.ops->matmul(&cu, &wc, bx.data, by.data, n);
        down(&by, got, (size_t)(n * m) * 4);
        const double e = nmse(got, want, n * m);
        report(e < 5e-4, "%s matmul m=%lld k=%lld n=%lld (%s): nmse %.2e < 5e-4", what, (long long)m, (long long)k,
               (long long)n, n <= 8 ? "gemv" : !blocks ? "gemm" : f16 ? "f16 copy" : "k_mmq", e);
        /* W8A8 on the int8 tensor cores: the integer sums and the CPU's
         * epilogue, so the reference's bits (k = 67 and m = 131 are not
         * multiples of 16: that weight stays on the SGEMM path, and only its
         * NMSE counts) */
        if (n > 8 && w->scheme == LI_SCHEME_W8A8 && k % 16 == 0 && m % 16 == 0) {
            const char *note = li_backend_cuda_lt_note(&cu);
            report(!*note && !memcmp(got, want, (size_t)(n * m) * 4),
                   "%s matmul n=%lld on the int8 tensor cores: the reference's bits%s%s", what, (long long)n,
                   *note ? ": " : "", note);
        }
        /* matmul_add: y and res += y */
        float *res = frand(n * m, 1.0f);
        li_buffer br = up(res, (size_t)(n * m) * 4);
        for (int64_t i = 0; i < n * m; i++) res[i] += want[i];
        cu.ops->matmul_add(&cu, &wc, bx.data, by.data, br.data, n);
        down(&br, got, (size_t)(n * m) * 4);
        const double ea = nmse(got, res, n * m);
        report(ea < 5e-4, "%s matmul_add n=%lld%s: nmse %.2e < 5e-4", what, (long long)n, f16 ? " (f16 copy)" : "",
               ea);
        li_backend_cuda_set_mmq(&cu, true);
        li_buffer_free(&cu, &bx);
        li_buffer_free(&cu, &by);
        li_buffer_free(&cu, &br);
        free(x);
        free(want);
        free(got);
        free(res);
    }
    /* get_rows, repeats and the last row included */
    const int32_t ids[] = {(int32_t)m - 1, 0, 3, 0, (int32_t)(m / 2)};
    const int64_t n = LI_ARRAY_LEN(ids);
    float *want = frand(n * k, 0), *got = frand(n * k, 0);
    ref.ops->get_rows(&ref, w, ids, n, want);
    li_buffer bi = up(ids, sizeof ids), bo = up(NULL, (size_t)(n * k) * 4);
    cu.ops->get_rows(&cu, &wc, bi.data, n, bo.data);
    down(&bo, got, (size_t)(n * k) * 4);
    const double e = nmse(got, want, n * k);
    report(e < 1e-7, "%s get_rows: nmse %.2e < 1e-7", what, e);
    li_buffer_free(&cu, &bi);
    li_buffer_free(&cu, &bo);
    free(want);
    free(got);
    cu.ops->weight_release(&cu, &wc);
}

/* matmul_multi: weights reading one input, each output against the
 * reference's matmul. One type (one GEMV launch for all), two types that
 * read the same q8 activations (quantized once), and a float weight beside
 * a q4_1 one (each its own input). */
static void test_multi(void) {
    const struct { li_type t[3]; int64_t m[3]; const char *what; } sets[] = {
        {{LI_TYPE_Q4_1, LI_TYPE_Q4_1, LI_TYPE_Q4_1}, {131, 45, 93}, "q4_1 x3 (one launch)"},
        {{LI_TYPE_Q4_1, LI_TYPE_Q8_0, LI_TYPE_Q4_0}, {67, 131, 33}, "q4_1+q8_0+q4_0 (one q8 input)"},
        {{LI_TYPE_F16, LI_TYPE_Q4_1, LI_TYPE_F32}, {51, 131, 9}, "f16+q4_1+f32 (inputs of their own)"},
    };
    const int64_t k = 160;
    for (size_t si = 0; si < LI_ARRAY_LEN(sets); si++) {
        test_weight tw[3];
        li_weight wc[3];
        const li_weight *wp[3];
        for (int i = 0; i < 3; i++) {
            test_weight_make(&tw[i], sets[si].t[i], k, sets[si].m[i], fill_rand);
            wc[i] = tw[i].w;
            wc[i].packed = NULL;
            report(cu.ops->weight_prepare(&cu, &wc[i]) == 0, "multi: prepare %s", li_type_name(sets[si].t[i]));
            wp[i] = &wc[i];
        }
        const int64_t ns[] = {1, 5, 8, 17};
        for (size_t t = 0; t < LI_ARRAY_LEN(ns); t++) {
            const int64_t n = ns[t];
            float *x = frand(n * k, 1.0f);
            li_buffer bx = up(x, (size_t)(n * k) * 4), by[3];
            float *yd[3];
            for (int i = 0; i < 3; i++) {
                by[i] = up(NULL, (size_t)(n * sets[si].m[i]) * 4);
                yd[i] = by[i].data;
            }
            cu.ops->matmul_multi(&cu, wp, 3, bx.data, yd, n);
            double worst = 0;
            for (int i = 0; i < 3; i++) {
                const int64_t m = sets[si].m[i];
                float *want = frand(n * m, 0), *got = frand(n * m, 0);
                ref.ops->matmul(&ref, &tw[i].w, x, want, n);
                down(&by[i], got, (size_t)(n * m) * 4);
                const double e = nmse(got, want, n * m);
                worst = e > worst ? e : worst;
                free(want);
                free(got);
                li_buffer_free(&cu, &by[i]);
            }
            report(worst < 5e-4, "matmul_multi %s n=%lld: worst nmse %.2e < 5e-4", sets[si].what, (long long)n, worst);
            li_buffer_free(&cu, &bx);
            free(x);
        }
        for (int i = 0; i < 3; i++) {
            cu.ops->weight_release(&cu, &wc[i]);
            test_weight_free(&tw[i]);
        }
    }
}

/* norm_matmul: rmsnorm inside the GEMV (q4_0 / q4_1 / q8_0 of one type, up
 * to 8 rows), with and without swiglu, against the reference's rmsnorm,
 * matmul of each weight and silu_mul; 17 rows and an f16 weight take the
 * ops apart on the device (the same bound) */
static void test_norm_matmul(void) {
    const struct { li_type t[3]; int64_t m[3]; int n_w; bool swiglu; const char *what; } sets[] = {
        {{LI_TYPE_Q4_1, LI_TYPE_Q4_1, LI_TYPE_Q4_1}, {131, 45, 45}, 3, false, "q4_1 x3 (q/k/v)"},
        {{LI_TYPE_Q4_0, LI_TYPE_Q4_0}, {99, 99}, 2, true, "q4_0 gate/up, swiglu"},
        {{LI_TYPE_Q8_0, LI_TYPE_Q8_0}, {67, 67}, 2, true, "q8_0 gate/up, swiglu"},
        {{LI_TYPE_Q4_1, LI_TYPE_Q4_1}, {131, 131}, 2, true, "q4_1 gate/up, swiglu"},
        {{LI_TYPE_F16, LI_TYPE_F16}, {51, 51}, 2, true, "f16 gate/up, swiglu (the ops apart)"},
    };
    const int64_t k = 160, ns[] = {1, 5, 8, 17};
    const float eps = 1e-5f;
    for (size_t si = 0; si < LI_ARRAY_LEN(sets); si++) {
        const int n_w = sets[si].n_w;
        test_weight tw[3];
        li_weight wc[3];
        const li_weight *wp[3];
        for (int i = 0; i < n_w; i++) {
            test_weight_make(&tw[i], sets[si].t[i], k, sets[si].m[i], fill_rand);
            wc[i] = tw[i].w;
            wc[i].packed = NULL;
            report(cu.ops->weight_prepare(&cu, &wc[i]) == 0, "norm_matmul: prepare %s", li_type_name(sets[si].t[i]));
            wp[i] = &wc[i];
        }
        float *nw = frand(k, 1.0f);
        for (int64_t j = 0; j < k; j++) nw[j] += 1.5f;
        for (size_t t = 0; t < LI_ARRAY_LEN(ns); t++) {
            const int64_t n = ns[t];
            float *x = frand(n * k, 3.0f), *h = frand(n * k, 0);
            ref.ops->rmsnorm(&ref, x, nw, h, n, k, eps);
            li_buffer bx = up(x, (size_t)(n * k) * 4), bh = up(NULL, (size_t)(n * k) * 4), by[3];
            float *yd[3];
            for (int i = 0; i < n_w; i++) {
                by[i] = up(NULL, (size_t)(n * sets[si].m[i]) * 4);
                yd[i] = by[i].data;
            }
            cu.ops->norm_matmul(&cu, bx.data, nw, eps, bh.data, wp, n_w, yd, n, sets[si].swiglu);
            float *want[3] = {0};
            for (int i = 0; i < n_w; i++) {
                want[i] = frand(n * sets[si].m[i], 0);
                ref.ops->matmul(&ref, &tw[i].w, h, want[i], n);
            }
            if (sets[si].swiglu) ref.ops->silu_mul(&ref, want[0], want[1], n, sets[si].m[0]);
            double worst = 0;
            for (int i = 0; i < (sets[si].swiglu ? 1 : n_w); i++) {
                const int64_t m = sets[si].m[i];
                float *got = frand(n * m, 0);
                down(&by[i], got, (size_t)(n * m) * 4);
                const double e = nmse(got, want[i], n * m);
                worst = e > worst || e != e ? e : worst;
                free(got);
            }
            report(worst < 5e-4, "norm_matmul %s n=%lld: worst nmse %.2e < 5e-4", sets[si].what, (long long)n, worst);
            for (int i = 0; i < n_w; i++) {
                li_buffer_free(&cu, &by[i]);
                free(want[i]);
            }
            li_buffer_free(&cu, &bx);
            li_buffer_free(&cu, &bh);
            free(x);
            free(h);
        }
        for (int i = 0; i < n_w; i++) {
            cu.ops->weight_release(&cu, &wc[i]);
            test_weight_free(&tw[i]);
        }
        free(nw);
    }
}

static void test_weights(void) {
    /* m = 131: the SGEMM path above 8 rows; m = 144 (and k in 16-byte
     * multiples): the tensor cores (cuBLASLt), the q4/q8 types dequantized
     * to f16 for them */
    const struct { li_type t; int64_t k, m; } plain[] = {
        {LI_TYPE_F32, 67, 131}, {LI_TYPE_F16, 67, 131}, {LI_TYPE_BF16, 67, 131},
        {LI_TYPE_F16, 160, 144}, {LI_TYPE_BF16, 160, 144},
        {LI_TYPE_Q8_0, 160, 131}, {LI_TYPE_Q4_0, 160, 131}, {LI_TYPE_Q4_1, 160, 131},
        {LI_TYPE_Q8_0, 160, 144}, {LI_TYPE_Q4_1, 160, 144},
    };
    for (size_t i = 0; i < LI_ARRAY_LEN(plain); i++) {
        test_weight tw;
        test_weight_make(&tw, plain[i].t, plain[i].k, plain[i].m, fill_rand);
        check_weight(&tw, li_type_name(plain[i].t));
        test_weight_free(&tw);
    }
    const struct { li_scheme s; int64_t k, m, gs; bool zeros, perm; } sch[] = {
        {LI_SCHEME_W8A8, 67, 131, 0, false, false}, {LI_SCHEME_FP8, 67, 131, 0, false, false},
        /* above 8 rows on the tensor cores (cuBLASLt int8, fp8; the 4-bit ones dequantized to f16) */
        {LI_SCHEME_W8A8, 160, 144, 0, false, false}, {LI_SCHEME_FP8, 160, 144, 0, false, false},
        {LI_SCHEME_AWQ, 68, 131, 32, true, false},  {LI_SCHEME_GPTQ, 68, 131, 32, true, true},
        {LI_SCHEME_INT4, 68, 131, 0, false, false}, {LI_SCHEME_GPTQ, 160, 144, 32, true, true},
    };
    for (size_t i = 0; i < LI_ARRAY_LEN(sch); i++) {
        test_weight tw;
        test_weight_scheme(&tw, sch[i].s, sch[i].k, sch[i].m, sch[i].gs, sch[i].zeros, sch[i].perm, rng_u32);
        char what[64];
        snprintf(what, sizeof what, "%s%s", li_scheme_name(sch[i].s), sch[i].perm ? "+perm" : "");
        check_weight(&tw, what);
        test_weight_free(&tw);
    }
    test_multi();
    test_norm_matmul();
    /* a GGUF type without a kernel: refused at prepare, never run */
    li_weight q5 = {.type = LI_TYPE_Q5_0, .k = 64, .m = 2};
    li_type_row_size(LI_TYPE_Q5_0, 64, &q5.row_bytes);
    report(cu.ops->weight_prepare(&cu, &q5) == LI_EUNSUP && !q5.packed, "q5_0 weights: LI_EUNSUP at weight_prepare");
}

/* ------------------------------------------------------------------------
 * rmsnorm, rope, silu_mul, add, argmax, topk
 * ---------------------------------------------------------------------- */

static void test_rowops(void) {
    {
        enum { N = 3, DIM = 131 };
        float *x = frand(N * DIM, 3.0f), *w = frand(DIM, 1.0f), want[N * DIM], got[N * DIM];
        ref.ops->rmsnorm(&ref, x, w, want, N, DIM, 1e-5f);
        li_buffer bx = up(x, sizeof want), bw = up(w, DIM * 4), by = up(NULL, sizeof got);
        cu.ops->rmsnorm(&cu, bx.data, bw.data, by.data, N, DIM, 1e-5f);
        down(&by, got, sizeof got);
        double e = nmse(got, want, N * DIM);
        report(e < 1e-7, "rmsnorm n=%d dim=%d (device weight): nmse %.2e < 1e-7", N, DIM, e);
        /* the model's norm weights are host memory: the backend's copy of
         * them, and a changed host array noticed */
        cu.ops->rmsnorm(&cu, bx.data, w, by.data, N, DIM, 1e-5f);
        down(&by, got, sizeof got);
        e = nmse(got, want, N * DIM);
        report(e < 1e-7, "rmsnorm (host weight): nmse %.2e < 1e-7", e);
        for (int j = 0; j < DIM; j++) w[j] *= -0.5f;
        ref.ops->rmsnorm(&ref, x, w, want, N, DIM, 1e-5f);
        cu.ops->rmsnorm(&cu, bx.data, w, by.data, N, DIM, 1e-5f);
        down(&by, got, sizeof got);
        e = nmse(got, want, N * DIM);
        report(e < 1e-7, "rmsnorm (host weight changed in place): nmse %.2e < 1e-7", e);
        li_buffer_free(&cu, &bx);
        li_buffer_free(&cu, &bw);
        li_buffer_free(&cu, &by);
        free(x);
        free(w);
    }
    for (int neox = 0; neox < 2; neox++)
        for (int n_rot = 32; n_rot <= 64; n_rot += 32) {
            enum { N = 5, H = 9, D = 64 };
            const int32_t pos[N] = {0, 1, 37, 511, 8191};
            float *x = frand(N * H * D, 1.0f), got[N * H * D];
            li_buffer bx = up(x, sizeof got), bp = up(pos, sizeof pos);
            ref.ops->rope(&ref, x, pos, N, H, D, n_rot, 10000.0f, neox);
            cu.ops->rope(&cu, bx.data, bp.data, N, H, D, n_rot, 10000.0f, neox);
            down(&bx, got, sizeof got);
            const double e = nmse(got, x, N * H * D);
            report(e < 1e-7, "rope %s n_rot=%d heads=%d: nmse %.2e < 1e-7", neox ? "neox" : "adjacent", n_rot, H, e);
            li_buffer_free(&cu, &bx);
            li_buffer_free(&cu, &bp);
            free(x);
        }
    /* rope_qk: q's and k's heads in one launch, the bits of rope on each */
    for (int neox = 0; neox < 2; neox++) {
        enum { N = 5, HQ = 9, HK = 3, D = 64 };
        const int32_t pos[N] = {0, 3, 77, 1023, 4097};
        float *q = frand(N * HQ * D, 1.0f), *k = frand(N * HK * D, 1.0f), gq[N * HQ * D], gk[N * HK * D];
        li_buffer bq = up(q, sizeof gq), bk = up(k, sizeof gk), bp = up(pos, sizeof pos);
        cu.ops->rope(&cu, bq.data, bp.data, N, HQ, D, D, 10000.0f, neox); /* the two ops, on the device */
        cu.ops->rope(&cu, bk.data, bp.data, N, HK, D, D, 10000.0f, neox);
        down(&bq, gq, sizeof gq);
        down(&bk, gk, sizeof gk);
        li_buffer_free(&cu, &bq);
        li_buffer_free(&cu, &bk);
        bq = up(q, sizeof gq);
        bk = up(k, sizeof gk);
        cu.ops->rope_qk(&cu, bq.data, bk.data, bp.data, N, HQ, HK, D, D, 10000.0f, neox);
        float fq[N * HQ * D], fk[N * HK * D];
        down(&bq, fq, sizeof fq);
        down(&bk, fk, sizeof fk);
        report(!memcmp(fq, gq, sizeof fq) && !memcmp(fk, gk, sizeof fk), "rope_qk %s: the bits of rope on q and on k",
               neox ? "neox" : "adjacent");
        li_buffer_free(&cu, &bq);
        li_buffer_free(&cu, &bk);
        li_buffer_free(&cu, &bp);
        free(q);
        free(k);
    }
    {
        enum { N = 3, DIM = 131 };
        float *g = frand(N * DIM, 4.0f), *u = frand(N * DIM, 1.0f), got[N * DIM];
        li_buffer bg = up(g, sizeof got), bu = up(u, sizeof got);
        ref.ops->silu_mul(&ref, g, u, N, DIM);
        cu.ops->silu_mul(&cu, bg.data, bu.data, N, DIM);
        down(&bg, got, sizeof got);
        double e = nmse(got, g, N * DIM);
        report(e < 1e-7, "silu_mul n=%d dim=%d: nmse %.2e < 1e-7", N, DIM, e);
        ref.ops->add(&ref, g, u, N * DIM);
        cu.ops->add(&cu, bg.data, bu.data, N * DIM);
        down(&bg, got, sizeof got);
        e = nmse(got, g, N * DIM);
        report(e < 1e-7, "add n=%d: nmse %.2e < 1e-7", N * DIM, e);
        li_buffer_free(&cu, &bg);
        li_buffer_free(&cu, &bu);
        free(g);
        free(u);
    }
    /* argmax: the sampler's greedy id of every row, exactly (ties to the
     * lowest id, NaN never wins); a vocabulary-sized row and a short one */
    for (int64_t dim = 3; dim <= 49157; dim += 49154) {
        enum { N = 7 };
        float *x = frand(N * dim, 4.0f);
        x[0 * dim + dim - 1] = x[0 * dim + dim / 2] = 50.0f;      /* a tie: the lower id */
        x[1 * dim + 0] = NAN;                                      /* a NaN first */
        x[1 * dim + dim - 1] = 60.0f;
        for (int64_t j = 0; j < dim; j++) x[2 * dim + j] = NAN;   /* no number: 0 */
        for (int64_t j = 0; j < dim; j++) x[3 * dim + j] = j % 2 ? -INFINITY : NAN; /* -inf beats NaN: id 1 */
        x[4 * dim + dim - 1] = INFINITY;
        for (int64_t j = 0; j < dim; j++) x[5 * dim + j] = 1.0f;  /* all equal: 0 */
        li_sampling_params sp;
        li_sampling_params_default(&sp);
        sp.temperature = 0;
        li_sampler smp;
        li_error err = {0};
        int32_t want[N], got[N];
        li_sampler_init(&smp, &sp, (int32_t)dim, &err);
        for (int i = 0; i < N; i++) want[i] = li_sampler_sample(&smp, x + (size_t)i * dim, NULL, NULL);
        li_sampler_free(&smp);
        li_buffer bx = up(x, (size_t)(N * dim) * 4), bo = up(NULL, sizeof got);
        cu.ops->argmax(&cu, bx.data, N, dim, bo.data);
        down(&bo, got, sizeof got);
        report(!memcmp(got, want, sizeof got), "argmax n=%d dim=%lld (ties, NaN, -inf, +inf): the sampler's ids", N,
               (long long)dim);
        li_buffer_free(&cu, &bx);
        li_buffer_free(&cu, &bo);
        free(x);
    }
    /* topk: each row's k largest, sorted by value then id, against a full
     * sort on the host: random rows, rows on a coarse grid (ties across
     * the boundary), -0 beside +0, a NaN row (flagged), a short row */
    {
        const int64_t dims[] = {49157, 70};
        const int ks[] = {1, 41, 64};
        for (size_t di = 0; di < LI_ARRAY_LEN(dims); di++)
            for (size_t ki = 0; ki < LI_ARRAY_LEN(ks); ki++) {
                enum { N = 5 };
                const int64_t dim = dims[di];
                const int k = ks[ki];
                float *x = frand(N * dim, 4.0f);
                for (int64_t j = 0; j < dim; j++) {
                    x[1 * dim + j] = (float)((j * 7919) % 13) * 0.5f;      /* ties everywhere */
                    x[3 * dim + j] = j % 3 ? 0.0f : -0.0f;                  /* all zero, signs mixed */
                }
                x[2 * dim + dim / 3] = NAN;
                float *wv = li_xmalloc((size_t)N * k * 4), *gv = li_xmalloc((size_t)N * k * 4);
                int32_t *wi = li_xmalloc((size_t)N * k * 4), *gi = li_xmalloc((size_t)N * k * 4);
                t_topk_ref(x, N, dim, k, wv, wi);
                li_buffer bx = up(x, (size_t)(N * dim) * 4), bv = up(NULL, (size_t)N * k * 4),
                          bi = up(NULL, (size_t)N * k * 4);
                cu.ops->topk(&cu, bx.data, N, dim, k, bv.data, bi.data);
                down(&bv, gv, (size_t)N * k * 4);
                down(&bi, gi, (size_t)N * k * 4);
                bool same = true;
                for (int i = 0; i < N; i++) {
                    if (i == 2) { /* the NaN row: flagged, nothing else asked */
                        same &= gi[i * k] == -1;
                        continue;
                    }
                    for (int j = 0; j < k; j++)
                        same &= gi[i * k + j] == wi[i * k + j] && gv[i * k + j] == wv[i * k + j];
                }
                report(same, "topk k=%d of %lld (ties, -0/+0, a NaN row): the host sort's ids and values", k,
                       (long long)dim);
                li_buffer_free(&cu, &bx);
                li_buffer_free(&cu, &bv);
                li_buffer_free(&cu, &bi);
                free(x);
                free(wv);
                free(gv);
                free(wi);
                free(gi);
            }
    }
    /* lse: each row's log-sum-exp against the sampler's (the same formula,
     * the device's order of the double sum): within 1e-6, and how many
     * rows land on the same float; then at a scale a row (1/T) */
    {
        enum { N = 33 };
        const int64_t dim = 49157;
        float *x = frand(N * dim, 8.0f), got[N], sc[N];
        for (int i = 0; i < N; i++) sc[i] = 1.0f / (0.2f + 0.1f * (float)i);
        li_buffer bx = up(x, (size_t)(N * dim) * 4), bo = up(NULL, sizeof got), bs = up(sc, sizeof sc);
        for (int pass = 0; pass < 2; pass++) {
            cu.ops->lse(&cu, bx.data, N, dim, pass ? bs.data : NULL, bo.data);
            down(&bo, got, sizeof got);
            int same = 0;
            double worst = 0;
            for (int i = 0; i < N; i++) {
                const float want = li_sampler_lse_scaled(x + (size_t)i * dim, (int32_t)dim, pass ? sc[i] : 1.0);
                same += got[i] == want;
                const double d = fabs((double)got[i] - want) / fmax(1.0, fabs(want));
                worst = d > worst ? d : worst;
            }
            report(worst < 1e-6, "lse of %d rows of %lld%s: %d the sampler's float exactly, worst relative "
                   "difference %.2e", N, (long long)dim, pass ? " at temperatures 0.2-3.4" : "", same, worst);
        }
        li_buffer_free(&cu, &bx);
        li_buffer_free(&cu, &bo);
        li_buffer_free(&cu, &bs);
        free(x);
    }
    /* gather: the logits at flat indices (first, last, repeated, odd places) */
    {
        enum { N = 7, NI = 301 };
        const int64_t dim = 49157;
        float *x = frand(N * dim, 8.0f), got[NI];
        int64_t idx[NI];
        for (int i = 0; i < NI; i++)
            idx[i] = i == 0 ? 0 : i == 1 ? N * dim - 1 : ((int64_t)i * 7919 * 104729) % (N * dim);
        idx[NI - 1] = idx[5];
        li_buffer bx = up(x, (size_t)(N * dim) * 4), bi = up(idx, sizeof idx), bo = up(NULL, sizeof got);
        cu.ops->gather(&cu, bx.data, bi.data, NI, bo.data);
        down(&bo, got, sizeof got);
        int bad = 0;
        for (int i = 0; i < NI; i++) bad += memcmp(&got[i], &x[idx[i]], sizeof got[i]) != 0;
        report(!bad, "gather of %d logits at flat indices: the same bits (%d differ)", NI, bad);
        li_buffer_free(&cu, &bx);
        li_buffer_free(&cu, &bi);
        li_buffer_free(&cu, &bo);
        free(x);
    }
    /* hadamard: the reference's butterflies, so the same bits; odd row counts, signs from host memory */
    for (int64_t b = 128; b <= 512; b *= 4) {
        enum { N = 5, DIM = 1536 };
        float *x = frand(N * DIM, 3.0f), *s = frand(DIM, 1.0f), got[N * DIM];
        for (int j = 0; j < DIM; j++) s[j] = s[j] < 0 ? -1.0f : 1.0f;
        li_buffer bx = up(x, sizeof got);
        ref.ops->hadamard(&ref, x, s, N, DIM, b);
        cu.ops->hadamard(&cu, bx.data, s, N, DIM, b);
        down(&bx, got, sizeof got);
        report(!memcmp(got, x, sizeof got), "hadamard n=%d dim=%d block=%lld: the reference's bits", N, DIM,
               (long long)b);
        li_buffer_free(&cu, &bx);
        free(x);
        free(s);
    }
}

/* ------------------------------------------------------------------------
 * kv_store and paged attention
 * ---------------------------------------------------------------------- */

enum { BS = 16, NBLK = 12, NKV = 3, NH = 9, HD = 64, STRIDE = 6 };

static size_t elem_size(li_type t) {
    return t == LI_TYPE_F32 ? 4 : t == LI_TYPE_F16 || t == LI_TYPE_BF16 ? 2 : 1;
}

/* the device cache's bytes (and 8-bit scales) equal the host's, all of it
 * (untouched blocks stay zero on both) */
static bool kv_same(li_type dt, const li_kv_layer *hk, li_buffer *bk, li_buffer *bv, li_buffer *bks,
                    li_buffer *bvs) {
    const size_t bytes = (size_t)NBLK * BS * NKV * HD * elem_size(dt);
    uint8_t *ck = li_xmalloc(bytes), *cv = li_xmalloc(bytes);
    down(bk, ck, bytes);
    down(bv, cv, bytes);
    bool same = !memcmp(ck, hk->k, bytes) && !memcmp(cv, hk->v, bytes);
    if (dt == LI_KV_TYPE_FP8_E4M3 || dt == LI_KV_TYPE_INT8) {
        const size_t sb = (size_t)NBLK * BS * NKV * 4;
        float *s = li_xmalloc(sb);
        down(bks, s, sb);
        same = same && !memcmp(s, hk->k_scale, sb);
        down(bvs, s, sb);
        same = same && !memcmp(s, hk->v_scale, sb);
        free(s);
    }
    free(ck);
    free(cv);
    return same;
}

/* one batch through kv_store and attention on both backends */
static void kv_batch(li_type dt, const char *what, li_kv_layer *hk, li_kv_layer *dk, li_buffer *bk, li_buffer *bv,
                     li_buffer *bks, li_buffer *bvs, const int32_t *table, int64_t n, const int32_t *pos,
                     const int32_t *seq) {
    const bool b8 = dt == LI_KV_TYPE_FP8_E4M3 || dt == LI_KV_TYPE_INT8;
    int64_t *slot = li_xmalloc((size_t)n * sizeof *slot);
    for (int64_t i = 0; i < n; i++) slot[i] = (int64_t)table[seq[i] * STRIDE + pos[i] / BS] * BS + pos[i] % BS;
    float *k = frand(n * NKV * HD, 2.0f), *v = frand(n * NKV * HD, 2.0f), *q = frand(n * NH * HD, 2.0f);
    float *want = frand(n * NH * HD, 0), *got = frand(n * NH * HD, 0);
    ref.ops->kv_store(&ref, hk, k, v, slot, n, NKV, HD);
    li_buffer dkx = up(k, (size_t)(n * NKV * HD) * 4), dvx = up(v, (size_t)(n * NKV * HD) * 4);
    li_buffer dsl = up(slot, (size_t)n * 8);
    cu.ops->kv_store(&cu, dk, dkx.data, dvx.data, dsl.data, n, NKV, HD);
    const bool same = kv_same(dt, hk, bk, bv, bks, bvs);
    report(same, "%s kv_store %s n=%lld: the reference's bytes%s", what, li_type_name(dt), (long long)n,
           b8 ? " and scales" : "");
    li_attn_args a = {.n_tokens = n, .n_head = NH, .n_head_kv = NKV, .head_dim = HD, .block_size = BS, .q = q,
                      .out = want, .pos = pos, .seq = seq, .block_table = table, .bt_stride = STRIDE, .kv = hk,
                      .scale = 0.125f};
    ref.ops->attention(&ref, &a);
    li_buffer dq = up(q, (size_t)(n * NH * HD) * 4), dout = up(NULL, (size_t)(n * NH * HD) * 4);
    li_buffer dpos = up(pos, (size_t)n * 4), dseq = up(seq, (size_t)n * 4), dtab = up(table, 2 * STRIDE * 4);
    li_attn_args d = a;
    d.q = dq.data;
    d.out = dout.data;
    d.pos = dpos.data;
    d.seq = dseq.data;
    d.block_table = dtab.data;
    d.kv = dk;
    cu.ops->attention(&cu, &d);
    down(&dout, got, (size_t)(n * NH * HD) * 4);
    const double e = nmse(got, want, n * NH * HD);
    report(e < 5e-4, "%s attention %s n=%lld heads %d/%d: nmse %.2e < 5e-4", what, li_type_name(dt), (long long)n, NH,
           NKV, e);
    li_buffer *bufs[] = {&dkx, &dvx, &dsl, &dq, &dout, &dpos, &dseq, &dtab};
    for (size_t i = 0; i < LI_ARRAY_LEN(bufs); i++) li_buffer_free(&cu, bufs[i]);
    free(slot);
    free(k);
    free(v);
    free(q);
    free(want);
    free(got);
}

/* A recorded pass's padding rows (slot -1) store nothing: a step of one
 * real row and two padding rows leaves the cache as the reference's store
 * of the real row alone. */
static void kv_padding(li_type dt, li_kv_layer *hk, li_kv_layer *dk, li_buffer *bk, li_buffer *bv, li_buffer *bks,
                       li_buffer *bvs, const int32_t *table) {
    const int64_t slot[3] = {(int64_t)table[0 * STRIDE + 38 / BS] * BS + 38 % BS, -1, -1};
    float *k = frand(3 * NKV * HD, 2.0f), *v = frand(3 * NKV * HD, 2.0f);
    ref.ops->kv_store(&ref, hk, k, v, slot, 1, NKV, HD);
    li_buffer dkx = up(k, (size_t)(3 * NKV * HD) * 4), dvx = up(v, (size_t)(3 * NKV * HD) * 4), dsl = up(slot, 24);
    cu.ops->kv_store(&cu, dk, dkx.data, dvx.data, dsl.data, 3, NKV, HD);
    report(kv_same(dt, hk, bk, bv, bks, bvs), "kv_store %s with two padding rows (slot -1): only the real row stored",
           li_type_name(dt));
    li_buffer_free(&cu, &dkx);
    li_buffer_free(&cu, &dvx);
    li_buffer_free(&cu, &dsl);
    free(k);
    free(v);
}

/* rope_store: rope on q and k then kv_store, one launch (F32 / F16 / BF16
 * KV; 8-bit KV takes the two ops apart): q, k and the cache the bits of
 * the device's rope_qk then kv_store (that store checked against the
 * reference's above: here the reference stores the rope_qk's k), with
 * half the dims rotated (the rest stored as they are), both pairings, a
 * padding row */
static void kv_rope_store(li_type dt, li_kv_layer *hk, li_kv_layer *dk, li_buffer *bk, li_buffer *bv, li_buffer *bks,
                          li_buffer *bvs, const int32_t *table) {
    enum { N = 3 };
    const int32_t pos[N] = {41, 0, 17};
    const int64_t slot[N] = {(int64_t)table[0 * STRIDE + 41 / BS] * BS + 41 % BS, -1,
                             (int64_t)table[1 * STRIDE + 17 / BS] * BS + 17 % BS};
    const size_t qb = (size_t)(N * NH * HD) * 4, kb = (size_t)(N * NKV * HD) * 4;
    for (int neox = 0; neox < 2; neox++) {
        const int n_rot = neox ? HD / 2 : HD;
        float *q = frand(N * NH * HD, 2.0f), *k = frand(N * NKV * HD, 2.0f), *v = frand(N * NKV * HD, 2.0f);
        float *q1 = frand(N * NH * HD, 0), *k1 = frand(N * NKV * HD, 0);
        float *q2 = frand(N * NH * HD, 0), *k2 = frand(N * NKV * HD, 0);
        li_buffer dq1 = up(q, qb), dk1 = up(k, kb), dq2 = up(q, qb), dk2 = up(k, kb), dvx = up(v, kb);
        li_buffer dsl = up(slot, sizeof slot), dp = up(pos, sizeof pos);
        cu.ops->rope_qk(&cu, dq1.data, dk1.data, dp.data, N, NH, NKV, HD, n_rot, 10000.0f, neox);
        down(&dq1, q1, qb);
        down(&dk1, k1, kb);
        ref.ops->kv_store(&ref, hk, k1, v, slot, N, NKV, HD);
        cu.ops->rope_store(&cu, dq2.data, dk2.data, dvx.data, dp.data, N, NH, NKV, HD, n_rot, 10000.0f, neox, dk,
                           dsl.data);
        down(&dq2, q2, qb);
        down(&dk2, k2, kb);
        report(!memcmp(q1, q2, qb) && !memcmp(k1, k2, kb) && kv_same(dt, hk, bk, bv, bks, bvs),
               "rope_store %s, %s, %d of %d dims: q, k and the cache the bits of rope_qk then kv_store",
               li_type_name(dt), neox ? "neox" : "pairs", n_rot, HD);
        li_buffer *bufs[] = {&dq1, &dk1, &dq2, &dk2, &dvx, &dsl, &dp};
        for (size_t i = 0; i < LI_ARRAY_LEN(bufs); i++) li_buffer_free(&cu, bufs[i]);
        free(q), free(k), free(v), free(q1), free(k1), free(q2), free(k2);
    }
}

static void test_attention(void) {
    const li_type dts[] = {LI_TYPE_F32, LI_TYPE_F16, LI_TYPE_BF16, LI_KV_TYPE_FP8_E4M3, LI_KV_TYPE_INT8};
    /* two sequences of up to 96 positions, blocks scattered: a prefill of 80
     * and 40 tokens (120 > 64: the tiled kernel, attn_tile.h), then a decode
     * step of each (split by positions: 2 chunks of 64, the shorter
     * sequence's second empty) */
    const int32_t table[2 * STRIDE] = {7, 2, 9, 1, 3, 5, 4, 11, 0, 6, 8, 10};
    for (size_t t = 0; t < LI_ARRAY_LEN(dts); t++) {
        const li_type dt = dts[t];
        const bool b8 = dt == LI_KV_TYPE_FP8_E4M3 || dt == LI_KV_TYPE_INT8;
        const size_t bytes = (size_t)NBLK * BS * NKV * HD * elem_size(dt), sb = (size_t)NBLK * BS * NKV * 4;
        li_kv_layer hk = {.dtype = dt, .k = calloc(1, bytes), .v = calloc(1, bytes)};
        if (b8) {
            hk.k_scale = calloc(1, sb);
            hk.v_scale = calloc(1, sb);
        }
        li_buffer bk = up(NULL, bytes), bv = up(NULL, bytes), bks = {0}, bvs = {0};
        li_kv_layer dk = {.dtype = dt, .k = bk.data, .v = bv.data};
        if (b8) {
            bks = up(NULL, sb);
            bvs = up(NULL, sb);
            dk.k_scale = bks.data;
            dk.v_scale = bvs.data;
        }
        /* a mixed prefill: both prompts, interleaved */
        int32_t pos[120], seq[120];
        int64_t n = 0;
        for (int p = 0; p < 80; p++) {
            pos[n] = p;
            seq[n++] = 0;
            if (p < 40) {
                pos[n] = p;
                seq[n++] = 1;
            }
        }
        kv_batch(dt, "prefill", &hk, &dk, &bk, &bv, &bks, &bvs, table, n, pos, seq);
        /* the same positions again, each prompt a run (the tiled kernel's
         * segments: 21-token tiles over 80 and 40 tokens) */
        n = 0;
        for (int s = 0; s < 2; s++)
            for (int p = 0; p < (s ? 40 : 80); p++) pos[n] = p, seq[n++] = s;
        kv_batch(dt, "prefill by runs", &hk, &dk, &bk, &bv, &bks, &bvs, table, n, pos, seq);
        /* a decode step of each sequence after it */
        const int32_t dpos[2] = {80, 40}, dseq[2] = {0, 1};
        kv_batch(dt, "decode", &hk, &dk, &bk, &bv, &bks, &bvs, table, 2, dpos, dseq);
        kv_padding(dt, &hk, &dk, &bk, &bv, &bks, &bvs, table);
        kv_rope_store(dt, &hk, &dk, &bk, &bv, &bks, &bvs, table);
        li_buffer_free(&cu, &bk);
        li_buffer_free(&cu, &bv);
        li_buffer_free(&cu, &bks);
        li_buffer_free(&cu, &bvs);
        free(hk.k);
        free(hk.v);
        free(hk.k_scale);
        free(hk.v_scale);
    }
}

/* ------------------------------------------------------------------------
 * the real model: greedy tokens, logits, perplexity; the decode benchmark
 * ---------------------------------------------------------------------- */

static int argmax(const float *a, int64_t n) {
    int b = 0;
    for (int64_t i = 1; i < n; i++)
        if (a[i] > a[b]) b = (int)i;
    return b;
}

enum { GREEDY = 32 };

/* greedy tokens after the prompt; the prompt's last logits into first,
 * every step's logits into steps (GREEDY, nv); the mean NLL of `text`
 * tokens (all logits of one pass) into *nll */
static int model_run(li_model *m, li_backend *be, const int32_t *prompt, size_t np, const int32_t *text, size_t nt,
                     int32_t *out, float *steps, double *nll, li_error *err) {
    const int32_t nv = m->hp.n_vocab;
    li_session s;
    int rc = li_session_init(&s, m, be, 512, LI_TYPE_F16, 256, err);
    if (rc) return rc;
    float *logits = li_xmalloc((size_t)nv * sizeof(float));
    if (!(rc = li_session_eval(&s, prompt, (int64_t)np, false, logits, err))) {
        for (int t = 0; t < GREEDY && !rc; t++) {
            memcpy(steps + (size_t)t * nv, logits, (size_t)nv * sizeof(float));
            out[t] = argmax(logits, nv);
            rc = li_session_eval(&s, &out[t], 1, false, logits, err);
        }
    }
    li_session_free(&s);
    free(logits);
    if (rc) return rc;
    float *all = li_xmalloc((size_t)nt * (size_t)nv * sizeof(float));
    if ((rc = li_session_init(&s, m, be, 512, LI_TYPE_F16, 256, err))) {
        free(all);
        return rc;
    }
    rc = li_session_eval(&s, text, (int64_t)nt, true, all, err);
    li_session_free(&s);
    double sum = 0;
    for (size_t i = 0; !rc && i + 1 < nt; i++) {
        const float *row = all + i * (size_t)nv;
        double mx = row[0], z = 0;
        for (int32_t j = 1; j < nv; j++) mx = row[j] > mx ? row[j] : mx;
        for (int32_t j = 0; j < nv; j++) z += exp((double)row[j] - mx);
        sum += log(z) + mx - row[text[i + 1]];
    }
    *nll = sum / (double)(nt - 1);
    free(all);
    return rc;
}

/* B sequences decoding together from position ctx: one forward pass a
 * step (every row with logits), its own KV cache */
typedef struct {
    int B, ctx;
    int64_t stride;
    li_kv_cache kv;
    li_forward fw;
    li_kv_seq *sq;
    int32_t *table, *tok, *pos, *seq, *rows;
    int64_t *slot;
} dec_rig;

static int rig_init(dec_rig *r, li_model *m, int B, int ctx, int steps, li_error *err) {
    memset(r, 0, sizeof *r);
    r->B = B;
    r->ctx = ctx;
    r->stride = (ctx + steps) / 16 + 1;
    const li_kv_dims dims = li_forward_kv_dims(&m->hp);
    if (li_kv_cache_init(&r->kv, &cu, &dims, LI_TYPE_F16, 16, (int32_t)(B * r->stride), err)) return -1;
    if (li_forward_init(&r->fw, m, &cu, B, err)) {
        li_kv_cache_free(&r->kv);
        return -1;
    }
    r->sq = li_xcalloc((size_t)B, sizeof *r->sq);
    r->table = li_xcalloc((size_t)B * (size_t)r->stride, sizeof *r->table);
    for (int s = 0; s < B; s++) {
        li_kv_seq_init(&r->sq[s]);
        li_kv_seq_reserve(&r->kv, &r->sq[s], ctx + steps);
        memcpy(r->table + (size_t)s * r->stride, r->sq[s].blocks, (size_t)r->sq[s].n_blocks * sizeof *r->table);
    }
    r->tok = li_xcalloc((size_t)B, 4);
    r->pos = li_xcalloc((size_t)B, 4);
    r->seq = li_xcalloc((size_t)B, 4);
    r->rows = li_xcalloc((size_t)B, 4);
    r->slot = li_xcalloc((size_t)B, 8);
    return 0;
}

/* step st (position ctx + st; the same position again for st < 0) */
static int rig_step(dec_rig *r, li_model *m, int st, float *logits, li_error *err) {
    for (int s = 0; s < r->B; s++) {
        r->tok[s] = (s * 7 + st + 100) % m->hp.n_vocab;
        r->pos[s] = r->ctx + (st < 0 ? 0 : st);
        r->seq[s] = s;
        r->rows[s] = s;
        r->slot[s] = li_kv_seq_slot(&r->kv, &r->sq[s], r->pos[s]);
    }
    li_batch b = {.n = r->B, .tokens = r->tok, .pos = r->pos, .seq = r->seq, .slot = r->slot,
                  .block_table = r->table, .n_seqs = r->B, .bt_stride = r->stride, .logit_rows = r->rows,
                  .n_logits = r->B};
    return li_forward_run(&r->fw, m, &cu, &r->kv, &b, logits, err);
}

static void rig_free(dec_rig *r) {
    for (int s = 0; s < r->B; s++) {
        li_kv_seq_release(&r->kv, &r->sq[s]);
        li_kv_seq_free(&r->sq[s]);
    }
    free(r->sq);
    free(r->table);
    free(r->tok);
    free(r->pos);
    free(r->seq);
    free(r->rows);
    free(r->slot);
    li_forward_free(&r->fw);
    li_kv_cache_free(&r->kv);
}

/* Recorded passes (CUDA graphs) against the same steps issued op by op:
 * 3 rows (padded to 4) and 8 give the same bits (every kernel's rows are
 * independent); 20 rows (padded to 24) go through cuBLAS, whose kernel
 * may change with the row count: NMSE. */
static void test_graphs(li_model *m) {
    enum { STEPS = 6 };
    const int batches[] = {3, 8, 20};
    for (size_t bi = 0; bi < LI_ARRAY_LEN(batches); bi++) {
        const int B = batches[bi];
        li_error err = {0};
        dec_rig e, g;
        if (rig_init(&e, m, B, 40, STEPS, &err) || rig_init(&g, m, B, 40, STEPS, &err)) {
            report(false, "graphs: batch %d: %s", B, err.msg);
            return;
        }
        li_forward_set_graphs(&e.fw, false);
        li_forward_set_graphs(&g.fw, true);
        const size_t nl = (size_t)B * (size_t)m->hp.n_vocab;
        float *le = li_xmalloc(nl * sizeof(float)), *lg = li_xmalloc(nl * sizeof(float));
        bool same = true, ran = true;
        double worst = 0;
        for (int st = 0; st < STEPS && ran; st++) {
            ran = !rig_step(&e, m, st, le, &err) && !rig_step(&g, m, st, lg, &err);
            same &= !memcmp(le, lg, nl * sizeof(float));
            const double d = nmse(lg, le, (int64_t)nl);
            worst = d > worst ? d : worst;
        }
        report(ran, "graphs: batch %d ran (%s)", B, ran ? "ok" : err.msg);
        report(g.fw.n_recorded == 1 && g.fw.n_replayed == STEPS - 2,
               "graphs: batch %d recorded once at the second step, replayed after (%lld, %lld)", B,
               (long long)g.fw.n_recorded, (long long)g.fw.n_replayed);
        if (B <= 8)
            report(same, "graphs: batch %d, %d steps: the same logits as op by op, bit for bit", B, STEPS);
        else
            report(worst < 1e-6, "graphs: batch %d (cuBLAS), %d steps: logits nmse %.2e < 1e-6", B, STEPS, worst);
        free(le);
        free(lg);
        rig_free(&e);
        rig_free(&g);
    }
}

/* The engine on CUDA: four requests: 0 at temperature 0.7 and top_p 0.9
 * (from the 64 largest logits and the row's lse, or its logits), 1 greedy
 * with logprobs, 2 at temperature 0.8, top_k 40 (from its 41 largest), 3
 * greedy with min_tokens and a repetition penalty (its rows read their
 * own logits), with device_sampling on and off: the same tokens, and the
 * first run sampled most of requests 0-2's on the device. */
static void test_engine_sampling(li_model *m, const int32_t *prompt, size_t np) {
    enum { NR = 4, NTOK = 24 };
    int32_t toks[2][NR][NTOK];
    int64_t dev[2] = {0, 0}, undecided = 0;
    bool ok = true;
    for (int pass = 0; pass < 2 && ok; pass++) {
        li_error err = {0};
        li_engine_config c;
        li_engine_config_default(&c);
        c.device_sampling = pass == 0;
        c.max_num_seqs = NR;
        li_engine *e;
        if (li_engine_init(&e, m, &cu, &c, &err)) {
            report(false, "engine on cuda: %s", err.msg);
            return;
        }
        int64_t ids[NR];
        for (int r = 0; r < NR && ok; r++) {
            li_request_params p = {.prompt = prompt, .n_prompt = (int64_t)np - (r % 2), .max_tokens = NTOK,
                                   .ignore_eos = true, .min_tokens = r == 3 ? 5 : 0};
            li_sampling_params_default(&p.sampling);
            p.sampling.temperature = r == 2 ? 0.8f : r == 0 ? 0.7f : 0.0f; /* r 2: top_k 40, from its 41 largest */
            if (r == 0) p.sampling.top_k = 0, p.sampling.top_p = 0.9f;
            if (r == 3) p.sampling.repeat_penalty = 1.2f;
            p.sampling.n_logprobs = r == 1 ? 4 : 0;           /* r 1: logprobs from topk and the row's lse */
            p.sampling.seed = 5 + (uint64_t)r;
            ok = !li_engine_add(e, &p, &ids[r], &err);
        }
        for (int guard = 0; ok && li_engine_has_work(e) && guard < 1000; guard++) ok = !li_engine_step(e, &err);
        for (int r = 0; r < NR && ok; r++) {
            const li_request_result *res = li_engine_result(e, ids[r]);
            ok = res && res->n_tokens == NTOK;
            if (ok) memcpy(toks[pass][r], res->tokens, sizeof toks[pass][r]);
        }
        li_engine_stats st;
        li_engine_stats_get(e, &st);
        dev[pass] = st.tokens_device_sampled;
        if (!pass) undecided = st.tokens_device_undecided;
        report(ok, "engine on cuda, device sampling %s: ran (%s)", pass ? "off" : "on", ok ? "ok" : err.msg);
        li_engine_free(e);
    }
    if (!ok) return;
    report(!memcmp(toks[0], toks[1], sizeof toks[0]), "engine on cuda: tokens sampled from the device's argmax and "
           "top-k equal the host sampler's (%d requests x %d)", NR, NTOK);
    report(dev[0] >= 2 * NTOK + NTOK / 2 && dev[1] == 0, "engine on cuda: %lld tokens sampled on the device, %lld "
           "rows undecided (device_sampling off: %lld)", (long long)dev[0], (long long)undecided, (long long)dev[1]);
}

/* LUAINFER_CUDA_INVARIANT=1: a second CUDA backend whose matmuls are all
 * the GEMV. Each row of a 40-row product equals the row computed alone,
 * bit for bit (q4_1 through its block GEMV, w8a8, f16), and the engine's
 * n-gram speculation on it gives the tokens of no speculation, greedy. The
 * model moves from cu to it and back (a weight is prepared on one backend
 * at a time). */
static void test_invariant(li_model *m) {
    li_error err = {0};
    li_backend inv;
    setenv("LUAINFER_CUDA_INVARIANT", "1", 1);
    const int rc0 = li_backend_cuda_init(&inv, 0, &err);
    unsetenv("LUAINFER_CUDA_INVARIANT");
    report(rc0 == 0 && !inv.ops->batch_variant, "invariant backend: %s", rc0 ? err.msg : inv.ops->name);
    if (rc0) return;
    const li_type types[] = {LI_TYPE_Q4_1, LI_TYPE_Q8_0, LI_TYPE_F16};
    for (size_t ti = 0; ti < LI_ARRAY_LEN(types); ti++) {
        enum { N = 40, K = 160, M = 131 };
        test_weight tw;
        test_weight_make(&tw, types[ti], K, M, fill_rand);
        li_weight wc = tw.w;
        wc.packed = NULL;
        inv.ops->weight_prepare(&inv, &wc);
        float *x = frand(N * K, 1.0f), *all = frand(N * M, 0), *one = frand(M, 0);
        li_buffer bx = up(x, sizeof(float) * N * K), by = up(NULL, sizeof(float) * N * M),
                  b1 = up(NULL, sizeof(float) * M);
        cu.ops->synchronize(&cu); /* the uploads ran on cu's stream, the products run on inv's */
        inv.ops->matmul(&inv, &wc, bx.data, by.data, N);
        inv.ops->synchronize(&inv);
        down(&by, all, sizeof(float) * N * M);
        bool same = true;
        for (int r = 0; r < N; r++) {
            inv.ops->matmul(&inv, &wc, (float *)bx.data + (size_t)r * K, b1.data, 1);
            inv.ops->synchronize(&inv);
            down(&b1, one, sizeof(float) * M);
            same &= !memcmp(one, all + (size_t)r * M, sizeof(float) * M);
        }
        report(same, "invariant %s matmul: every row of a %d-row product is the row computed alone, bit for bit",
               li_type_name(types[ti]), N);
        li_buffer_free(&cu, &bx);
        li_buffer_free(&cu, &by);
        li_buffer_free(&cu, &b1);
        inv.ops->weight_release(&inv, &wc);
        test_weight_free(&tw);
        free(x);
        free(all);
        free(one);
    }
    /* the engine, n-gram speculation on and off: the same greedy tokens */
    li_model_release(m, &cu);
    int rc = li_model_prepare(m, &inv, &err);
    report(rc == 0, "model on the invariant backend: %s", rc ? err.msg : "prepared");
    const char *text = "alpha beta gamma delta epsilon zeta alpha beta gamma delta epsilon zeta alpha beta gamma delta";
    int32_t *pt = NULL;
    size_t np = 0;
    if (!rc) rc = li_tokenizer_encode(m->tok, text, strlen(text), true, false, &pt, &np, &err);
    enum { NTOK = 32 };
    int32_t toks[2][NTOK];
    int64_t accepted = 0;
    for (int spec = 0; spec < 2 && !rc; spec++) {
        li_engine_config c;
        li_engine_config_default(&c);
        c.spec_tokens = spec ? 4 : 0;
        li_engine *e;
        if ((rc = li_engine_init(&e, m, &inv, &c, &err))) break;
        li_request_params p = {.prompt = pt, .n_prompt = (int64_t)np, .max_tokens = NTOK, .ignore_eos = true};
        li_sampling_params_default(&p.sampling);
        p.sampling.temperature = 0;
        int64_t id;
        rc = li_engine_add(e, &p, &id, &err);
        for (int guard = 0; !rc && li_engine_has_work(e) && guard < 1000; guard++) rc = li_engine_step(e, &err);
        const li_request_result *res = rc ? NULL : li_engine_result(e, id);
        if (res && res->n_tokens == NTOK) memcpy(toks[spec], res->tokens, sizeof toks[spec]);
        else if (!rc) rc = -1;
        li_engine_stats st;
        li_engine_stats_get(e, &st);
        if (spec) accepted = st.spec_accepted;
        li_engine_free(e);
    }
    report(rc == 0, "invariant backend: the engine ran with and without speculation (%s)", rc ? err.msg : "ok");
    if (!rc)
        report(!memcmp(toks[0], toks[1], sizeof toks[0]) && accepted > 0,
               "invariant backend: n-gram speculation (%lld drafts accepted) gives the tokens of none, greedy",
               (long long)accepted);
    free(pt);
    li_model_release(m, &inv);
    li_backend_cuda_free(&inv);
    rc = li_model_prepare(m, &cu, &err);
    report(rc == 0, "model back on cuda: %s", rc ? err.msg : "prepared");
}

/* LUAINFER_CUDA_FUSE=0: a backend whose norm_matmul issues rmsnorm, the
 * GEMVs and silu_mul apart (and, above 8 rows with k_mmq off, whose
 * rmsnorm, silu_mul and attention do not write q8 blocks beside their
 * outputs). The same greedy tokens, logits and perplexity as cu's, bit for
 * bit: the fused GEMV sums the norm in rmsnorm's order and rounds as the
 * GEMV apart does. */
static void test_fused(li_model *m, const int32_t *pt, size_t np, const int32_t *tt, size_t nt, const int32_t *gg,
                       const float *sg, double nll_g) {
    li_error err = {0};
    li_backend nf;
    setenv("LUAINFER_CUDA_FUSE", "0", 1);
    int rc = li_backend_cuda_init(&nf, 0, &err);
    unsetenv("LUAINFER_CUDA_FUSE");
    report(rc == 0, "unfused backend: %s", rc ? err.msg : "up");
    if (rc) return;
    li_model_release(m, &cu);
    int32_t g2[GREEDY];
    float *s2 = li_xmalloc((size_t)GREEDY * (size_t)m->hp.n_vocab * sizeof(float));
    double nll2 = 0;
    if (!(rc = li_model_prepare(m, &nf, &err))) rc = model_run(m, &nf, pt, np, tt, nt, g2, s2, &nll2, &err);
    report(rc == 0, "model on the unfused backend: %s", rc ? err.msg : "ran");
    if (!rc)
        report(!memcmp(g2, gg, sizeof g2) && !memcmp(s2, sg, (size_t)GREEDY * (size_t)m->hp.n_vocab * sizeof(float)) &&
                   nll2 == nll_g,
               "rmsnorm and silu inside the GEMV (norm_matmul): the tokens, logits and perplexity of the ops "
               "apart, bit for bit");
    free(s2);
    li_model_release(m, &nf);
    li_backend_cuda_free(&nf);
    rc = li_model_prepare(m, &cu, &err);
    report(rc == 0, "model back on cuda: %s", rc ? err.msg : "prepared");
}

/* Tensor parallel on GPUs: the engine with tensor_parallel 2 (rank r on
 * device r, NCCL) against one rank, greedy. The all-reduce sums the
 * ranks' partial products in its own order, so tokens may part at a near
 * tie: the first 8 must agree. Needs two devices (a skip says so). */
static void test_tp_cuda(li_model *m, const int32_t *pt, size_t np) {
    const int n_dev = li_backend_cuda_device_count();
    if (n_dev < 2) {
        printf("SKIP tensor parallel on cuda: needs 2 devices, this machine has %d\n", n_dev);
        return;
    }
    enum { NTOK = 24 };
    int32_t toks[2][NTOK];
    bool ok = true;
    li_error err = {0};
    for (int tp = 1; tp <= 2 && ok; tp++) {
        li_engine_config c;
        li_engine_config_default(&c);
        c.tensor_parallel = tp;
        li_engine *e;
        if (li_engine_init(&e, m, &cu, &c, &err)) {
            ok = false;
            break;
        }
        li_request_params p = {.prompt = pt, .n_prompt = (int64_t)np, .max_tokens = NTOK, .ignore_eos = true};
        li_sampling_params_default(&p.sampling);
        p.sampling.temperature = 0;
        int64_t id;
        ok = !li_engine_add(e, &p, &id, &err);
        for (int guard = 0; ok && li_engine_has_work(e) && guard < 1000; guard++) ok = !li_engine_step(e, &err);
        const li_request_result *res = ok ? li_engine_result(e, id) : NULL;
        ok = ok && res && res->n_tokens == NTOK;
        if (ok) memcpy(toks[tp - 1], res->tokens, sizeof toks[0]);
        li_engine_free(e);
    }
    report(ok, "tensor parallel 2 on cuda: ran (%s)", ok ? "ok" : err.msg);
    if (!ok) return;
    int agree = 0;
    while (agree < NTOK && toks[0][agree] == toks[1][agree]) agree++;
    report(agree >= 8, "tensor parallel 2 on cuda: greedy tokens agree with one rank for %d of %d (8 at least)", agree,
           NTOK);
}

/* Multiply-adds of one token through every matmul (the output head apart) */
static double matmul_macs(const li_model *m) {
    double s = 0;
    for (int l = 0; l < m->hp.n_layer; l++) {
        const li_layer *L = &m->layers[l];
        const li_weight *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < LI_ARRAY_LEN(w); i++) s += (double)w[i]->m * (double)w[i]->k;
    }
    return s;
}

/* A 512-token prompt in one pass (one sequence, the last row's logits),
 * best of 3 after a warm-up: TFLOP/s over the matmuls, the attention and
 * the head */
static void bench_prefill(li_model *m) {
    enum { N = 512 };
    li_error err = {0};
    li_kv_cache kv;
    li_forward fw;
    const li_kv_dims dims = li_forward_kv_dims(&m->hp);
    if (li_kv_cache_init(&kv, &cu, &dims, LI_TYPE_F16, 16, N / 16 + 1, &err) || li_forward_init(&fw, m, &cu, N, &err)) {
        printf("bench: prefill: %s\n", err.msg);
        return;
    }
    li_kv_seq sq;
    li_kv_seq_init(&sq);
    li_kv_seq_reserve(&kv, &sq, N);
    int32_t *tok = li_xmalloc(N * 4), *pos = li_xmalloc(N * 4), *seq = li_xcalloc(N, 4), last = N - 1;
    int64_t *slot = li_xmalloc(N * 8);
    for (int i = 0; i < N; i++) {
        tok[i] = (i * 7919 + 100) % m->hp.n_vocab;
        pos[i] = i;
        slot[i] = li_kv_seq_slot(&kv, &sq, i);
    }
    li_batch b = {.n = N, .tokens = tok, .pos = pos, .seq = seq, .slot = slot, .block_table = sq.blocks, .n_seqs = 1,
                  .bt_stride = sq.n_blocks, .logit_rows = &last, .n_logits = 1};
    float *logits = li_xmalloc((size_t)m->hp.n_vocab * sizeof(float));
    /* alternating: the q4/q8 weights by k_mmq (the default), then through
     * their f16 copies (li_backend_cuda_set_mmq) */
    double best[2] = {1e30, 1e30};
    for (int r = 0; r < 8; r++) {
        li_backend_cuda_set_mmq(&cu, r % 2 == 0);
        const double t0 = li_time_now();
        if (li_forward_run(&fw, m, &cu, &kv, &b, logits, &err)) {
            printf("bench: prefill: %s\n", err.msg);
            break;
        }
        const double dt = li_time_now() - t0;
        if (r >= 2) best[r % 2] = dt < best[r % 2] ? dt : best[r % 2];
    }
    li_backend_cuda_set_mmq(&cu, true);
    const li_hparams *hp = &m->hp;
    const double flop = 2.0 * N * matmul_macs(m) + 2.0 * (double)hp->n_vocab * hp->n_embd +
                        4.0 * hp->n_layer * hp->n_head * hp->head_dim * (N * (N + 1) / 2.0);
    for (int i = 0; i < 2; i++)
        printf("bench: prefill %d tokens, one pass%s: %.3f ms, %.0f tokens/s, %.2f TFLOP/s\n", N,
               i ? ", q4/q8 weights through f16 copies" : "", best[i] * 1e3, N / best[i], flop / best[i] / 1e12);
    printf("bench: prefill: k_mmq / f16 copies, time: %.2f\n", best[0] / best[1]);
    free(tok);
    free(pos);
    free(seq);
    free(slot);
    free(logits);
    li_kv_seq_release(&kv, &sq);
    li_kv_seq_free(&sq);
    li_forward_free(&fw);
    li_kv_cache_free(&kv);
}

/* Decode steps of r at batch B as recorded passes with set(&cu, false) and
 * set(&cu, true), alternating for `rounds`, best of each; the setting is
 * left at `dflt` */
static void bench_setting(dec_rig *r, li_model *m, int B, int steps, int rounds, float *logits,
                          int (*set)(li_backend *, bool), bool dflt, const char *what) {
    double best[2] = {1e30, 1e30};
    li_error err = {0};
    li_forward_set_graphs(&r->fw, true);
    for (int round = 0; round < 2 * rounds; round++) {
        const int on = round % 2;
        set(&cu, on);
        double t0 = 0;
        int rc = 0;
        for (int st = -2; st < steps && !rc; st++) { /* two warm-up steps: the pass recorded again */
            if (st == 0) t0 = li_time_now();
            rc = rig_step(r, m, st, logits, &err);
        }
        if (rc) {
            printf("bench: batch %d, %s: %s\n", B, what, err.msg);
            break;
        }
        const double dt = li_time_now() - t0;
        best[on] = dt < best[on] ? dt : best[on];
    }
    set(&cu, dflt);
    printf("bench: decode batch %3d, graphs, %s: %.3f / %.3f ms per step (on: %.2fx the speed)\n", B, what,
           best[0] * 1e3 / steps, best[1] * 1e3 / steps, best[0] / best[1]);
}

/* Decode steps at batch 1, 8, 64 and 256 (context 128, F16 KV, logits
 * copied back each step), op by op and replayed, alternating in rounds;
 * then each kernel's time at batch 1 and 64 (the profile). */
static void bench_decode(li_model *m) {
    const int batches[] = {1, 8, 64, 256};
    const int ctx = 128, steps = 32, rounds = 2;
    char name[256];
    double bw;
    li_backend_cuda_describe(&cu, name, sizeof name, &bw);
    printf("bench: %s, memory bandwidth %.2f TB/s (clock x bus width); weights %.1f MB read per step\n", name, bw / 1e12,
           (double)m->weight_bytes / 1e6);
    for (size_t bi = 0; bi < LI_ARRAY_LEN(batches); bi++) {
        const int B = batches[bi];
        li_error err = {0};
        dec_rig r;
        if (rig_init(&r, m, B, ctx, steps, &err)) {
            printf("bench: batch %d: %s\n", B, err.msg);
            return;
        }
        float *logits = li_xmalloc((size_t)B * (size_t)m->hp.n_vocab * sizeof(float));
        double best[2] = {1e30, 1e30};
        for (int round = 0; round < rounds; round++)
            for (int graphs = 0; graphs < 2; graphs++) {
                li_forward_set_graphs(&r.fw, graphs);
                double t0 = 0;
                int rc = 0;
                for (int st = -2; st < steps && !rc; st++) { /* two warm-up steps (a recording's first two) */
                    if (st == 0) t0 = li_time_now();
                    rc = rig_step(&r, m, st, logits, &err);
                }
                const double dt = li_time_now() - t0;
                if (rc) {
                    printf("bench: batch %d: %s\n", B, err.msg);
                    break;
                }
                printf("bench: decode batch %3d, context %d, %s: %9.1f tokens/s, %.3f ms per step (%d steps, logits "
                       "copied back)\n", B, ctx, graphs ? "graphs    " : "op by op  ", (double)B * steps / dt,
                       dt * 1e3 / steps, steps);
                best[graphs] = dt < best[graphs] ? dt : best[graphs];
            }
        const double gbs = (double)m->weight_bytes * steps / best[1] / 1e9;
        printf("bench: decode batch %3d: graphs / op by op, best of %d: %.3f / %.3f ms per step (%.2fx); weights at "
               "%.0f GB/s, %.1f%% of the memory bandwidth\n", B, rounds, best[1] * 1e3 / steps, best[0] * 1e3 / steps,
               best[0] / best[1], gbs, bw > 0 ? 100.0 * gbs * 1e9 / bw : 0.0);
        /* recorded passes, a backend setting off and on, alternating */
        bench_setting(&r, m, B, steps, 2 * rounds, logits, li_backend_cuda_set_pdl, false,
                      "programmatic dependent launch off / on");
        if (B > 8)
            bench_setting(&r, m, B, steps, 2 * rounds, logits, li_backend_cuda_set_mmq, true,
                          "q4/q8 weights through f16 copies / by k_mmq");
        if (B == 1 || B == 64) {
            li_backend_cuda_profile(&cu, true);
            li_forward_set_graphs(&r.fw, false);
            for (int st = 0; st < 8; st++) rig_step(&r, m, st, logits, &err);
            char title[96];
            snprintf(title, sizeof title, "bench: profile, batch %d, 8 steps op by op (each launch behind a spin)", B);
            li_backend_cuda_profile_print(&cu, stdout, title);
            li_backend_cuda_profile(&cu, false);
        }
        free(logits);
        rig_free(&r);
    }
}

/* --only bench: the benchmarks alone, on the model at path (NULL: the
 * default), e.g. the W8A8, FP8 and BF16 files device_check makes */
static void bench_only(const char *path) {
    li_error err = {0};
    li_model *m;
    if (li_model_load(&m, li_model_default_path(path), &err) || li_model_prepare(m, &cu, &err)) {
        report(false, "bench: model %s: %s", path ? path : "(default)", err.msg);
        return;
    }
    printf("bench: model %s\n", path ? path : li_model_default_path(NULL));
    bench_prefill(m);
    bench_decode(m);
    li_model_release(m, &cu);
    li_model_free(m);
}

static void test_model(bool bench) {
    li_error err = {0};
    li_model *m;
    if (li_model_load(&m, li_model_default_path(NULL), &err)) {
        printf("SKIP whole-model checks: model not loadable (%s)\n", err.msg);
        return;
    }
    const int32_t nv = m->hp.n_vocab;
    const char *prompt = "The capital of France is";
    /* the perplexity's text: the start of alice29.txt, about 480 tokens. A
     * 52-token paragraph read 96.1-97.4 across the CPU's own ISAs (1.3%:
     * their activation rounding), too short to hold two backends to 0.5% */
    const char *text = "Paged attention stores the keys and values of every sequence in fixed-size blocks, so "
                       "memory is allocated as a sequence grows and freed the moment it ends. A block table maps "
                       "each position to its block, and sequences that share a prefix share its blocks.";
    char *alice = NULL;
    size_t alice_len = 0;
    li_error ferr = {0};
    if (li_read_file(LI_SOURCE_DIR "/tests/data/alice29.txt", (size_t)1 << 24, "alice29.txt", &alice, &alice_len,
                     &ferr) == 0 && alice_len > 2000)
        alice[2000] = '\0', text = alice;
    else
        printf("note: %s: the perplexity runs on a 52-token paragraph\n", ferr.msg);
    int32_t *pt, *tt;
    size_t np, nt;
    if (li_tokenizer_encode(m->tok, prompt, strlen(prompt), true, false, &pt, &np, &err) ||
        li_tokenizer_encode(m->tok, text, strlen(text), true, false, &tt, &nt, &err)) {
        report(false, "tokenize: %s", err.msg);
        free(alice);
        li_model_free(m);
        return;
    }
    if (nt > 500) nt = 500; /* model_run's sessions hold 512 */
    int32_t gc[GREEDY], gg[GREEDY];
    float *sc = li_xmalloc((size_t)GREEDY * nv * sizeof(float)), *sg = li_xmalloc((size_t)GREEDY * nv * sizeof(float));
    double nll_c = 0, nll_g = 0;
    li_backend cpu;
    int rc = li_backend_cpu_init(&cpu, 0, "auto", &err);
    if (!rc && !(rc = li_model_prepare(m, &cpu, &err)))
        rc = model_run(m, &cpu, pt, np, tt, nt, gc, sc, &nll_c, &err);
    report(rc == 0, "model on the CPU backend: %s", rc ? err.msg : "ran");
    li_model_release(m, &cpu);
    li_backend_cpu_free(&cpu);
    bool on_cu = false;
    if (!rc) {
        rc = li_model_prepare(m, &cu, &err);
        on_cu = rc == 0;
        if (!rc) rc = model_run(m, &cu, pt, np, tt, nt, gg, sg, &nll_g, &err);
        report(rc == 0, "model on CUDA: %s", rc ? err.msg : "ran");
    }
    if (!rc) {
        int agree = 0, first = -1;
        for (int t = 0; t < GREEDY; t++) {
            if (gc[t] == gg[t] && first < 0) agree++;
            else if (first < 0) first = t;
        }
        const double e0 = nmse(sg, sc, nv);
        report(e0 < 5e-3, "model: the prompt's last logits, CUDA vs CPU: nmse %.2e < 5e-3", e0);
        if (first < 0) {
            report(true, "model: greedy tokens agree, %d of %d", agree, GREEDY);
        } else {
            /* the CPU's own logits at the divergence: how close were the two tokens? */
            const float *row = sc + (size_t)first * nv;
            const double gap = (double)row[gc[first]] - (double)row[gg[first]];
            report(gap < 0.5, "model: greedy tokens agree for %d of %d; first divergence at step %d (cpu %d, cuda %d), "
                   "cpu logit gap %.4f < 0.5 (a near tie)", agree, GREEDY, first, gc[first], gg[first], gap);
        }
        const double pc = exp(nll_c), pg = exp(nll_g), rel = fabs(pg - pc) / pc;
        report(rel < 0.005, "model: perplexity of %zu tokens, cpu %.4f, cuda %.4f: |diff| %.3f%% < 0.5%%", nt, pc, pg,
               100 * rel);
    }
    if (!rc) test_fused(m, pt, np, tt, nt, gg, sg, nll_g);
    if (!rc) test_graphs(m);
    if (!rc) test_engine_sampling(m, pt, np);
    if (!rc) test_invariant(m);
    if (!rc) test_tp_cuda(m, pt, np);
    if (!rc && bench) {
        bench_prefill(m);
        bench_decode(m);
    }
    if (on_cu) li_model_release(m, &cu);
    free(sc);
    free(sg);
    free(pt);
    free(tt);
    free(alice);
    li_model_free(m);
}

int main(int argc, char **argv) {
    bool bench = false;
    const char *only = NULL, *model = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bench")) bench = true;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else {
            fprintf(stderr, "usage: test_cuda_ops [--bench] [--only weights|rowops|attention|model|bench] "
                            "[--model FILE (with --only bench)]\n");
            return 2;
        }
    }
    const char *groups[] = {"weights", "rowops", "attention", "model", "bench"};
    bool known = !only;
    for (size_t g = 0; g < LI_ARRAY_LEN(groups); g++) known = known || !strcmp(only, groups[g]);
    if (!known) {
        fprintf(stderr, "test_cuda_ops: unknown group '%s' (weights, rowops, attention, model, bench)\n", only);
        return 2;
    }
#define RUN(g) (!only || !strcmp(only, g))
    setvbuf(stdout, NULL, _IOLBF, 0); /* every line reaches the report even if an op aborts */
    li_error err = {0};
    if (li_backend_cuda_init(&cu, 0, &err)) {
        printf("SKIP: no CUDA device (%s)\n", err.msg);
        return 77;
    }
    ref = (li_backend){.ops = li_backend_ref_ops(), .n_threads = 1};
    if (RUN("weights")) test_weights();
    if (RUN("rowops")) test_rowops();
    if (RUN("attention")) test_attention();
    if (RUN("model")) test_model(bench);
    if (only && !strcmp(only, "bench")) bench_only(model); /* only when asked */
    li_backend_cuda_free(&cu);
    return t_summary("test_cuda_ops");
}
