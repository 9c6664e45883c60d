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
    /* four chains: one max a step waits out vmaxps's latency (a max is exact in any order) */
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t j = 0;
    for (; j + 32 <= k; j += 32) { /* NaN: the accumulator */
        a0 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), absmask), a0);
        a1 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + j + 8), absmask), a1);
        a2 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + j + 16), absmask), a2);
        a3 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + j + 24), absmask), a3);
    }
    __m256 acc = _mm256_max_ps(_mm256_max_ps(a0, a1), _mm256_max_ps(a2, a3));
    for (; j + 8 <= k; j += 8) acc = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), absmask), acc);
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
 * fp8 activation encoder: li_fp32_to_fp8_e4m3 then the e4m3 value as bf16
 * bits, 8 lanes: RNE to 3 significand bits (normal), to a multiple of 2^-9
 * below 2^-6 (adding 2^14, whose ulp is 2^-9, rounds there), 448 from 448
 * up (and inf), 480 (the widened NaN code) for NaN; the sign kept
 * ---------------------------------------------------------------------- */

static inline __m256i fp8_encode8(__m256 v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i sign = _mm256_and_si256(bits, _mm256_set1_epi32((int)0x80000000u));
    const __m256i ai = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
    const __m256 a = _mm256_castsi256_ps(ai);
    __m256i u = _mm256_add_epi32(ai, _mm256_set1_epi32(0x7ffff));
    u = _mm256_add_epi32(u, _mm256_and_si256(_mm256_srli_epi32(ai, 20), _mm256_set1_epi32(1)));
    __m256 r = _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32((int)0xfff00000u)));
    const __m256 big = _mm256_set1_ps(0x1p14f);
    const __m256 sub = _mm256_sub_ps(_mm256_add_ps(a, big), big);
    r = _mm256_blendv_ps(r, sub, _mm256_cmp_ps(a, _mm256_set1_ps(0x1p-6f), _CMP_LT_OQ));
    r = _mm256_blendv_ps(r, _mm256_set1_ps(448.0f), _mm256_cmp_ps(a, _mm256_set1_ps(448.0f), _CMP_GE_OQ));
    r = _mm256_blendv_ps(r, _mm256_set1_ps(480.0f), _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    return _mm256_srli_epi32(_mm256_or_si256(_mm256_castps_si256(r), sign), 16);
}

void li_w8_fp8_encode_avx2(const float *v, int64_t n, uint16_t *out) {
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        const __m256i lo = fp8_encode8(_mm256_loadu_ps(v + j)), hi = fp8_encode8(_mm256_loadu_ps(v + j + 8));
        const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
        _mm256_storeu_si256((__m256i *)(out + j), p);
    }
    for (; j < n; j++) {
        const float f = li_w8_fp8_widen(li_fp32_to_fp8_e4m3(v[j]));
        uint32_t u;
        __builtin_memcpy(&u, &f, 4);
        out[j] = (uint16_t)(u >> 16);
    }
}

void li_w8_quantize_fp8_avx2(const float *x, int64_t k, uint16_t *qa, float *s) {
    const float amax = amax_avx2(x, k);
    const float sc = amax / 448.0f, inv = sc > 0.0f ? 1.0f / sc : 0.0f;
    const __m256 vinv = _mm256_set1_ps(inv);
    float t[64];
    for (int64_t j = 0; j < k; j += 64) { /* scale a block, then encode it */
        const int64_t nb = LI_MIN((int64_t)64, k - j);
        int64_t i = 0;
        for (; i + 8 <= nb; i += 8) _mm256_storeu_ps(t + i, _mm256_mul_ps(_mm256_loadu_ps(x + j + i), vinv));
        for (; i < nb; i++) t[i] = x[j + i] * inv;
        li_w8_fp8_encode_avx2(t, nb, qa + j);
    }
    for (int64_t j = k; j < LI_W8_FP8_LDA(k); j++) qa[j] = 0;
    *s = sc;
}

/* ------------------------------------------------------------------------
 * fp8 gemm in the order of w8_kernels.h with FMAs: the 16 lanes as two
 * registers (lanes 0-7, 8-15), e4m3 widened in registers (bits << 20,
 * times 2^120), odd then even element of each pair; 2 weight x 2
 * activation rows, the weights widened once into a buffer for tiles of
 * more than 2 rows
 * ---------------------------------------------------------------------- */

static inline __m256 widen_f32(__m256i c) {
    const __m256i mag = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x7f)), 20);
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24);
    const __m256 f = _mm256_mul_ps(_mm256_castsi256_ps(mag), _mm256_set1_ps(0x1p120f));
    return _mm256_or_ps(f, _mm256_castsi256_ps(sign));
}

/* bytes p[0..16): the even and odd elements of 8 pairs */
static inline void widen_pairs(const uint8_t *p, __m256 *even, __m256 *odd) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    *even = widen_f32(v);
    *odd = widen_f32(_mm256_srli_epi32(v, 8));
}

/* 16 bf16 at p as 8 pairs */
static inline void act_pairs(const uint16_t *p, __m256 *even, __m256 *odd) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)p);
    *even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    *odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}

