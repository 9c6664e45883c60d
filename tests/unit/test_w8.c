/* test_w8.c — the W8A8 (int8) and FP8 (e4m3) scheme kernels (kernels/cpu/w8*.c).
 *
 * At odd sizes (SIMD tails, 4x2 / 2x2 register blocks cut short):
 *  - every ISA this CPU has gives the scalar kernel's bits, through the
 *    CPU backend (weight_prepare + matmul / matmul_add, 2 threads);
 *  - batch invariance: each row of an n-row product equals the row alone;
 *  - the activation quantization is li_act_quant_row_ref's (same codes);
 *  - the reference backend's matmul (ops_ref.c runs the scalar kernel for
 *    these) gives the same bits; the kernels agree with the float
 *    definition (li_weight_dequant_row_ref times li_act_quant_row_ref,
 *    summed in double) to f32 rounding, NMSE < 1e-10, and the dot is
 *    checked against a double-precision sum of the codes (int8: equal;
 *    fp8: within the f32 rounding bound);
 *  - matmul_multi (one activation quantization for q/k/v) equals the
 *    weights' own matmuls;
 *  - the fp8 widening equals li_fp8_e4m3_to_fp32 for all 254 finite codes;
 *  - the SIMD e4m3 encoder equals li_fp32_to_fp8_e4m3 on ~1.3M floats
 *    (a stride through all bit patterns, halfway cases, subnormals, 448 /
 *    464 saturation, inf, NaN);
 *  - the fp8 gemms called directly (AVX2 FMA form, AVX-512 BF16) equal the
 *    scalar one bit for bit at odd k, batch 1..70, split tiles; 1 == 2 threads.
 * One line per check; the last line is the summary. */
#include "util/common.h"
#include "backend.h"
#include "cpu/cpu_kernels.h"
#include "cpu/w8_kernels.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *isas[4];
static int n_isas;

static void isas_find(void) {
    __builtin_cpu_init();
    isas[n_isas++] = "scalar";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) isas[n_isas++] = "avx2";
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni"))
        isas[n_isas++] = "avx512";
    else
        printf("skip: avx512 (this CPU lacks AVX-512 VNNI; the kernel is compiled, not run)\n");
    if (n_isas == 3 && li_cpu_amx_usable()) isas[n_isas++] = "amx";
    else printf("skip: amx (no usable AMX-TILE/AMX-INT8 here; its int8 panel gemm is compiled, not run)\n");
}

/* A scheme weight of m rows of k, quantized per row as `luainfer quantize`
 * does (core/quant/quantize.c: emit_scheme). Large outlier columns, as the
 * model has. */
typedef struct {
    li_weight w;
    void *codes;
    float *scales;
} tw;

static void tw_make(tw *t, li_scheme scheme, int64_t m, int64_t k) {
    float *f = li_xmalloc((size_t)(m * k) * sizeof(float));
    for (int64_t i = 0; i < m * k; i++) f[i] = rng_f() * (i % 17 == 3 ? 4.0f : 0.5f);
    int8_t *codes = li_xmalloc((size_t)(m * k));
    float *sc = li_xmalloc((size_t)m * sizeof(float));
    const float qmax = scheme == LI_SCHEME_W8A8 ? 127.0f : 448.0f;
    for (int64_t r = 0; r < m; r++) {
        float amax = 0;
        for (int64_t j = 0; j < k; j++) amax = fmaxf(amax, fabsf(f[r * k + j]));
        sc[r] = amax / qmax;
        const float inv = sc[r] > 0 ? 1.0f / sc[r] : 0.0f;
        for (int64_t j = 0; j < k; j++)
            codes[r * k + j] = scheme == LI_SCHEME_W8A8 ? (int8_t)li_code_round(f[r * k + j] * inv, -127, 127)
                                                        : (int8_t)li_fp32_to_fp8_e4m3(f[r * k + j] * inv);
    }
    free(f);
    memset(t, 0, sizeof *t);
    t->codes = codes;
    t->scales = sc;
    t->w = (li_weight){.type = scheme == LI_SCHEME_W8A8 ? LI_KV_TYPE_INT8 : LI_KV_TYPE_FP8_E4M3, .k = k, .m = m,
                       .row_bytes = (size_t)k, .data = codes, .scheme = scheme,
                       .act = scheme == LI_SCHEME_W8A8 ? LI_ACT_INT8 : LI_ACT_FP8, .scales = sc, .name = "t"};
}

