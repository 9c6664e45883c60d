/* test_ggml_kernels.c — the "ggml" kernels (llama.cpp's x86 arithmetic).
 *
 * End to end they are checked against llama.cpp's own logits
 * (tests/integration/test_parity.py, --isa ggml). Here, piece by piece:
 *   - the AVX2 quantized dots are bit-identical to the scalar reference at
 *     odd block counts, over every nibble/byte value and extreme scales;
 *   - the scalar reduction trees equal the x86 instructions they stand for
 *     (GCC's _mm512_reduce_add_ps, the hsum_float_8 shuffle sequence), and
 *     the F16 dots equal the same loops written with AVX-512 intrinsics;
 *   - the scalar exp (ldexpf for the final scaling) equals the AVX-512
 *     formulation (vscalefps) on normal, subnormal, overflowing and NaN
 *     inputs, and is within a few ulp of exp;
 *   - the activation quantizer rounds half to even with 127/amax.
 * The parts that need an instruction set this CPU lacks print "skip". */
#include "util/common.h"
#include "cpu/ggml_kernels.h"
#include "cpu/cpu_kernels.h"
#include "test_util.h"
#include "test_weight.h"

#include <immintrin.h>
#include <string.h>

static float rand_scale(void) { return ldexpf(1.0f, (int)(rng_u32() % 24) - 12); }

static void fill(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = rng_f() * scale;
    if (n > 3) x[rng_u32() % n] = 40.0f * scale; /* one outlier channel, as the real model has */
}

static uint16_t rand_fp16_scale(void) { return li_fp32_to_fp16(ldexpf(0.5f + 0.5f * (rng_f() + 1.0f), -(int)(rng_u32() % 12))); }

/* ---- quantized dots: AVX2 (1 to 4 activation rows at once) against the reference ---- */
static void test_dots(bool avx2) {
    if (!avx2) {
        printf("skip AVX2 quantized dots: this CPU lacks AVX2/FMA/F16C\n");
        return;
    }
    static const int nbs[] = {1, 2, 3, 5, 7, 18, 19, 48};
    static li_block_q4_1 w4[48];
    static li_block_q8_0 w8[48];
    static li_block_q8_1 a1[4][48];
    static li_ggml_q8_1f a1f[4][48];
    static li_block_q8_0 a0[4][48];
    static float x[48 * 32];
    for (size_t c = 0; c < LI_ARRAY_LEN(nbs); c++) {
        const int nb = nbs[c], k = nb * 32;
        int bad4 = 0, bad8 = 0, n = 0;
        for (int rep = 0; rep < 100; rep++) {
            for (int b = 0; b < nb; b++) {
                w4[b].d = rand_fp16_scale();
                w4[b].m = li_fp32_to_fp16(-li_fp16_to_fp32(rand_fp16_scale()) * 8.0f);
                w8[b].d = rand_fp16_scale();
                for (int j = 0; j < 16; j++) w4[b].qs[j] = (uint8_t)rng_u32();
                for (int j = 0; j < 32; j++) w8[b].qs[j] = (int8_t)rng_u32(); /* -128 included */
            }
            for (int r = 0; r < 4; r++) {
                fill(x, k, rand_scale());
                li_ggml_quantize_q8_1(x, a1[r], k);
                li_ggml_widen_q8_1(a1[r], a1f[r], k);
                li_ggml_quantize_q8_0(x, a0[r], k);
            }
            for (int nr = 1; nr <= 4; nr++) {
                float o4[4], o8[4];
                li_ggml_dot4_q4_1_q8_1_avx2(k, w4, a1f, sizeof a1f[0], nr, o4);
                li_ggml_dot4_q8_0_q8_0_avx2(k, w8, a0, sizeof a0[0], nr, o8);
                for (int r = 0; r < nr; r++) {
                    const float r4 = li_ggml_dot_q4_1_q8_1_ref(k, w4, a1[r]), r8 = li_ggml_dot_q8_0_q8_0_ref(k, w8, a0[r]);
                    bad4 += memcmp(&r4, &o4[r], 4) != 0;
                    bad8 += memcmp(&r8, &o8[r], 4) != 0;
                    n++;
                }
            }
        }
        report(bad4 == 0, "q4_1 x q8_1 dot, %d blocks, 1-4 rows at once: AVX2 == reference (%d of %d differ)", nb, bad4, n);
        report(bad8 == 0, "q8_0 x q8_0 dot, %d blocks, 1-4 rows at once: AVX2 == reference (%d of %d differ)", nb, bad8, n);
    }
}