/* lanes lo (0-7) and hi (8-15) folded 8, 4, 2, 1 as w8_kernels.h says */
static inline float fold16(__m256 lo, __m256 hi) {
    const __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

/* 2 activation rows (a1 may be a0 again) x 2 weight rows into acc. wf: the
 * 2 rows already widened (per 16 elements: 8 even, 8 odd, stride lda
 * floats), or NULL: widen w0 / w1 here. Inlined with a constant wf test. */
static inline __attribute__((always_inline)) void block_fp8_avx2(const uint8_t *w0, const uint8_t *w1, const float *wf,
                                                                 int64_t k, int64_t lda, const uint16_t *a0,
                                                                 const uint16_t *a1, __m256 acc[2][2][2]) {
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) ((__m256 *)acc)[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < k; b += 32) {
        uint8_t t0[32] = {0}, t1[32] = {0}; /* the last block zero-padded */
        const uint8_t *p0 = w0 + b, *p1 = w1 + b;
        if (!wf) {
            _mm_prefetch((const char *)p0 + 16 * k, _MM_HINT_T0); /* the rows 8 blocks on */
            _mm_prefetch((const char *)p1 + 16 * k, _MM_HINT_T0);
            if (b + 32 > k) {
                __builtin_memcpy(t0, p0, (size_t)(k - b));
                __builtin_memcpy(t1, p1, (size_t)(k - b));
                p0 = t0, p1 = t1;
            }
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) { /* unrolled: acc stays in registers */
            __m256 we0, wo0, we1, wo1, ae0, ao0, ae1, ao1;
            if (wf) {
                const float *f = wf + b + 16 * h;
                we0 = _mm256_load_ps(f), wo0 = _mm256_load_ps(f + 8);
                we1 = _mm256_load_ps(f + lda), wo1 = _mm256_load_ps(f + lda + 8);
            } else {
                widen_pairs(p0 + 16 * h, &we0, &wo0);
                widen_pairs(p1 + 16 * h, &we1, &wo1);
            }
            act_pairs(a0 + b + 16 * h, &ae0, &ao0);
            act_pairs(a1 + b + 16 * h, &ae1, &ao1);
            acc[0][0][h] = _mm256_fmadd_ps(we0, ae0, _mm256_fmadd_ps(wo0, ao0, acc[0][0][h]));
            acc[0][1][h] = _mm256_fmadd_ps(we1, ae0, _mm256_fmadd_ps(wo1, ao0, acc[0][1][h]));
            acc[1][0][h] = _mm256_fmadd_ps(we0, ae1, _mm256_fmadd_ps(wo0, ao1, acc[1][0][h]));
            acc[1][1][h] = _mm256_fmadd_ps(we1, ae1, _mm256_fmadd_ps(wo1, ao1, acc[1][1][h]));
        }
    }
}

void li_w8_gemm_fp8_avx2(const uint8_t *w, const float *ws, int64_t k, int64_t c0, int64_t c1, const uint16_t *a,
                          const float *as, int64_t r0, int64_t r1, float *y, int64_t ldy) {
    const int64_t lda = LI_W8_FP8_LDA(k);
    /* more than 2 activation rows: widen each 2 weight rows once */
    float *wf = r1 - r0 > 2 ? li_aligned_alloc((size_t)(2 * lda) * sizeof(float)) : NULL;
    for (int64_t c = c0; c < c1; c += 2) {
        const int nc = c + 2 <= c1 ? 2 : 1;
        const uint8_t *w0 = w + c * k, *w1 = nc == 2 ? w0 + k : w0;
        if (wf)
            for (int u = 0; u < 2; u++)
                for (int64_t b = 0; b < k; b += 32) {
                    uint8_t t[32] = {0};
                    const uint8_t *p = (u ? w1 : w0) + b;
                    if (b + 32 > k) __builtin_memcpy(t, p, (size_t)(k - b)), p = t;
                    for (int h = 0; h < 2; h++) {
                        __m256 e, o;
                        widen_pairs(p + 16 * h, &e, &o);
                        _mm256_store_ps(wf + u * lda + b + 16 * h, e);
                        _mm256_store_ps(wf + u * lda + b + 16 * h + 8, o);
                    }
                }
        for (int64_t r = r0; r < r1; r += 2) {
            const int nr = r + 2 <= r1 ? 2 : 1;
            const uint16_t *a0 = a + r * lda, *a1 = nr == 2 ? a0 + lda : a0;
            __m256 acc[2][2][2]; /* [act row][weight row][lanes 0-7, 8-15] */
            if (wf) block_fp8_avx2(w0, w1, wf, k, lda, a0, a1, acc);
            else block_fp8_avx2(w0, w1, NULL, k, lda, a0, a1, acc);
            for (int i = 0; i < nr; i++)
                for (int u = 0; u < nc; u++)
                    y[(r + i) * ldy + c + u] = fold16(acc[i][u][0], acc[i][u][1]) * (as[r + i] * ws[c + u]);
        }
    }
    li_aligned_free(wf);
}

const li_w8_kernels li_w8_kernels_avx2 = {
    .isa = "avx2",
    .quantize_int8 = li_w8_quantize_int8_avx2,
    .quantize_fp8 = li_w8_quantize_fp8_avx2,
    .gemm_int8 = gemm_int8_avx2,
    .gemm_fp8 = li_w8_gemm_fp8_avx2,
};