static void tw_free(tw *t) {
    free(t->codes);
    free(t->scales);
}

static void fill_x(float *x, int64_t n, int64_t k) {
    for (int64_t i = 0; i < n * k; i++) x[i] = rng_f() * ((i % k) % 29 == 5 ? 30.0f : 1.0f); /* outlier channels */
}

static int n_packed; /* backend runs on int8 panels (w8_kernels.h) */

/* y = x . W^T through a CPU backend of `isa` (2 threads): matmul, and
 * matmul_add on a copy of res */
static int run_backend(const char *isa, tw *t, const float *x, float *y, float *res, int64_t n) {
    li_backend be;
    li_error err = {0};
    if (li_backend_cpu_init(&be, 2, isa, &err)) {
        printf("FAIL cpu init %s: %s\n", isa, err.msg);
        return -1;
    }
    int rc = be.ops->weight_prepare(&be, &t->w);
    n_packed += !rc && li_w8_packed_of(&t->w) != NULL;
    if (!rc) {
        be.ops->matmul(&be, &t->w, x, y, n);
        if (res) {
            float *tmp = li_xmalloc((size_t)(n * t->w.m) * sizeof(float));
            be.ops->matmul_add(&be, &t->w, x, tmp, res, n);
            free(tmp);
        }
        be.ops->weight_release(&be, &t->w);
    }
    li_backend_cpu_free(&be);
    return rc;
}

static bool same_bits(const float *a, const float *b, int64_t n) { return !memcmp(a, b, (size_t)n * sizeof(float)); }

/* ------------------------------------------------------------------------
 * checks
 * ---------------------------------------------------------------------- */

static void check_widen(void) {
    int bad = 0;
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f) continue; /* NaN: never written */
        float a = li_w8_fp8_widen((uint8_t)c), b = li_fp8_e4m3_to_fp32((uint8_t)c);
        bad += memcmp(&a, &b, 4) != 0;
    }
    report(bad == 0, "fp8 widen == li_fp8_e4m3_to_fp32 for the 254 finite codes (%d differ)", bad);
}

static void check_act_quant(void) {
    for (int ii = 0; ii < n_isas; ii++) {
        const li_w8_kernels *kern = li_w8_kernels_for(isas[ii]);
        int bad = 0;
        static const int64_t ks[] = {1, 7, 31, 32, 33, 100, 577};
        for (size_t ki = 0; ki < LI_ARRAY_LEN(ks); ki++) {
            const int64_t k = ks[ki];
            float *x = li_xmalloc((size_t)k * 4), *ref = li_xmalloc((size_t)k * 4);
            uint16_t *xf = li_xmalloc((size_t)LI_W8_FP8_LDA(k) * 2);
            int8_t *q = li_xmalloc((size_t)k);
            fill_x(x, 1, k);
            x[0] = 0.5f * (x[1 % k] + 0.0f); /* a tie candidate */
            float s;
            kern->quantize_int8(x, k, q, &s);
            li_act_quant_row_ref(LI_ACT_INT8, x, ref, k);
            for (int64_t j = 0; j < k; j++) bad += (float)q[j] * s != ref[j];
            kern->quantize_fp8(x, k, xf, &s);
            li_act_quant_row_ref(LI_ACT_FP8, x, ref, k);
            for (int64_t j = 0; j < k; j++) bad += li_bf16_to_fp32(xf[j]) * s != ref[j];
            for (int64_t j = k; j < LI_W8_FP8_LDA(k); j++) bad += xf[j] != 0; /* the padding */
            free(x), free(ref), free(xf), free(q);
        }
        float z[40] = {0}, s = -1;
        int8_t q[40];
        kern->quantize_int8(z, 40, q, &s);
        for (int j = 0; j < 40; j++) bad += q[j] != 0;
        bad += s != 0;
        report(bad == 0, "%s: activation quantization is li_act_quant_row_ref's (int8, fp8, zero row) (%d differ)",
               isas[ii], bad);
    }
}