/* ---- the quantizer ---- */
static void test_quantize(void) {
    float x[64] = {0};
    x[0] = 127.0f; /* amax 127: multiplier exactly 1, so x*id is x */
    x[1] = 2.5f, x[2] = 3.5f, x[3] = -2.5f, x[4] = -0.5f, x[5] = 0.5f, x[6] = 1.5f, x[7] = 126.5f;
    li_block_q8_1 q[2];
    li_ggml_quantize_q8_1(x, q, 64);
    const int8_t want[8] = {127, 2, 4, -2, 0, 0, 2, 126};
    report(memcmp(q[0].qs, want, 8) == 0, "q8_1: halves round to even (2.5->2, 3.5->4, -2.5->-2, 126.5->126)");
    report(li_fp16_to_fp32(q[0].d) == li_fp16_to_fp32(li_fp32_to_fp16(1.0f)), "q8_1: d = amax/127");
    report(li_fp16_to_fp32(q[0].s) == 127 + 2 + 4 - 2 + 2 + 126, "q8_1: s = d * sum(q)");
    bool zero = q[1].d == 0 && q[1].s == 0;
    for (int j = 0; j < 32; j++) zero = zero && q[1].qs[j] == 0;
    report(zero, "q8_1: an all-zero block gives d = s = 0 and zero quants");
    /* the portable reference (ggml's quantize_row_q8_0_ref, and ours)
     * rounds halves away from zero: the two differ on this block */
    li_block_q8_0 e;
    li_quantize_row_q8_0_ref(x, &e, 32);
    report(e.qs[1] == 3 && e.qs[3] == -3 && q[0].qs[1] == 2,
           "q8_0: the portable reference rounds 2.5 to %d, llama.cpp's x86 code to %d", e.qs[1], q[0].qs[1]);
}

/* the AVX2 quantizer against the reference: random rows at many scales,
 * exact halves, zeros, -0, NaN, huge and subnormal values (a subnormal amax
 * makes the multiplier infinite: both give vcvtps2dq's INT32_MIN) */
static void test_quantize_avx2(bool avx2) {
    if (!avx2) {
        printf("skip AVX2 quantizer: this CPU lacks AVX2/FMA/F16C\n");
        return;
    }
    enum { K = 8 * 32 };
    static float x[K];
    static li_block_q8_1 r1[K / 32], f1[K / 32];
    static li_block_q8_0 r0[K / 32], f0[K / 32];
    int bad = 0, n = 0;
    for (int rep = 0; rep < 2000; rep++) {
        fill(x, K, rand_scale());
        if (rep % 5 == 1)
            for (int j = 0; j < K; j++) x[j] = (float)((int)(rng_u32() % 255) - 127) * 0.5f; /* halves, amax 63.5 */
        if (rep % 7 == 2) memset(x + 32, 0, 32 * sizeof(float));
        if (rep % 11 == 3) x[rng_u32() % K] = NAN;
        if (rep % 13 == 4) x[rng_u32() % K] = (rng_u32() & 1) ? 3e38f : 1e-44f;
        if (rep % 19 == 6) { /* a block whose largest value is subnormal */
            memset(x + 64, 0, 32 * sizeof(float));
            x[64 + rng_u32() % 32] = -1e-40f;
        }
        if (rep % 17 == 5) x[rng_u32() % K] = -0.0f;
        li_ggml_quantize_q8_1(x, r1, K);
        li_ggml_quantize_q8_1_avx2(x, f1, K);
        li_ggml_quantize_q8_0(x, r0, K);
        li_ggml_quantize_q8_0_avx2(x, f0, K);
        bad += memcmp(r1, f1, sizeof r1) != 0;
        bad += memcmp(r0, f0, sizeof r0) != 0;
        n += 2;
    }
    report(bad == 0, "quantize q8_0/q8_1: AVX2 == reference on %d rows (%d differ)", n, bad);
}

