/* w8_avx2.c — the W8A8 / FP8 kernels with AVX2 + FMA (w8_kernels.h).
 * No VNNI here: int8 products go through the sign trick,
 * maddubs(|a|, sign(w, a)) (|a|, |w| <= 127, so the i16 pair sums never
 * saturate), then madd with ones into i32. */
#include "util/common.h"
#include "cpu/w8_kernels.h"

#include <immintrin.h>
#include <math.h>

/* ------------------------------------------------------------------------
 * activation quantization (int8): the scalar kernel's arithmetic, 8 lanes
 * ---------------------------------------------------------------------- */

static float amax_avx2(const float *x, int64_t k) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 acc = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= k; j += 8) acc = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), absmask), acc); /* NaN: acc */
    float t[8], amax = 0.0f;
    _mm256_storeu_ps(t, acc);
    for (int i = 0; i < 8; i++) amax = fmaxf(amax, t[i]);
    for (; j < k; j++) amax = fmaxf(amax, fabsf(x[j]));
    return amax;
}

void li_w8_quantize_int8_avx2(const float *x, int64_t k, int8_t *q, float *s) {
    const float amax = amax_avx2(x, k);
    const float sc = amax / 127.0f, inv = sc > 0.0f ? 1.0f / sc : 0.0f;
    const __m256 vinv = _mm256_set1_ps(inv), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    int64_t j = 0;
    for (; j + 32 <= k; j += 32) {
        __m256i v[4];
        for (int u = 0; u < 4; u++) {
            const __m256 y = _mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * u), vinv);
            const __m256 ord = _mm256_cmp_ps(y, y, _CMP_ORD_Q); /* NaN -> 0 */
            const __m256 c = _mm256_and_ps(_mm256_min_ps(_mm256_max_ps(y, lo), hi), ord);
            v[u] = _mm256_cvtps_epi32(_mm256_round_ps(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        }
        /* packs interleave 128-bit lanes; the permute puts bytes back in order */
        const __m256i p01 = _mm256_packs_epi32(v[0], v[1]), p23 = _mm256_packs_epi32(v[2], v[3]);
        const __m256i b = _mm256_packs_epi16(p01, p23);
        _mm256_storeu_si256((__m256i *)(q + j), _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
    for (; j < k; j++) q[j] = (int8_t)li_code_round(x[j] * inv, -127.0f, 127.0f);
    *s = sc;
}

/* ------------------------------------------------------------------------
 * int8 gemm: 4 weight rows x 2 activation rows per block
 * ---------------------------------------------------------------------- */

static inline __m256i dot32(__m256i acc, __m256i w, __m256i a, __m256i ones) {
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(w, a));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
}

static inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

static inline int32_t tail_dot(const int8_t *w, const int8_t *a, int64_t j, int64_t k) {
    int32_t s = 0;
    for (; j < k; j++) s += (int32_t)w[j] * a[j];
    return s;
}

static void gemm_int8_avx2(const int8_t *w, const float *ws, int64_t k, int64_t c0, int64_t c1, const int8_t *a,
                           const float *as, int64_t r0, int64_t r1, float *y, int64_t ldy) {
    const __m256i ones = _mm256_set1_epi16(1);
    const int64_t k32 = k & ~(int64_t)31;
    int64_t r = r0;
    for (; r + 2 <= r1; r += 2) {
        const int8_t *a0 = a + r * k, *a1 = a0 + k;
        int64_t c = c0;
        for (; c + 4 <= c1; c += 4) {
            const int8_t *w0 = w + c * k, *w1 = w0 + k, *w2 = w1 + k, *w3 = w2 + k;
            __m256i s00 = _mm256_setzero_si256(), s01 = s00, s02 = s00, s03 = s00;
            __m256i s10 = s00, s11 = s00, s12 = s00, s13 = s00;
            for (int64_t j = 0; j < k32; j += 32) {
                const __m256i va0 = _mm256_loadu_si256((const __m256i *)(a0 + j));
                const __m256i va1 = _mm256_loadu_si256((const __m256i *)(a1 + j));
                const __m256i vw0 = _mm256_loadu_si256((const __m256i *)(w0 + j));
                const __m256i vw1 = _mm256_loadu_si256((const __m256i *)(w1 + j));
                const __m256i vw2 = _mm256_loadu_si256((const __m256i *)(w2 + j));
                const __m256i vw3 = _mm256_loadu_si256((const __m256i *)(w3 + j));
                s00 = dot32(s00, vw0, va0, ones);
                s01 = dot32(s01, vw1, va0, ones);
                s02 = dot32(s02, vw2, va0, ones);
                s03 = dot32(s03, vw3, va0, ones);
                s10 = dot32(s10, vw0, va1, ones);
                s11 = dot32(s11, vw1, va1, ones);
                s12 = dot32(s12, vw2, va1, ones);
                s13 = dot32(s13, vw3, va1, ones);
            }
            const __m256i acc[2][4] = {{s00, s01, s02, s03}, {s10, s11, s12, s13}};
            for (int i = 0; i < 2; i++)
                for (int u = 0; u < 4; u++) {
                    const int8_t *ar = i ? a1 : a0, *wr = w + (c + u) * k;
                    const int32_t sum = hsum_i32(acc[i][u]) + tail_dot(wr, ar, k32, k);
                    y[(r + i) * ldy + c + u] = (float)sum * (as[r + i] * ws[c + u]);
                }
        }
        for (; c < c1; c++)
            for (int i = 0; i < 2; i++) {
                const int8_t *ar = i ? a1 : a0, *wr = w + c * k;
                __m256i s = _mm256_setzero_si256();
                for (int64_t j = 0; j < k32; j += 32)
                    s = dot32(s, _mm256_loadu_si256((const __m256i *)(wr + j)),
                              _mm256_loadu_si256((const __m256i *)(ar + j)), ones);
                y[(r + i) * ldy + c] = (float)(hsum_i32(s) + tail_dot(wr, ar, k32, k)) * (as[r + i] * ws[c]);
            }
    }
    for (; r < r1; r++) { /* one activation row (decode): 4 weight rows at a time */
        const int8_t *ar = a + r * k;
        int64_t c = c0;
        for (; c + 4 <= c1; c += 4) {
            const int8_t *w0 = w + c * k, *w1 = w0 + k, *w2 = w1 + k, *w3 = w2 + k;
            __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
            for (int64_t j = 0; j < k32; j += 32) {
                const __m256i va = _mm256_loadu_si256((const __m256i *)(ar + j));
                s0 = dot32(s0, _mm256_loadu_si256((const __m256i *)(w0 + j)), va, ones);
                s1 = dot32(s1, _mm256_loadu_si256((const __m256i *)(w1 + j)), va, ones);
                s2 = dot32(s2, _mm256_loadu_si256((const __m256i *)(w2 + j)), va, ones);
                s3 = dot32(s3, _mm256_loadu_si256((const __m256i *)(w3 + j)), va, ones);
            }
            const __m256i acc[4] = {s0, s1, s2, s3};
            for (int u = 0; u < 4; u++)
                y[r * ldy + c + u] = (float)(hsum_i32(acc[u]) + tail_dot(w + (c + u) * k, ar, k32, k)) *
                                     (as[r] * ws[c + u]);
        }
        for (; c < c1; c++) {
            const int8_t *wr = w + c * k;
            __m256i s = _mm256_setzero_si256();
            for (int64_t j = 0; j < k32; j += 32)
                s = dot32(s, _mm256_loadu_si256((const __m256i *)(wr + j)),
                          _mm256_loadu_si256((const __m256i *)(ar + j)), ones);
            y[r * ldy + c] = (float)(hsum_i32(s) + tail_dot(wr, ar, k32, k)) * (as[r] * ws[c]);
        }
    }
}

/* ------------------------------------------------------------------------
 * fp8 gemm: e4m3 weights widened in registers (bits << 20, times 2^120),
 * exact f32 products, exact f64 sums; 2 weight rows x 2 activation rows
 * ---------------------------------------------------------------------- */

static inline __m256 widen8(const uint8_t *p) {
    const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    const __m256i mag = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x7f)), 20);
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24);
    const __m256 f = _mm256_mul_ps(_mm256_castsi256_ps(mag), _mm256_set1_ps(0x1p120f));
    return _mm256_or_ps(f, _mm256_castsi256_ps(sign));
}