static void check_scheme(li_scheme scheme) {
    const char *sn = li_scheme_name(scheme);
    /* k % 4 == 0 runs int8 panels on AVX-512 (w8_kernels.h); m 17 and 70:
     * a short last panel, 5 panels (a full group of 4 and a tail); n 13:
     * two row groups of 6 and one row */
    static const int64_t ks[] = {1, 31, 33, 64, 100, 577};
    static const int64_t ms[] = {1, 3, 5, 17, 70};
    static const int64_t ns[] = {1, 2, 3, 13, 66};
    int bad_isa = 0, bad_inv = 0, bad_add = 0, n_cases = 0, bad_exact = 0;
    double worst = 0;
    for (size_t ki = 0; ki < LI_ARRAY_LEN(ks); ki++)
        for (size_t mi = 0; mi < LI_ARRAY_LEN(ms); mi++)
            for (size_t ni = 0; ni < LI_ARRAY_LEN(ns); ni++) {
                const int64_t k = ks[ki], m = ms[mi], n = ns[ni];
                tw t;
                tw_make(&t, scheme, m, k);
                float *x = li_xmalloc((size_t)(n * k) * 4);
                fill_x(x, n, k);
                float *y0 = li_xmalloc((size_t)(n * m) * 4), *y = li_xmalloc((size_t)(n * m) * 4);
                float *res0 = li_xcalloc((size_t)(n * m), 4), *res = li_xcalloc((size_t)(n * m), 4);
                for (int64_t i = 0; i < n * m; i++) res0[i] = res[i] = rng_f();
                float *yref = li_xmalloc((size_t)(n * m) * 4);
                run_backend("scalar", &t, x, y0, res0, n);
                /* the reference backend's matmul runs these very kernels
                 * (ops_ref.c); the float definition: dequantized weights
                 * (li_weight_dequant_row_ref) times the activations as
                 * li_act_quant_row_ref leaves them, summed in double */
                li_backend ref = {.ops = li_backend_ref_ops(), .n_threads = 1};
                li_backend_ref_ops()->matmul(&ref, &t.w, x, yref, n);
                bad_isa += !same_bits(y0, yref, n * m);
                {
                    float *wd = li_xmalloc((size_t)k * 4), *xq = li_xmalloc((size_t)(n * k) * 4);
                    for (int64_t r = 0; r < n; r++) li_act_quant_row_ref(t.w.act, x + r * k, xq + r * k, k);
                    for (int64_t c = 0; c < m; c++) {
                        li_weight_dequant_row_ref(&t.w, c, wd);
                        for (int64_t r = 0; r < n; r++) {
                            double d = 0;
                            for (int64_t j = 0; j < k; j++) d += (double)xq[r * k + j] * wd[j];
                            yref[r * m + c] = (float)d;
                        }
                    }
                    free(wd), free(xq);
                }
                worst = fmax(worst, nmse(y0, yref, n * m));
                /* the dot against a double sum of the same codes: equal for
                 * int8 (exact); for fp8 within the f32 rounding of its
                 * 2 k - 1 adds, |err| <= 2k * 2^-24 * sum |products| */
                for (int64_t r = 0; r < n && r < 2; r++) {
                    uint16_t *qa = li_xmalloc((size_t)LI_W8_FP8_LDA(k) * 2);
                    int8_t *qi = li_xmalloc((size_t)k);
                    float sa;
                    if (scheme == LI_SCHEME_W8A8) li_w8_kernels_scalar.quantize_int8(x + r * k, k, qi, &sa);
                    else li_w8_kernels_scalar.quantize_fp8(x + r * k, k, qa, &sa);
                    for (int64_t c = 0; c < m; c++) {
                        double d = 0, mag = 0;
                        for (int64_t j = 0; j < k; j++) {
                            const uint8_t code = ((const uint8_t *)t.codes)[c * k + j];
                            const double p = scheme == LI_SCHEME_W8A8 ? (double)(int8_t)code * qi[j]
                                                                      : (double)li_fp8_e4m3_to_fp32(code) *
                                                                            li_bf16_to_fp32(qa[j]);
                            d += p, mag += fabs(p);
                        }
                        const double got = (double)y0[r * m + c] / ((double)sa * t.scales[c]);
                        if (scheme == LI_SCHEME_W8A8) bad_exact += y0[r * m + c] != (float)d * (sa * t.scales[c]);
                        else bad_exact += !(fabs(got - d) <= 2.0 * (double)k * 0x1p-24 * mag + 4 * 0x1p-24 * fabs(d));
                    }
                    free(qa), free(qi);
                }
                for (int ii = 1; ii < n_isas; ii++) {
                    for (int64_t i = 0; i < n * m; i++) res[i] = res0[i] - y0[i]; /* undo, then redo */
                    run_backend(isas[ii], &t, x, y, res, n);
                    bad_isa += !same_bits(y, y0, n * m);
                    bad_add += !same_bits(res, res0, n * m);
                }
                /* batch invariance: each row alone */
                for (int ii = 0; ii < n_isas && n > 1; ii++)
                    for (int64_t r = 0; r < n; r += (n > 4 ? 13 : 1)) {
                        run_backend(isas[ii], &t, x + r * k, y, NULL, 1);
                        bad_inv += !same_bits(y, y0 + r * m, m);
                    }
                n_cases++;
                free(x), free(y0), free(y), free(res0), free(res), free(yref);
                tw_free(&t);
            }
    report(bad_isa == 0 && bad_add == 0, "%s: the reference and every ISA give the scalar kernel's bits, matmul and matmul_add "
           "(%d cases, %d / %d differ)", sn, n_cases, bad_isa, bad_add);
    report(bad_inv == 0, "%s: batch invariance, each row alone == in its batch (%d differ)", sn, bad_inv);
    if (scheme == LI_SCHEME_W8A8 && n_isas >= 3) /* AVX-512 packs k % 4 == 0: those cases must have run on panels */
        report(n_packed > 0, "w8a8: %d of the avx512 runs were on int8 panels", n_packed);
    else if (scheme == LI_SCHEME_W8A8)
        printf("skip w8a8 int8 panels: this CPU has no AVX-512 (the only ISA with a packed kernel)\n");
    n_packed = 0;
    report(bad_exact == 0, "%s: the dot is %s a double sum of the codes (%d differ)", sn,
           scheme == LI_SCHEME_W8A8 ? "exactly" : "within f32 rounding of", bad_exact);
    report(worst < 1e-10, "%s: agrees with the float definition (double sums), worst NMSE %.3g", sn, worst);
}