/* ---- reductions and F16 dots against the instructions ---- */
__attribute__((target("avx512f"))) static float hw_reduce16(const float *v) {
    return _mm512_reduce_add_ps(_mm512_loadu_ps(v));
}

__attribute__((target("avx"))) static float hw_hsum8(const float *v) {
    const __m256 x = _mm256_loadu_ps(v);
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

__attribute__((target("avx512f"))) static float hw_dot_vec(int64_t n, const float *x, const float *y) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    const int64_t np = n & ~(int64_t)63;
    for (int64_t i = 0; i < np; i += 64)
        for (int r = 0; r < 4; r++)
            acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16 * r), _mm512_loadu_ps(y + i + 16 * r), acc[r]);
    acc[0] = _mm512_add_ps(acc[0], acc[2]);
    acc[1] = _mm512_add_ps(acc[1], acc[3]);
    acc[0] = _mm512_add_ps(acc[0], acc[1]);
    double s = _mm512_reduce_add_ps(acc[0]);
    for (int64_t i = np; i < n; i++) s += (double)(x[i] * y[i]);
    return (float)s;
}

__attribute__((target("avx512f"))) static float hw_dot_gemm(int64_t n, const float *x, const float *y) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), acc);
    return _mm512_reduce_add_ps(acc);
}

static void wide(float *v, int n) { /* values over many magnitudes, so the order of sums shows */
    for (int i = 0; i < n; i++) v[i] = ldexpf(rng_f(), (int)(rng_u32() % 40) - 20);
}

static void test_reductions(bool avx512) {
    int bad = 0;
    for (int t = 0; t < 20000; t++) {
        float v[8];
        wide(v, 8);
        const float a = li_ggml_hsum8(v), b = hw_hsum8(v);
        bad += memcmp(&a, &b, 4) != 0;
    }
    report(bad == 0, "hsum8 == the AVX shuffle sequence of hsum_float_8 (%d of 20000 differ)", bad);
    if (!avx512) {
        printf("skip reduce16 / F16 dot orders against AVX-512: this CPU lacks AVX-512F\n");
        return;
    }
    bad = 0;
    for (int t = 0; t < 20000; t++) {
        float v[16];
        wide(v, 16);
        const float a = li_ggml_hsum16(v), b = hw_reduce16(v);
        bad += memcmp(&a, &b, 4) != 0;
    }
    report(bad == 0, "hsum16 == _mm512_reduce_add_ps (%d of 20000 differ)", bad);
    static const int ns[] = {16, 48, 64, 80, 128, 208, 256, 1024};
    for (size_t c = 0; c < LI_ARRAY_LEN(ns); c++) {
        const int n = ns[c];
        float x[1024], y[1024];
        int bv = 0, bg = 0;
        for (int t = 0; t < 300; t++) {
            wide(x, n);
            wide(y, n);
            for (int i = 0; i < n; i++) x[i] = li_fp16_to_fp32(li_fp32_to_fp16(x[i]));
            float a = li_ggml_dot_f16_vec(n, x, y), b = hw_dot_vec(n, x, y);
            bv += memcmp(&a, &b, 4) != 0;
            a = li_ggml_dot_f16_gemm(n, x, y), b = hw_dot_gemm(n, x, y);
            bg += memcmp(&a, &b, 4) != 0;
        }
        report(bv == 0 && bg == 0, "F16 dots of %d: vec order %d, gemm order %d of 300 differ from AVX-512", n, bv, bg);
    }
}

/* ---- exp ---- */
__attribute__((target("avx512f"))) static float hw_expf(float xs) {
    /* the same range reduction and polynomial, with vscalefps for 2^n */
    const __m512 x = _mm512_set1_ps(xs), shift = _mm512_set1_ps(0x1.8p23f);
    const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), shift);
    const __m512 n = _mm512_sub_ps(z, shift);
    const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f),
                                      _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
    const __m512 u = _mm512_mul_ps(b, b);
    const __m512 p = _mm512_fmadd_ps(
        _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)), u,
                        _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f))),
        u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f)));
    __m512 r = _mm512_scalef_ps(p, n);
    const __mmask16 big = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192), _CMP_GT_OQ);
    const __m512 sat = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ),
                                            _mm512_set1_ps(INFINITY), _mm512_setzero_ps());
    r = _mm512_mask_blend_ps(big, r, sat);
    return _mm512_cvtss_f32(r);
}

