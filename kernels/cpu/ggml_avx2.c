/* ggml_avx2.c — the "ggml" kernels with AVX2 + FMA.
 *
 * The quantized dots do the same operations in the same order as
 * li_ggml_dot_*_ref (ggml_ref.c): the 8 int32 lanes of a block (4 products
 * each) are exact whichever way they are formed, then one FMA per lane per
 * block and hsum_float_8's tree. Attention and SiLU are ggml_impl.h built
 * with FMA instructions. Tested bit-identical to the reference in
 * tests/unit/test_ggml_kernels.c. */
#include <immintrin.h>

#define LI_GGML_F16C 1 /* ggml_impl.h converts K/V rows with vcvtph2ps */
#include "util/common.h"
#include "cpu/ggml_kernels.h"
#include "cpu/ggml_impl.h"

#include <math.h>

static inline float hsum8(__m256 x) {
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

/* u8 x s8 products, 4 per int32 lane, as float. maddubs saturates its int16
 * pairs, which never happens here: nibbles (0..15) give |pair| <= 3840, and
 * |q8| (0..128) times an s8 gives pairs in [-32768, 32512]. */
static inline __m256 lanes_us8(__m256i u, __m256i s) {
    const __m256i pairs = _mm256_maddubs_epi16(u, s);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), pairs));
}

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

/* The quantizer of ggml_ref.c 8 lanes at a time, with the same results:
 * max(v, amax) is the reference's (v > amax ? v : amax), a NaN skipped;
 * round-to-nearest is nearbyintf in the default mode; the int32 sums are
 * exact in any order. */
static inline float quantize_block_avx2(const float *x, int8_t *q, int32_t *sum) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], m = _mm256_setzero_ps();
    for (int j = 0; j < 4; j++) {
        v[j] = _mm256_loadu_ps(x + 8 * j);
        m = _mm256_max_ps(_mm256_andnot_ps(sign, v[j]), m);
    }
    __m128 h = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float amax = _mm_cvtss_f32(h);
    const float d = amax / 127.f;
    const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
    __m256i acc = _mm256_setzero_si256(), i32[4];
    for (int j = 0; j < 4; j++) {
        const __m256 r = _mm256_round_ps(_mm256_mul_ps(v[j], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        i32[j] = _mm256_cvtps_epi32(r);
        acc = _mm256_add_epi32(acc, i32[j]);
    }
    /* pack with signed saturation to [-128, 127], the reference's clamp */
    const __m256i p16a = _mm256_packs_epi32(i32[0], i32[1]), p16b = _mm256_packs_epi32(i32[2], i32[3]);
    __m256i p8 = _mm256_packs_epi16(p16a, p16b);
    p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, p8);
    __m128i t = _mm_add_epi32(_mm256_extracti128_si256(acc, 1), _mm256_castsi256_si128(acc));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
    *sum = _mm_cvtsi128_si32(t);
    return d;
}

void li_ggml_quantize_q8_0_avx2(const float *x, void *vy, int64_t k) { g_quantize_q8_0(x, vy, k, quantize_block_avx2); }
void li_ggml_quantize_q8_1_avx2(const float *x, void *vy, int64_t k) { g_quantize_q8_1(x, vy, k, quantize_block_avx2); }

/* Weight rows of a matmul are read in order, row after row: prefetching
 * this far ahead keeps the stream going across 4 KiB pages, where the
 * hardware prefetcher stops (135M model, 2 threads: decode 75 -> 118
 * tokens/s; 2-16 KiB ahead measured, 8-16 KiB best). */
#ifndef DOT_PREFETCH
#define DOT_PREFETCH 8192
#endif

/* One weight row against NR activation rows (a_stride bytes apart): the
 * weight block is unpacked once; each output still sees exactly the
 * single-row dot's operations. NR is a constant in each instance, and the
 * row loops are unrolled so the accumulators stay in registers (rolled,
 * GCC kept them on the stack: a store-to-load chain per block). */
static inline __attribute__((always_inline)) void dot_q4_1(int64_t k, const li_block_q4_1 *w, const char *va, size_t a_stride, int NR, float *out) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    float summs[4] = {0};
    const __m256i low = _mm256_set1_epi8(0xF);
    for (int64_t b = 0; b < k / 32; b++) {
        _mm_prefetch((const char *)(w + b) + DOT_PREFETCH, _MM_HINT_T0);
        const float d0 = h2f(w[b].d), m0 = h2f(w[b].m);
        const __m128i raw = _mm_loadu_si128((const __m128i *)w[b].qs);
        const __m256i qx = _mm256_and_si256(low, _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw));
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const li_ggml_q8_1f *a = (const li_ggml_q8_1f *)(va + (size_t)r * a_stride) + b;
            summs[r] = fmaf(m0, a->s, summs[r]);
            const __m256 dd = _mm256_set1_ps(d0 * a->d);
            acc[r] = _mm256_fmadd_ps(dd, lanes_us8(qx, _mm256_loadu_si256((const __m256i *)a->qs)), acc[r]);
        }
    }
    for (int r = 0; r < NR; r++) out[r] = hsum8(acc[r]) + summs[r];
}

static inline __attribute__((always_inline)) void dot_q8_0(int64_t k, const li_block_q8_0 *w, const char *va, size_t a_stride, int NR, float *out) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < k / 32; b++) {
        _mm_prefetch((const char *)(w + b) + DOT_PREFETCH, _MM_HINT_T0);
        const float d0 = h2f(w[b].d);
        const __m256i x = _mm256_loadu_si256((const __m256i *)w[b].qs);
        const __m256i ax = _mm256_sign_epi8(x, x);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const li_block_q8_0 *a = (const li_block_q8_0 *)(va + (size_t)r * a_stride) + b;
            const __m256 dd = _mm256_set1_ps(d0 * h2f(a->d));
            const __m256i y = _mm256_loadu_si256((const __m256i *)a->qs);
            acc[r] = _mm256_fmadd_ps(dd, lanes_us8(ax, _mm256_sign_epi8(y, x)), acc[r]);
        }
    }
    for (int r = 0; r < NR; r++) out[r] = hsum8(acc[r]);
}

void li_ggml_dot4_q4_1_q8_1_avx2(int64_t k, const void *w, const void *a, size_t a_stride, int nr, float *out) {
    switch (nr) {
    case 1: dot_q4_1(k, w, a, a_stride, 1, out); break;
    case 2: dot_q4_1(k, w, a, a_stride, 2, out); break;
    case 3: dot_q4_1(k, w, a, a_stride, 3, out); break;
    default: dot_q4_1(k, w, a, a_stride, 4, out); break;
    }
}

void li_ggml_dot4_q8_0_q8_0_avx2(int64_t k, const void *w, const void *a, size_t a_stride, int nr, float *out) {
    switch (nr) {
    case 1: dot_q8_0(k, w, a, a_stride, 1, out); break;
    case 2: dot_q8_0(k, w, a, a_stride, 2, out); break;
    case 3: dot_q8_0(k, w, a, a_stride, 3, out); break;
    default: dot_q8_0(k, w, a, a_stride, 4, out); break;
    }
}

void li_ggml_attn_heads_avx2(const li_attn_args *a, int64_t i, int h0, int nh, int gemm, float *scratch) {
    g_attn_heads(a, i, h0, nh, gemm, scratch);
}

void li_ggml_silu_mul_avx2(float *g, const float *u, int64_t n) { g_silu_mul(g, u, n); }
