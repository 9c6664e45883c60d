/* simd_avx2.h — small AVX2/FMA helpers shared by the AVX2 (and AVX-512)
 * kernel files. Include only from files compiled with -mavx2 -mfma. */
#ifndef LI_SIMD_AVX2_H
#define LI_SIMD_AVX2_H

#include <immintrin.h>

/* A vector's eight lanes folded by op (add, max, min): the halves, the
 * pairs, the last two */
#define LI_HREDUCE256(name, op)                                                                      \
    static inline float name(__m256 v) {                                                             \
        __m128 s = _mm_##op##_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));            \
        s = _mm_##op##_ps(s, _mm_movehl_ps(s, s));                                                   \
        s = _mm_##op##_ss(s, _mm_movehdup_ps(s));                                                    \
        return _mm_cvtss_f32(s);                                                                     \
    }
LI_HREDUCE256(hsum256, add)
LI_HREDUCE256(hmax256, max)
LI_HREDUCE256(hmin256, min)
#undef LI_HREDUCE256

/* roundf() semantics (halves away from zero), as the ggml reference: the
 * value truncated, plus one away from zero where the part cut off is a
 * half or more (y - trunc(y) is exact, so 0.49999997 stays below a half,
 * which floor(|y| + 0.5) would round up) */
static inline __m256 round_away256(__m256 y) {
    const __m256 t = _mm256_round_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 absfrac = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_sub_ps(y, t));
    const __m256 up = _mm256_cmp_ps(absfrac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 one = _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(y, _mm256_set1_ps(-0.0f)));
    return _mm256_add_ps(t, _mm256_and_ps(up, one));
}

/* exp(x), Cephes-style: 2^n * p(r), |r| <= ln2/2, about 1 ulp; inputs
 * clamped to [-87.3, 88] so 2^n stays a normal (built in the exponent field) */
static inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x); /* ln2 in two parts */
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

#endif