static void test_expf(bool avx512) {
    int far = 0;
    for (int t = 0; t < 200000; t++) {
        const float x = rng_f() * 87.0f;
        const double e = exp((double)x), g = li_ggml_expf(x);
        far += fabs(g - e) > 4e-7 * e;
    }
    report(far == 0, "expf within 4e-7 relative of exp on [-87, 87] (%d of 200000 further)", far);
    report(li_ggml_expf(-INFINITY) == 0.0f && li_ggml_expf(200.0f) == INFINITY && isnan(li_ggml_expf(NAN)) &&
               li_ggml_expf(0.0f) == 1.0f,
           "expf: -inf -> 0, 200 -> inf, NaN -> NaN, 0 -> 1");
    if (!avx512) {
        printf("skip expf against vscalefps: this CPU lacks AVX-512F\n");
        return;
    }
    int bad = 0, n = 0;
    for (int t = 0; t < 300000; t++) {
        float x;
        switch (t % 4) {
        case 0: x = rng_f() * 90.0f; break;
        case 1: x = -87.0f - 20.0f * (rng_f() + 1.0f); break; /* subnormal results and underflow */
        case 2: x = 88.0f + 2.0f * rng_f(); break;            /* overflow edge */
        default: x = ldexpf(rng_f(), (int)(rng_u32() % 30) - 20); break;
        }
        const float a = li_ggml_expf(x), b = hw_expf(x);
        bad += memcmp(&a, &b, 4) != 0;
        n++;
    }
    const float specials[] = {INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 192.5f, -192.5f, 1e30f, -1e30f};
    for (size_t i = 0; i < LI_ARRAY_LEN(specials); i++) {
        const float a = li_ggml_expf(specials[i]), b = hw_expf(specials[i]);
        bad += !(memcmp(&a, &b, 4) == 0 || (isnan(a) && isnan(b)));
        n++;
    }
    report(bad == 0, "expf == the AVX-512 formulation on %d inputs (normal, subnormal, overflow, special): %d differ", n,
           bad);
}