/* the scalar encoder's bits: bf16 of li_fp32_to_fp8_e4m3's value */
static uint16_t fp8_ref_bf16(float v) {
    const float f = li_w8_fp8_widen(li_fp32_to_fp8_e4m3(v));
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static float f32_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The SIMD e4m3 encoder against li_fp32_to_fp8_e4m3 on a stride through
 * every f32 bit pattern, every e4m3 value and its halfway points +- 2 ulps,
 * both signs, the subnormal steps, 448 / 464 / 480, inf, NaN, random. */
static void check_encoder(void) {
    if (n_isas < 2) {
        printf("skip: fp8 encoder (no AVX2 on this CPU)\n");
        return;
    }
    enum { N = 1 << 16 };
    float *v = li_xmalloc(N * sizeof(float));
    uint16_t *got = li_xmalloc(N * 2);
    int64_t n_tested = 0, bad = 0;
    int nv = 0;
#define FLUSH()                                                                \
    do {                                                                       \
        li_w8_fp8_encode_avx2(v, nv, got);                                     \
        for (int i_ = 0; i_ < nv; i_++) bad += got[i_] != fp8_ref_bf16(v[i_]); \
        n_tested += nv, nv = 0;                                                \
    } while (0)
#define PUT(f)                   \
    do {                         \
        v[nv++] = (f);           \
        if (nv == N) FLUSH();    \
    } while (0)
    for (uint64_t u = 0; u < (1ull << 32); u += 4093) PUT(f32_of((uint32_t)u));
    for (int c = 0; c < 127; c++) { /* each value, and the midpoint to the next */
        const float lo = li_fp8_e4m3_to_fp32((uint8_t)c), hi = li_fp8_e4m3_to_fp32((uint8_t)(c + 1));
        const float pts[2] = {lo, c < 126 ? 0.5f * (lo + hi) : 464.0f};
        for (int p = 0; p < 2; p++) {
            uint32_t b;
            memcpy(&b, &pts[p], 4);
            for (int d = -2; d <= 2; d++)
                if (b + (uint32_t)d < 0x7f800000u) {
                    PUT(f32_of(b + (uint32_t)d));
                    PUT(-f32_of(b + (uint32_t)d));
                }
        }
    }
    const float special[] = {0.0f, -0.0f, 448.0f, 448.00003f, 463.99997f, 464.0f, 464.00003f, 480.0f, 1e30f,
                             INFINITY, -INFINITY, NAN, -NAN, 0x1p-6f, 0x1p-7f, 0x1p-9f, 0x1p-10f, 0x1.8p-10f,
                             0x1p-126f, 0x1p-149f, 0x1.fffffep-7f};
    for (size_t i = 0; i < LI_ARRAY_LEN(special); i++) {
        PUT(special[i]);
        PUT(-special[i]);
    }
    for (int i = 0; i < 200000; i++) PUT(rng_f() * 500.0f * (i % 3 == 0 ? 0.001f : 1.0f));
    FLUSH();
#undef PUT
#undef FLUSH
    report(bad == 0, "fp8 SIMD encoder == li_fp32_to_fp8_e4m3 on %lld floats (%lld differ)", (long long)n_tested,
           (long long)bad);
    free(v), free(got);
}

/* The fp8 gemm of every ISA (and the AVX2 FMA form the AVX-512 table falls
 * back to without BF16) called directly, bit for bit with the scalar one,
 * for odd k, weight row counts, batch 1..70 and tiles cut at odd rows. */
static void check_fp8_gemm_direct(void) {
    typedef void (*gemm_fn)(const uint8_t *, const float *, int64_t, int64_t, int64_t, const uint16_t *,
                            const float *, int64_t, int64_t, float *, int64_t);
    gemm_fn fns[4];
    const char *names[4];
    int nf = 0;
    if (n_isas >= 2) fns[nf] = li_w8_gemm_fp8_avx2, names[nf++] = "avx2 (FMA)";
    if (n_isas >= 3) fns[nf] = li_w8_kernels_for("avx512")->gemm_fp8, names[nf++] = "avx512";
    static const int64_t ks[] = {1, 2, 15, 31, 32, 33, 63, 65, 97, 130, 577};
    static const int64_t ms[] = {1, 3, 4, 5, 11};
    int64_t n_cases = 0, bad[4] = {0}, n_rounded = 0;
    for (size_t ki = 0; ki < LI_ARRAY_LEN(ks); ki++)
        for (size_t mi = 0; mi < LI_ARRAY_LEN(ms); mi++) {
            const int64_t k = ks[ki], m = ms[mi], lda = LI_W8_FP8_LDA(k);
            const int64_t nmax = ki % 3 == 0 ? 70 : 9;
            tw t;
            tw_make(&t, LI_SCHEME_FP8, m, k);
            float *x = li_xmalloc((size_t)(nmax * k) * 4), *sa = li_xmalloc((size_t)nmax * 4);
            uint16_t *qa = li_xmalloc((size_t)(nmax * lda) * 2);
            if (ki % 2) {
                fill_x(x, nmax, k);
            } else { /* every e4m3 code and magnitudes 2^-9..448: the f32 sums round often */
                uint8_t *codes = t.codes;
                for (int64_t i = 0; i < m * k; i++) {
                    codes[i] = (uint8_t)rng_u32();
                    if ((codes[i] & 0x7f) == 0x7f) codes[i] ^= 1; /* not NaN */
                }
                for (int64_t i = 0; i < nmax * k; i++) x[i] = ldexpf(1.0f + 0.5f * rng_f(), (int)(rng_u32() % 18) - 9);
            }
            for (int64_t r = 0; r < nmax; r++) li_w8_kernels_scalar.quantize_fp8(x + r * k, k, qa + r * lda, &sa[r]);
            float *y0 = li_xmalloc((size_t)(nmax * m) * 4), *y = li_xmalloc((size_t)(nmax * m) * 4);
            for (int64_t n = 1; n <= nmax; n += (n < 9 ? 1 : 7)) {
                li_w8_kernels_scalar.gemm_fp8(t.w.data, t.scales, k, 0, m, qa, sa, 0, n, y0, m);
                if (n == 1) /* does the order matter here: the f32 dot != the exact (double) one */
                    for (int64_t c = 0; c < m; c++) {
                        double d = 0;
                        for (int64_t j = 0; j < k; j++)
                            d += (double)li_fp8_e4m3_to_fp32(((const uint8_t *)t.codes)[c * k + j]) *
                                 li_bf16_to_fp32(qa[j]);
                        n_rounded += (double)y0[c] / ((double)sa[0] * t.scales[c]) != d &&
                                     y0[c] != (float)d * (sa[0] * t.scales[c]);
                    }
                for (int f = 0; f < nf; f++) {
                    fns[f](t.w.data, t.scales, k, 0, m, qa, sa, 0, n, y, m);
                    bad[f] += !same_bits(y, y0, n * m);
                    /* split: weight rows [0, c) and [c, m), activation rows [0, h) and [h, n) */
                    const int64_t c = m / 2, h = n / 3;
                    memset(y, 0xff, (size_t)(n * m) * 4);
                    fns[f](t.w.data, t.scales, k, 0, c, qa, sa, 0, h, y, m);
                    fns[f](t.w.data, t.scales, k, c, m, qa, sa, 0, h, y, m);
                    fns[f](t.w.data, t.scales, k, 0, c, qa, sa, h, n, y, m);
                    fns[f](t.w.data, t.scales, k, c, m, qa, sa, h, n, y, m);
                    bad[f] += !same_bits(y, y0, n * m);
                }
                n_cases++;
            }
            free(x), free(sa), free(qa), free(y0), free(y);
            tw_free(&t);
        }
    if (nf == 0) printf("skip: fp8 gemm direct (only the scalar kernel on this CPU)\n");
    if (n_isas >= 3)
        printf("note: avx512 fp8 gemm is %s\n", li_w8_have_bf16() ? "VDPBF16PS (AVX512_BF16)" : "the AVX2 FMA form (no AVX512_BF16)");
    report(n_rounded > 20, "fp8 gemm direct: the data make the f32 order matter (%lld dots differ from exact)",
           (long long)n_rounded);
    for (int f = 0; f < nf; f++)
        report(bad[f] == 0, "fp8 gemm %s == scalar bit for bit, whole and split tiles (%lld cases, %lld differ)",
               names[f], (long long)n_cases, (long long)bad[f]);
}

/* through the backend on 1 and 2 threads: the same bits (any split) */
static void check_fp8_threads(void) {
    int bad = 0;
    for (int ii = 0; ii < n_isas; ii++) {
        tw t;
        const int64_t k = 577, m = 67, n = 70;
        tw_make(&t, LI_SCHEME_FP8, m, k);
        float *x = li_xmalloc((size_t)(n * k) * 4), *y[2];
        fill_x(x, n, k);
        for (int th = 0; th < 2; th++) {
            y[th] = li_xmalloc((size_t)(n * m) * 4);
            li_backend be;
            li_error err = {0};
            if (li_backend_cpu_init(&be, th + 1, isas[ii], &err)) {
                printf("FAIL cpu init %s: %s\n", isas[ii], err.msg);
                bad++;
                memset(y[th], 0, (size_t)(n * m) * 4);
                continue;
            }
            be.ops->weight_prepare(&be, &t.w);
            be.ops->matmul(&be, &t.w, x, y[th], n);
            be.ops->weight_release(&be, &t.w);
            li_backend_cpu_free(&be);
        }
        bad += !same_bits(y[0], y[1], n * m);
        free(x), free(y[0]), free(y[1]);
        tw_free(&t);
    }
    report(bad == 0, "fp8: 1 thread == 2 threads, every ISA (%d differ)", bad);
}

/* matmul_multi (q/k/v, gate/up: one activation quantization) gives each
 * weight's own matmul bits, on every ISA */
static void check_multi(li_scheme scheme) {
    int bad = 0;
    for (int ii = 0; ii < n_isas; ii++) {
        tw t[3];
        const int64_t k = 97, n = 5, ms[3] = {7, 33, 2};
        for (int i = 0; i < 3; i++) tw_make(&t[i], scheme, ms[i], k);
        float x[5 * 97], *y[3], *y1[3];
        fill_x(x, n, k);
        li_backend be;
        li_error err = {0};
        if (li_backend_cpu_init(&be, 2, isas[ii], &err)) continue;
        for (int i = 0; i < 3; i++) {
            be.ops->weight_prepare(&be, &t[i].w);
            y[i] = li_xmalloc((size_t)(n * ms[i]) * 4);
            y1[i] = li_xmalloc((size_t)(n * ms[i]) * 4);
            be.ops->matmul(&be, &t[i].w, x, y1[i], n);
        }
        be.ops->matmul_multi(&be, (const li_weight *const[]){&t[0].w, &t[1].w, &t[2].w}, 3, x, y, n);
        for (int i = 0; i < 3; i++) {
            bad += !same_bits(y[i], y1[i], n * ms[i]);
            be.ops->weight_release(&be, &t[i].w);
            free(y[i]), free(y1[i]);
            tw_free(&t[i]);
        }
        li_backend_cpu_free(&be);
    }
    report(bad == 0, "%s: matmul_multi == each weight's matmul, every ISA (%d differ)", li_scheme_name(scheme), bad);
}

static void check_refused(void) {
    /* per-group scales: no kernel here; the SIMD ISAs refuse, scalar keeps the reference */
    tw t;
    tw_make(&t, LI_SCHEME_W8A8, 4, 64);
    t.w.group_size = 32;
    float *sc = li_xmalloc(8 * sizeof(float));
    for (int i = 0; i < 8; i++) sc[i] = 0.01f;
    t.w.scales = sc;
    float x[64] = {1}, y[4];
    const int rc = n_isas > 1 ? run_backend(isas[1], &t, x, y, NULL, 1) : LI_EUNSUP;
    report(rc == LI_EUNSUP, "w8a8 per-group weights: refused by weight_prepare on a SIMD ISA (rc %d)", rc);
    free(sc);
    tw_free(&t);
}

int main(void) {
    isas_find();
    check_widen();
    check_act_quant();
    check_scheme(LI_SCHEME_W8A8);
    check_scheme(LI_SCHEME_FP8);
    check_multi(LI_SCHEME_W8A8);
    check_multi(LI_SCHEME_FP8);
    check_encoder();
    check_fp8_gemm_direct();
    check_fp8_threads();
    check_refused();
    return t_summary("w8");
}