static inline __m256d acc_pd(__m256d acc, __m256 prod) {
    acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_castps256_ps128(prod)));
    return _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_extractf128_ps(prod, 1)));
}

static inline double hsum_pd(__m256d v) {
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

static inline double tail_fp8(const uint8_t *w, const float *a, int64_t j, int64_t k) {
    double s = 0.0;
    for (; j < k; j++) s += (double)(li_w8_fp8_widen(w[j]) * a[j]);
    return s;
}

void li_w8_gemm_fp8_avx2(const uint8_t *w, const float *ws, int64_t k, int64_t c0, int64_t c1, const float *a,
                          const float *as, int64_t r0, int64_t r1, float *y, int64_t ldy) {
    const int64_t k8 = k & ~(int64_t)7;
    for (int64_t r = r0; r < r1; r += 2) {
        const int nr = r + 2 <= r1 ? 2 : 1;
        const float *a0 = a + r * k, *a1 = nr == 2 ? a0 + k : a0;
        for (int64_t c = c0; c < c1; c += 2) {
            const int nc = c + 2 <= c1 ? 2 : 1;
            const uint8_t *w0 = w + c * k, *w1 = nc == 2 ? w0 + k : w0;
            __m256d s00 = _mm256_setzero_pd(), s01 = s00, s10 = s00, s11 = s00;
            for (int64_t j = 0; j < k8; j += 8) {
                const __m256 vw0 = widen8(w0 + j), vw1 = widen8(w1 + j);
                const __m256 va0 = _mm256_loadu_ps(a0 + j), va1 = _mm256_loadu_ps(a1 + j);
                s00 = acc_pd(s00, _mm256_mul_ps(vw0, va0));
                s01 = acc_pd(s01, _mm256_mul_ps(vw1, va0));
                s10 = acc_pd(s10, _mm256_mul_ps(vw0, va1));
                s11 = acc_pd(s11, _mm256_mul_ps(vw1, va1));
            }
            const __m256d acc[2][2] = {{s00, s01}, {s10, s11}};
            for (int i = 0; i < nr; i++)
                for (int u = 0; u < nc; u++) {
                    const double sum = hsum_pd(acc[i][u]) + tail_fp8(u ? w1 : w0, i ? a1 : a0, k8, k);
                    y[(r + i) * ldy + c + u] = (float)sum * (as[r + i] * ws[c + u]);
                }
        }
    }
}

const li_w8_kernels li_w8_kernels_avx2 = {
    .isa = "avx2",
    .quantize_int8 = li_w8_quantize_int8_avx2,
    .quantize_fp8 = NULL, /* the scalar encoder (li_w8_matmul): e4m3 rounding has no short SIMD form */
    .gemm_int8 = gemm_int8_avx2,
    .gemm_fp8 = li_w8_gemm_fp8_avx2,
};