/* ---- attention and SiLU: the FMA build of ggml_impl.h against the generic one ---- */
static void test_attention(bool avx2) {
    if (!avx2) {
        printf("skip ggml attention/SiLU FMA build: this CPU lacks AVX2/FMA/F16C\n");
        return;
    }
    enum { BS = 16, NB = 24, MAXP = NB * BS };
    static const li_type dts[] = {LI_TYPE_F16, LI_TYPE_BF16, LI_TYPE_F32};
    static const struct { int nh, nkv, D; } shapes[] = {{9, 3, 64}, {4, 4, 48}, {2, 1, 80}};
    int32_t table[NB];
    for (int b = 0; b < NB; b++) table[b] = (b * 7 + 3) % NB; /* scattered blocks */
    for (size_t di = 0; di < LI_ARRAY_LEN(dts); di++)
        for (size_t si = 0; si < LI_ARRAY_LEN(shapes); si++) {
            const int nh = shapes[si].nh, nkv = shapes[si].nkv, D = shapes[si].D;
            const size_t es = li_kv_elem_size(dts[di]), n_el = (size_t)MAXP * nkv * D;
            li_kv_layer kv = {.dtype = dts[di], .k = malloc(n_el * es), .v = malloc(n_el * es)};
            for (size_t e = 0; e < n_el; e++) {
                const float kx = rng_f() * 3.0f, vx = rng_f();
                if (dts[di] == LI_TYPE_F32) ((float *)kv.k)[e] = kx, ((float *)kv.v)[e] = vx;
                else if (dts[di] == LI_TYPE_F16) ((uint16_t *)kv.k)[e] = li_fp32_to_fp16(kx), ((uint16_t *)kv.v)[e] = li_fp32_to_fp16(vx);
                else ((uint16_t *)kv.k)[e] = li_fp32_to_bf16(kx), ((uint16_t *)kv.v)[e] = li_fp32_to_bf16(vx);
            }
            static const int32_t pos[] = {0, 1, 15, 16, 63, 64, 100, 255, 300, MAXP - 1};
            const int n = (int)LI_ARRAY_LEN(pos);
            int32_t seq[LI_ARRAY_LEN(pos)] = {0};
            float *q = malloc(sizeof(float) * n * nh * D), *o1 = malloc(sizeof(float) * n * nh * D),
                  *o2 = malloc(sizeof(float) * n * nh * D);
            for (int e = 0; e < n * nh * D; e++) q[e] = rng_f() * 2.0f;
            float *scr = malloc(li_ggml_attn_scratch(MAXP, nh / nkv) * sizeof(float));
            float *o3 = malloc(sizeof(float) * n * nh * D);
            int bad = 0, bad_group = 0;
            for (int gemm = 0; gemm < 2; gemm++) {
                li_attn_args a = {.n_tokens = n, .n_head = nh, .n_head_kv = nkv, .head_dim = D, .block_size = BS,
                                  .q = q, .pos = pos, .seq = seq, .block_table = table, .bt_stride = NB, .kv = &kv,
                                  .scale = 1.0f / sqrtf((float)D)};
                for (int i = 0; i < n; i++)
                    for (int h = 0; h < nh; h++) {
                        a.out = o1;
                        li_ggml_attn_heads(&a, i, h, 1, gemm, scr);
                        a.out = o2;
                        li_ggml_attn_heads_avx2(&a, i, h, 1, gemm, scr);
                    }
                bad += memcmp(o1, o2, sizeof(float) * n * nh * D) != 0;
                /* a kv head's whole group at once: the same bits as one by one */
                const int G = nh / nkv;
                for (int i = 0; i < n; i++)
                    for (int kvh = 0; kvh < nkv; kvh++) {
                        a.out = o3;
                        (gemm ? li_ggml_attn_heads_avx2 : li_ggml_attn_heads)(&a, i, kvh * G, G, gemm, scr);
                    }
                bad_group += memcmp(o1, o3, sizeof(float) * n * nh * D) != 0;
            }
            report(bad == 0, "attention %s, %d heads / %d kv, dim %d, positions 0..%d, vec and gemm order: FMA build == "
                   "reference", li_type_name(dts[di]), nh, nkv, D, MAXP - 1);
            report(bad_group == 0, "attention %s, %d heads / %d kv, dim %d: a group of %d heads at once == one by one",
                   li_type_name(dts[di]), nh, nkv, D, nh / nkv);
            free(q), free(o1), free(o2), free(o3), free(scr), free(kv.k), free(kv.v);
        }
    static float g1[1539], g2[1539], u[1539];
    for (int i = 0; i < 1539; i++) g1[i] = g2[i] = rng_f() * 30.0f, u[i] = rng_f();
    li_ggml_silu_mul(g1, u, 1539);
    li_ggml_silu_mul_avx2(g2, u, 1539);
    report(memcmp(g1, g2, sizeof g1) == 0, "silu_mul of 1539: FMA build == reference");
}

/* ---- the backend: threads, 1-4 row blocking and the batch-size rule ---- */
static void fill_row(float *row, int64_t k) { fill(row, k, rand_scale()); }

static void test_backend(void) {
    li_backend be;
    li_error err = {0};
    if (li_backend_cpu_init(&be, 2, "ggml", &err)) {
        report(false, "li_backend_cpu_init(\"ggml\"): %s", err.msg);
        return;
    }
    report(!strcmp(li_backend_cpu_isa(&be), "ggml") && !strcmp(be.ops->name, "cpu-ggml"), "isa \"ggml\" gives the ggml backend");
    static const li_type types[] = {LI_TYPE_Q4_1, LI_TYPE_Q8_0};
    static const int ns[] = {1, 3, 4, 7};
    for (size_t ti = 0; ti < LI_ARRAY_LEN(types); ti++) {
        const int64_t k = 96, m = 37; /* odd row count: a partial last item */
        test_weight tw;
        test_weight_make(&tw, types[ti], k, m, fill_row);
        int bad = 0;
        for (size_t ni = 0; ni < LI_ARRAY_LEN(ns); ni++) {
            const int n = ns[ni];
            float x[7 * 96], y[7 * 37];
            for (int e = 0; e < n * k; e++) x[e] = rng_f() * 3.0f;
            be.ops->matmul(&be, &tw.w, x, y, n);
            for (int r = 0; r < n; r++) {
                li_block_q8_1 a1[3];
                li_block_q8_0 a0[3];
                for (int64_t i = 0; i < m; i++) {
                    const void *wr = (const char *)tw.w.data + i * tw.w.row_bytes;
                    float want;
                    if (types[ti] == LI_TYPE_Q4_1) {
                        li_ggml_quantize_q8_1(x + r * k, a1, k);
                        want = li_ggml_dot_q4_1_q8_1_ref(k, wr, a1);
                    } else {
                        li_ggml_quantize_q8_0(x + r * k, a0, k);
                        want = li_ggml_dot_q8_0_q8_0_ref(k, wr, a0);
                    }
                    bad += memcmp(&want, &y[r * m + i], 4) != 0;
                }
            }
        }
        report(bad == 0, "ggml backend matmul, %s, 1/3/4/7 rows over 2 threads == reference dots (%d differ)",
               li_type_name(types[ti]), bad);
        test_weight_free(&tw);
    }
    /* attention: a batch of one token takes the vec order, of 2+ the gemm order */
    enum { BS = 16, NB = 8, D = 64, NH = 4, NKV = 2 };
    int32_t table[NB];
    for (int b = 0; b < NB; b++) table[b] = NB - 1 - b;
    static uint16_t kb[NB * BS * NKV * D], vb[NB * BS * NKV * D];
    for (size_t e = 0; e < LI_ARRAY_LEN(kb); e++) kb[e] = li_fp32_to_fp16(rng_f() * 3.0f), vb[e] = li_fp32_to_fp16(rng_f());
    li_kv_layer kv = {.dtype = LI_TYPE_F16, .k = kb, .v = vb};
    const int32_t pos[3] = {70, 71, 72};
    const int32_t seq[3] = {0, 0, 0};
    static float q[3 * NH * D], out[3 * NH * D], want[3 * NH * D];
    for (size_t e = 0; e < LI_ARRAY_LEN(q); e++) q[e] = rng_f() * 2.0f;
    float *scr = malloc(li_ggml_attn_scratch(72, 1) * sizeof(float));
    for (int n = 1; n <= 3; n += 2) {
        li_attn_args a = {.n_tokens = n, .n_head = NH, .n_head_kv = NKV, .head_dim = D, .block_size = BS, .q = q,
                          .out = out, .pos = pos, .seq = seq, .block_table = table, .bt_stride = NB, .kv = &kv, .scale = 0.125f};
        be.ops->attention(&be, &a);
        a.out = want;
        for (int i = 0; i < n; i++)
            for (int h = 0; h < NH; h++) li_ggml_attn_heads(&a, i, h, 1, n >= 2, scr);
        report(memcmp(out, want, sizeof(float) * n * NH * D) == 0,
               "ggml backend attention, batch of %d: the %s order, over 2 threads", n, n >= 2 ? "gemm" : "vec");
    }
    /* and the two orders do differ somewhere, or the rule would be untested */
    li_attn_args a = {.n_tokens = 1, .n_head = NH, .n_head_kv = NKV, .head_dim = D, .block_size = BS, .q = q,
                      .out = out, .pos = pos, .seq = seq, .block_table = table, .bt_stride = NB, .kv = &kv, .scale = 0.125f};
    int differ = 0;
    for (int h = 0; h < NH; h++) {
        a.out = out;
        li_ggml_attn_heads(&a, 0, h, 1, 0, scr);
        a.out = want;
        li_ggml_attn_heads(&a, 0, h, 1, 1, scr);
        differ += memcmp(out + h * D, want + h * D, sizeof(float) * D) != 0;
    }
    report(differ > 0, "the vec and gemm orders give different bits (%d of %d heads)", differ, NH);
    free(scr);
    li_backend_cpu_free(&be);
}

int main(void) {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && li_cpu_has_f16c();
    const bool avx512 = __builtin_cpu_supports("avx512f");
    test_dots(avx2);
    test_quantize();
    test_quantize_avx2(avx2);
    test_reductions(avx512);
    test_expf(avx512);
    test_attention(avx2);
    test_backend();
    return t_summary("ggml_kernels");
}
